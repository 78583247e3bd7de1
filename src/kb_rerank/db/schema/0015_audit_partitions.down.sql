-- 0015 down: the audit log as one table again, as at 0014, and no checkpoints.
--
-- Every remaining row is copied back (in seq order per tenant). A chain whose oldest months
-- were archived (`kb-rerank audit archive`) then starts at a seq above 1 with no checkpoint
-- to start from: kb.audit_verify at 0014 reports it as a 'seq gap'. The checkpoints are
-- dropped with their table: keep a copy (`pg_dump -t kb.audit_checkpoints`) first.
--
-- The functions and the view typed on the table's row are dropped with the partitioned
-- table and put back below as they were at 0014 (frozen copies of sql/functions/
-- 20_audit_append.sql, 21_audit_verify.sql, the audit part of sql/views/cache_stats.sql and
-- of sql/policies/kb_rerank_audit.sql): a downgrade does not re-apply the idempotent layer.

drop view if exists kb.audit_summary;
drop view if exists kb.cache_hit_ratio;
drop function if exists kb.audit_verify();
drop function if exists kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text);
drop function if exists kb.audit_row_hash(kb.kb_rerank_audit);
drop function if exists kb.audit_add_month(date);
drop table kb.audit_checkpoints;

alter table kb.kb_rerank_audit rename to kb_rerank_audit_0015;
alter sequence kb.kb_rerank_audit_audit_id_seq rename to kb_rerank_audit_0015_audit_id_seq;
alter table kb.kb_rerank_audit_0015 no force row level security;
alter table kb.kb_rerank_audit_0015 rename constraint kb_rerank_audit_pkey to kb_rerank_audit_0015_pkey;
alter table kb.kb_rerank_audit_0015 rename constraint kb_rerank_audit_tenant_id_seq_key to kb_rerank_audit_0015_tenant_id_seq_key;
alter index kb.rerank_audit_tenant_created_idx rename to kb_rerank_audit_0015_tenant_created_idx;

create table kb.kb_rerank_audit (
  audit_id        bigint generated always as identity,
  tenant_id       uuid not null,
  seq             bigint not null constraint kb_rerank_audit_seq_check check (seq >= 1),
  kind            text not null constraint kb_rerank_audit_kind_check
                    check (kind in ('served','cache_hit','fallback','rejected')),
  severity        smallint not null constraint kb_rerank_audit_severity_check check (severity between 0 and 3),
  source          text not null constraint kb_rerank_audit_source_check
                    check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation','caller_documents')),
  query_hash      char(64) not null,
  trace_id        text not null,
  model           text,
  candidate_count integer not null default 0 constraint kb_rerank_audit_candidate_count_check check (candidate_count >= 0),
  returned_count  integer not null default 0 constraint kb_rerank_audit_returned_count_check check (returned_count >= 0),
  duration_ms     real,
  detail          text,
  created_at      timestamptz not null default clock_timestamp(),
  prev_hash       char(64) not null,
  row_hash        char(64) not null,
  mac             text constraint kb_rerank_audit_mac_check check (mac ~ '^[0-9a-f]{64}$'),
  nonce           text constraint kb_rerank_audit_nonce_check check (nonce ~ '^[0-9a-f]{32}$'),
  key_id          text constraint kb_rerank_audit_key_id_check check (key_id ~ '^[0-9a-f]{16}$'),
  constraint kb_rerank_audit_mac_all_or_none
    check ((mac is null) = (nonce is null) and (mac is null) = (key_id is null)),
  constraint kb_rerank_audit_pkey primary key (tenant_id, audit_id),
  constraint kb_rerank_audit_tenant_id_seq_key unique (tenant_id, seq)
);
create index rerank_audit_tenant_created_idx on kb.kb_rerank_audit (tenant_id, created_at);
create unique index kb_rerank_audit_tenant_mac_key on kb.kb_rerank_audit (tenant_id, mac);

insert into kb.kb_rerank_audit overriding system value
select * from kb.kb_rerank_audit_0015 order by tenant_id, seq;
drop table kb.kb_rerank_audit_0015;
do $$
declare
  n bigint;
begin
  select coalesce(max(audit_id), 0) + 1 into n from kb.kb_rerank_audit;
  execute format('alter table kb.kb_rerank_audit alter column audit_id restart with %s', n);
end
$$;

-- ===== frozen copy: sql/policies/kb_rerank_audit.sql (the audit log's part) at 0014
alter table kb.kb_rerank_audit enable row level security;
alter table kb.kb_rerank_audit force row level security;
create policy "Audit entries are visible to their tenant" on kb.kb_rerank_audit
  for select using (tenant_id = (select kb.current_tenant()));
create policy "Audit entries are appended by their tenant" on kb.kb_rerank_audit
  for insert with check (tenant_id = (select kb.current_tenant()));
revoke all on kb.kb_rerank_audit from cyberos_app;
grant select on kb.kb_rerank_audit to cyberos_app;
revoke all on kb.kb_rerank_audit from kb_audit;
grant select, insert on kb.kb_rerank_audit to kb_audit;

-- ===== frozen copy: sql/functions/20_audit_append.sql at 0014
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
-- form in kb_rerank/store/audit.py, checked by `kb-rerank audit verify`. The SQL chain proves
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
-- kb_rerank/store/audit.py), its nonce and the key's fingerprint; a replayed MAC is refused by
-- the unique index (tenant_id, mac). search_path pinned, pg_temp last.
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
revoke all on function kb.audit_row_hash(kb.kb_rerank_audit) from public, cyberos_app;
grant execute on function kb.audit_row_hash(kb.kb_rerank_audit) to kb_audit;
revoke all on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  from public;
grant execute on function kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text, text, text, text)
  to cyberos_app;

-- ===== frozen copy: sql/functions/21_audit_verify.sql at 0014
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
             when c.seq <> coalesce(c.prev_seq + 1, 1) then 'seq gap'
             when c.prev_hash <> coalesce(c.prev_row_hash, repeat('0', 64)) then 'prev_hash mismatch'
             when c.row_hash <> c.computed then 'row_hash mismatch'
           end as reason
    from chain c
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

revoke all on function kb.audit_verify() from public, cyberos_app;


-- ===== frozen copy: sql/views/cache_stats.sql (kb.audit_summary, kb.cache_hit_ratio) at 0014
create or replace view kb.audit_summary with (security_invoker = true) as
  select a.tenant_id, a.kind, a.severity, count(*) as entries, max(a.created_at) as last_created_at
  from kb.kb_rerank_audit a
  group by a.tenant_id, a.kind, a.severity;
comment on view kb.audit_summary is 'Audit entries per tenant, kind and severity (RLS applies)';

-- hits: kind 'cache_hit'; misses: kinds 'served' and 'fallback' ('rejected' is neither).
-- ratio = hits / (hits + misses), NULL when both are 0.
create or replace view kb.cache_hit_ratio with (security_invoker = true) as
  select s.tenant_id, s.hits, s.misses,
         s.hits::float8 / nullif(s.hits + s.misses, 0) as ratio
  from (
    select a.tenant_id,
           count(*) filter (where a.kind = 'cache_hit') as hits,
           count(*) filter (where a.kind in ('served', 'fallback')) as misses
    from kb.kb_rerank_audit a
    group by a.tenant_id
  ) s;
comment on view kb.cache_hit_ratio is 'Rerank cache hit ratio per tenant from the audit log (RLS applies)';

grant select on kb.cache_stats, kb.audit_summary, kb.cache_hit_ratio to cyberos_app;

