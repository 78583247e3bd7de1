-- 0002 rerank service: audit log (hash-chained per tenant), manual curation, cache
-- tracing columns, and the maintenance role that owns the cache eviction function.
-- Versioned: runs once (Alembic revision 0002_rerank_service). Functions, policies,
-- grants and views for these objects live in the idempotent files:
--   audit/sql/audit_append.sql, audit/sql/audit_verify.sql, cache/sql/evict_expired_cache.sql
--   audit/sql/audit_policies.sql, kb_rerank_curation.sql
--   cache/sql/cache_stats.sql

-- Roles are cluster-wide, so they are created only when missing.
do $$
begin
  -- Owner of kb.evict_expired_cache() only (see cache/sql/evict_expired_cache.sql). It
  -- cannot log in; it bypasses RLS because eviction is cross-tenant by nature.
  if not exists (select from pg_roles where rolname = 'kb_maint') then
    create role kb_maint nologin nosuperuser nocreatedb nocreaterole noinherit bypassrls;
  elsif not (select rolbypassrls from pg_roles where rolname = 'kb_maint') then
    alter role kb_maint bypassrls;
  end if;
end
$$;

-- Which request and which reranker model produced a cache entry (nullable: rows
-- written before 0002, and sources without a model, have none).
alter table kb.kb_rerank_cache
  add column trace_id text,
  add column model text;

-- Append-only audit log of rerank requests. One hash chain per tenant:
--   seq       1, 2, 3... per tenant, no gaps
--   prev_hash row_hash of the tenant's previous row (64 zeros for seq 1)
--   row_hash  kb.audit_row_hash(row), the canonical form defined in ONE place
--             (audit/sql/audit_append.sql)
-- Rows are written only through kb.audit_append() and checked by kb.audit_verify().
-- Never holds query text: query_hash is the hash, detail a short machine reason.
create table kb.kb_rerank_audit (
  audit_id        bigint generated always as identity primary key,
  tenant_id       uuid not null,
  seq             bigint not null check (seq >= 1),
  kind            text not null check (kind in ('served','cache_hit','fallback','rejected')),
  severity        smallint not null check (severity between 0 and 3),  -- 0 info, 1 notice, 2 degraded/fallback, 3 error
  source          text not null check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation')),
  query_hash      char(64) not null,
  trace_id        text not null,
  model           text,
  candidate_count integer not null default 0 check (candidate_count >= 0),
  returned_count  integer not null default 0 check (returned_count >= 0),
  duration_ms     real,
  detail          text,              -- short machine reason ('timeout'), never query text
  created_at      timestamptz not null default clock_timestamp(),
  prev_hash       char(64) not null,
  row_hash        char(64) not null,
  unique (tenant_id, seq)
);
create index rerank_audit_tenant_created_idx on kb.kb_rerank_audit (tenant_id, created_at);

-- A curated chunk must belong to the curating tenant: the foreign key is on
-- (tenant_id, chunk_id), as chunks -> documents is, so no tenant can pin (or learn
-- the existence of) another tenant's chunk, and no other tenant's delete cascades here.
alter table kb.chunks add constraint chunks_tenant_chunk_key unique (tenant_id, chunk_id);

-- Manual curation: the pinned result list of a query (source 'manual_curation').
create table kb.kb_rerank_curation (
  tenant_id  uuid not null,
  query_hash char(64) not null,
  position   integer not null check (position >= 0),
  chunk_id   uuid not null,
  note       text,
  created_at timestamptz default now(),
  primary key (tenant_id, query_hash, position),
  foreign key (tenant_id, chunk_id) references kb.chunks (tenant_id, chunk_id) on delete cascade
);
create index rerank_curation_chunk_idx on kb.kb_rerank_curation (tenant_id, chunk_id);
