-- Audit log writes: kb.audit_row_hash (the canonical form of a row, defined here and
-- nowhere else) and kb.audit_append (the only writer of kb.kb_rerank_audit).


-- Canonical form (fields joined by '|', created_at as UTC with microseconds):
--   prev_hash|seq|kind|severity|source|query_hash|trace_id|model|candidate_count|
--   returned_count|detail|YYYY-MM-DDTHH24:MI:SS.US
-- with NULL model and detail as ''. row_hash = hex(sha256(UTF-8 of that text)).
-- audit_id, duration_ms and row_hash itself are not covered.
-- Declared IMMUTABLE although text casts and to_char are STABLE: the format uses no
-- locale- or setting-dependent field (UTC timestamp, integers, text).
create or replace function kb.audit_row_hash(r kb.kb_rerank_audit)
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog
as $$
  select encode(sha256(convert_to(
           r.prev_hash || '|' || r.seq || '|' || r.kind || '|' || r.severity || '|' || r.source
           || '|' || r.query_hash || '|' || r.trace_id || '|' || coalesce(r.model, '')
           || '|' || r.candidate_count || '|' || r.returned_count || '|' || coalesce(r.detail, '')
           || '|' || to_char(r.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
         'UTF8')), 'hex')
$$;
comment on function kb.audit_row_hash(kb.kb_rerank_audit) is
  'Canonical SHA-256 (hex) of an audit row, chained through prev_hash; used by kb.audit_append and kb.audit_verify';

-- kb.audit_append: append one entry to the caller's tenant's chain and return it.
-- SECURITY INVOKER: RLS checks the insert (tenant_id = kb.current_tenant()). Raises
-- when no tenant is set. A transaction-level advisory lock keyed on the tenant
-- serialises appends of one tenant (different tenants do not block each other); the
-- tenant's last row is read after the lock is taken, so under READ COMMITTED every
-- append sees its predecessor. (Under REPEATABLE READ / SERIALIZABLE, a snapshot taken
-- before the lock can miss a concurrent append: the insert then fails on
-- unique (tenant_id, seq) rather than forking the chain. Retry in a new transaction.)
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
set search_path = pg_catalog, kb
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
comment on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text) is
  'Append an entry to the caller''s tenant''s hash-chained audit log; raises when no tenant is set';

grant execute on function kb.audit_row_hash(kb.kb_rerank_audit),
                          kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text)
  to cyberos_app;

