-- Audit log writes: kb.audit_row_hash (the canonical form of a row, defined here and
-- nowhere else) and kb.audit_append (the only writer of kb.kb_rerank_audit).


-- Canonical form (fields joined by '|', created_at as UTC with microseconds):
--   prev_hash|seq|kind|severity|source|query_hash|trace_id|model|candidate_count|
--   returned_count|detail|YYYY-MM-DDTHH24:MI:SS.US[|mac|nonce|key_id]
-- with NULL model and detail as ''; the last three only on keyed rows (mac not NULL: every
-- row written since migration 0010), so the rows written before keep their hash.
-- row_hash = hex(sha256(UTF-8 of that text)). audit_id, duration_ms and row_hash itself are
-- not covered (duration_ms is covered by the MAC).
-- Declared IMMUTABLE although text casts and to_char are STABLE: the format uses no
-- locale- or setting-dependent field (UTC timestamp, integers, text).
-- The MAC: HMAC-SHA256 with the audit key (KB_AUDIT_KEY), which the database
-- never holds, over the caller-supplied fields, the tenant and a random nonce; canonical
-- form in kb_rerank/audit/store.py, checked by `kb-rerank audit verify`. The SQL chain proves
-- order and completeness; the MAC proves that the service wrote the row.
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
           || '|' || to_char(r.created_at at time zone 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
           || case when r.mac is null then ''
                   else '|' || r.mac || '|' || r.nonce || '|' || r.key_id end,
         'UTF8')), 'hex')
$$;
comment on function kb.audit_row_hash(kb.kb_rerank_audit) is
  'Canonical SHA-256 (hex) of an audit row, chained through prev_hash; used by kb.audit_append and kb.audit_verify';

-- kb.audit_append: append one entry to the caller's tenant's chain and return it.
--
-- Why SECURITY DEFINER (owner kb_audit: SELECT, INSERT on kb.kb_rerank_audit and SELECT,
-- INSERT, UPDATE on kb.audit_heads, nothing else; not BYPASSRLS, so the tables' policies
-- still bind it to kb.current_tenant()): the app role has no INSERT on the audit table and
-- cannot execute kb.audit_row_hash, so this function is the only way a row is written:
-- seq, prev_hash, row_hash and created_at (the database clock) are never caller-supplied,
-- so no back-dated or out-of-chain row. The caller supplies the MAC of the row (see
-- kb_rerank/audit/store.py), its nonce and the key's fingerprint; a replayed MAC (one already in
-- the tenant's log) is refused with unique_violation: looked up under the head lock, since
-- the log is partitioned by month (0015) and a unique index holds within a month only.
-- search_path pinned, pg_temp last.
--
-- Serialisation: the tenant's row in kb.audit_heads (last seq and
-- row_hash) is locked FOR UPDATE until the caller's transaction ends, so appends of one
-- tenant queue and different tenants do not block each other. The app role has no
-- privilege on kb.audit_heads, so it can neither take nor hold that lock (an advisory key,
-- used before, could be computed and held by any role). Raises when no tenant is set.
create or replace function kb.audit_append(
  kind text,
  severity smallint,
  source text,
  query_hash text,
  trace_id text,
  model text,
  candidate_count integer,
  returned_count integer,
  duration_ms real,
  detail text,
  mac text,
  nonce text,
  key_id text
)
returns kb.kb_rerank_audit
language plpgsql
volatile
security definer
set search_path = pg_catalog, kb, pg_temp
as $$
declare
  v_tenant pg_catalog.uuid := kb.current_tenant();
  v_head   record;
  r        kb.kb_rerank_audit;
begin
  if v_tenant is null then
    raise exception 'kb.audit_append: no tenant is set (auth.tenant_id)'
      using errcode = '42501', hint = 'call it inside a tenant transaction';
  end if;
  if audit_append.mac is null or audit_append.mac !~ '^[0-9a-f]{64}$'
     or audit_append.nonce is null or audit_append.nonce !~ '^[0-9a-f]{32}$'
     or audit_append.key_id is null or audit_append.key_id !~ '^[0-9a-f]{16}$' then
    raise exception 'kb.audit_append: mac (64 hex), nonce (32 hex) and key_id (16 hex) are required'
      using errcode = '22023';
  end if;

  select h.seq, h.row_hash into v_head
  from kb.audit_heads h where h.tenant_id = v_tenant
  for update;
  if not found then
    -- first append of the tenant (or a chain older than the head table): start the head
    -- from its last row; a concurrent first append waits here for the other to commit
    insert into kb.audit_heads as h (tenant_id, seq, row_hash)
    select v_tenant, coalesce(l.seq, 0), coalesce(l.row_hash, repeat('0', 64))
    from (select 1) as one
    left join lateral (select a.seq, a.row_hash from kb.kb_rerank_audit a
                       where a.tenant_id = v_tenant order by a.seq desc limit 1) as l on true
    on conflict (tenant_id) do nothing;
    select h.seq, h.row_hash into strict v_head
    from kb.audit_heads h where h.tenant_id = v_tenant
    for update;
  end if;

  if exists (select 1 from kb.kb_rerank_audit a where a.tenant_id = v_tenant and a.mac = audit_append.mac) then
    raise exception 'kb.audit_append: this MAC is already in the tenant''s audit log (a replayed row)'
      using errcode = '23505';
  end if;

  r.tenant_id       := v_tenant;
  r.seq             := v_head.seq + 1;
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
  r.prev_hash       := v_head.row_hash;
  r.mac             := audit_append.mac;
  r.nonce           := audit_append.nonce;
  r.key_id          := audit_append.key_id;
  r.row_hash        := kb.audit_row_hash(r);

  insert into kb.kb_rerank_audit as a
    (tenant_id, seq, kind, severity, source, query_hash, trace_id, model,
     candidate_count, returned_count, duration_ms, detail, created_at, prev_hash, row_hash,
     mac, nonce, key_id)
  values
    (r.tenant_id, r.seq, r.kind, r.severity, r.source, r.query_hash, r.trace_id, r.model,
     r.candidate_count, r.returned_count, r.duration_ms, r.detail, r.created_at, r.prev_hash, r.row_hash,
     r.mac, r.nonce, r.key_id)
  returning a.* into r;
  update kb.audit_heads h set seq = r.seq, row_hash = r.row_hash where h.tenant_id = v_tenant;
  return r;
end
$$;
alter function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  owner to kb_audit;
comment on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text) is
  'Append an entry (with the service''s MAC) to the caller''s tenant''s hash-chained audit log; raises when no tenant is set';

-- kb_audit (the definer) hashes rows; the app role does not (it writes no row itself).
revoke all on function kb.audit_row_hash(kb.kb_rerank_audit) from public, {{app_role}};
grant execute on function kb.audit_row_hash(kb.kb_rerank_audit) to kb_audit;
revoke all on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  from public;
grant execute on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  to {{app_role}};
