-- kb.audit_verify(): check the audit hash chains the caller can see.
--
-- SECURITY INVOKER, so RLS decides what is checked: a role that bypasses RLS (a
-- superuser; the owner only if it is exempt from the forced RLS) checks every tenant's
-- chain, the owner with auth.tenant_id set checks that tenant's. Not executable by the app
-- role (since 0010: it would need kb.audit_row_hash); `kb-rerank audit verify` runs it and
-- also checks every row's MAC with the audit key, which the database does not hold. One row per tenant, ordered by tenant_id; a tenant
-- set on the transaction with no audit rows yet gets a row with rows_checked = 0.
-- first_broken_seq, first_broken_audit_id and reason are NULL when the chain verifies;
-- otherwise they name the first broken row (in seq order), reason one of
--   'seq gap'            seq is not 1 for the first row, or not previous seq + 1
--   'prev_hash mismatch' prev_hash is not the previous row's row_hash (64 zeros for the first)
--   'row_hash mismatch'  row_hash is not kb.audit_row_hash(row) (the row was altered)
-- Retention (0015): when a tenant's oldest months were archived, its first remaining row
-- (seq > 1) continues from the checkpoint kb.audit_checkpoints holds for seq - 1: that
-- checkpoint's row_hash stands for the previous row. Without one the row is a 'seq gap'.
-- The checkpoint's MAC (the audit key's) is checked by `kb-rerank audit verify`, not here.
-- Limits: deleting the newest rows of a chain leaves a valid shorter chain; compare
-- rows_checked or the last row_hash with a copy kept elsewhere to detect that.


create or replace function kb.audit_verify()
returns table (
  tenant_id uuid,
  rows_checked bigint,
  first_broken_seq bigint,
  first_broken_audit_id bigint,
  reason text
)
language sql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
  with chain as (
    select a.tenant_id, a.seq, a.audit_id, a.prev_hash, a.row_hash,
           kb.audit_row_hash(a) as computed,
           lag(a.seq) over w as prev_seq,
           lag(a.row_hash) over w as prev_row_hash
    from kb.kb_rerank_audit a
    window w as (partition by a.tenant_id order by a.seq)
  ),
  checked as (
    select c.tenant_id, c.seq, c.audit_id,
           case
             when c.seq <> coalesce(c.prev_seq, cp.seq, 0) + 1 then 'seq gap'
             when c.prev_hash <> coalesce(c.prev_row_hash, cp.row_hash, repeat('0', 64)) then 'prev_hash mismatch'
             when c.row_hash <> c.computed then 'row_hash mismatch'
           end as reason
    from chain c
    -- a chain's first remaining row continues from its checkpoint, if any
    left join kb.audit_checkpoints cp
      on c.prev_seq is null and cp.tenant_id = c.tenant_id and cp.seq = c.seq - 1
  ),
  per_tenant as (
    select k.tenant_id, count(*) as rows_checked
    from checked k
    group by k.tenant_id
    union all
    select t.id, 0
    from (select kb.current_tenant() as id) t
    where t.id is not null
      and not exists (select 1 from checked k where k.tenant_id = t.id)
  ),
  first_broken as (
    select distinct on (k.tenant_id) k.tenant_id, k.seq, k.audit_id, k.reason
    from checked k
    where k.reason is not null
    order by k.tenant_id, k.seq, k.audit_id
  )
  select p.tenant_id, p.rows_checked, f.seq, f.audit_id, f.reason
  from per_tenant p
  left join first_broken f on f.tenant_id = p.tenant_id
  order by p.tenant_id
$$;
comment on function kb.audit_verify() is
  'Verify the audit hash chain of each visible tenant (RLS applies); NULL first_broken_* and reason when intact';

revoke all on function kb.audit_verify() from public, {{app_role}};

