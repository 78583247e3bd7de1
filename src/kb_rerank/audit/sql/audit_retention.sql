-- kb.audit_add_month(month): the partition of kb.kb_rerank_audit for that calendar month
-- (UTC), kb.kb_rerank_audit_YYYY_MM, created when missing; returns its name, NULL when it
-- existed. Rows of that month already in the default partition (written while no month
-- partition covered them) are moved into it, in the same transaction, so that the month
-- can be archived whole later. RLS enabled and forced on the new partition, no privilege
-- for anyone but the owner (as audit/sql/audit_policies.sql does for the others).
--
-- SECURITY INVOKER, executable by the owner only (`kb-rerank audit partitions`, from cron:
-- the next months ahead). It moves rows of every tenant: the owner must see them all (a
-- superuser or BYPASSRLS role, as for migrations: docs/operations.md).

create or replace function kb.audit_add_month(month date)
returns text
language plpgsql
volatile
security invoker
set search_path = pg_catalog, pg_temp
as $$
declare
  m      date := date_trunc('month', audit_add_month.month)::date;
  lo     timestamptz := m::timestamp at time zone 'UTC';
  hi     timestamptz := (m + interval '1 month')::timestamp at time zone 'UTC';
  name   text := 'kb_rerank_audit_' || to_char(m, 'YYYY_MM');
  moved  bigint;
begin
  if m is null then
    raise exception 'kb.audit_add_month: month is required' using errcode = '22023';
  end if;
  if to_regclass('kb.' || quote_ident(name)) is not null then
    return null;
  end if;
  -- the default partition may not hold rows of the new range while it is attached
  alter table kb.kb_rerank_audit detach partition kb.kb_rerank_audit_default;
  execute format('create table kb.%I partition of kb.kb_rerank_audit for values from (%L) to (%L)', name, lo, hi);
  execute format('alter table kb.%I enable row level security', name);
  execute format('alter table kb.%I force row level security', name);
  execute format('revoke all on kb.%I from public, {{app_role}}, kb_audit', name);
  with gone as (
    delete from kb.kb_rerank_audit_default d where d.created_at >= lo and d.created_at < hi returning d.*
  )
  insert into kb.kb_rerank_audit select * from gone;
  get diagnostics moved = row_count;
  alter table kb.kb_rerank_audit attach partition kb.kb_rerank_audit_default default;
  return name;
end
$$;
comment on function kb.audit_add_month(date) is
  'Create the audit log partition of a month (UTC), moving its rows out of the default partition; owner only';
revoke all on function kb.audit_add_month(date) from public, {{app_role}};
