-- Downgrade of 0010_trust_privileges.sql: back to the 0009 audit log (unkeyed chain, the
-- invoker append under an advisory lock, INSERT for the app role) so that 0009's code works.
-- Idempotent files are not re-applied by a downgrade, so the 0009 versions of the audit
-- functions are restored here. Roles are cluster-wide and stay; the hardened search paths,
-- the revoked TEMP and the function owners (idempotent files) also stay: 0009's code does
-- not depend on them. The eviction grant to the app role is restored for 0009's app loop.

drop function if exists kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text);
drop table if exists kb.audit_heads;
drop index if exists kb.kb_rerank_audit_tenant_mac_key;
alter table kb.kb_rerank_audit
  drop constraint if exists kb_rerank_audit_mac_all_or_none,
  drop column if exists mac,
  drop column if exists nonce,
  drop column if exists key_id;

create or replace function kb.audit_row_hash(r kb.kb_rerank_audit)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$
  select encode(sha256(convert_to(
           r.prev_hash || '|' || r.seq || '|' || r.kind || '|' || r.severity || '|' || r.source
           || '|' || r.query_hash || '|' || r.trace_id || '|' || coalesce(r.model, '')
           || '|' || r.candidate_count || '|' || r.returned_count || '|' || coalesce(r.detail, '')
           || '|' || to_char(r.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
         'UTF8')), 'hex')
$$;

create or replace function kb.audit_append(
  kind text,
  severity smallint,
  source text,
  query_hash text,
  trace_id text,
  model text default null,
  candidate_count integer default 0,
  returned_count integer default 0,
  duration_ms real default null,
  detail text default null
)
returns kb.kb_rerank_audit
language plpgsql
volatile
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_tenant uuid := kb.current_tenant();
  v_last   record;
  r        kb.kb_rerank_audit;
begin
  if v_tenant is null then
    raise exception 'kb.audit_append: no tenant is set (auth.tenant_id)'
      using errcode = '42501', hint = 'call it inside a tenant transaction';
  end if;
  perform pg_advisory_xact_lock(hashtextextended('kb.kb_rerank_audit:' || v_tenant::text, 0));
  select a.seq, a.row_hash into v_last
  from kb.kb_rerank_audit a
  where a.tenant_id = v_tenant
  order by a.seq desc
  limit 1;
  r.tenant_id       := v_tenant;
  r.seq             := coalesce(v_last.seq, 0) + 1;
  r.kind            := audit_append.kind;
  r.severity        := audit_append.severity;
  r.source          := audit_append.source;
  r.query_hash      := audit_append.query_hash;
  r.trace_id        := audit_append.trace_id;
  r.model           := audit_append.model;
  r.candidate_count := coalesce(audit_append.candidate_count, 0);
  r.returned_count  := coalesce(audit_append.returned_count, 0);
  r.duration_ms     := audit_append.duration_ms;
  r.detail          := audit_append.detail;
  r.created_at      := clock_timestamp();
  r.prev_hash       := coalesce(v_last.row_hash, repeat('0', 64));
  r.row_hash        := kb.audit_row_hash(r);
  insert into kb.kb_rerank_audit as a
    (tenant_id, seq, kind, severity, source, query_hash, trace_id, model,
     candidate_count, returned_count, duration_ms, detail, created_at, prev_hash, row_hash)
  values
    (r.tenant_id, r.seq, r.kind, r.severity, r.source, r.query_hash, r.trace_id, r.model,
     r.candidate_count, r.returned_count, r.duration_ms, r.detail, r.created_at, r.prev_hash, r.row_hash)
  returning a.* into r;
  return r;
end
$$;

revoke all on kb.kb_rerank_audit from kb_audit;
revoke all on function kb.audit_row_hash(kb.kb_rerank_audit) from kb_audit;
grant select, insert on kb.kb_rerank_audit to cyberos_app;
grant execute on function kb.audit_row_hash(kb.kb_rerank_audit),
                          kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text),
                          kb.audit_verify(),
                          kb.evict_expired_cache(integer)
  to cyberos_app;
