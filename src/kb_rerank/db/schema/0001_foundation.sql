-- 0001 foundation: extensions, roles, schema, tables, indexes.
-- Versioned: runs once (Alembic revision 0001_foundation). Functions, policies,
-- grants and views are idempotent files re-applied by every upgrade.
-- {{embedding_dim}} is replaced by the migration with the configured embedder's
-- dimension (an integer it has validated).

create extension if not exists vector;
create extension if not exists unaccent;
create extension if not exists btree_gin;

-- Roles are cluster-wide, so they are created only when missing.
do $$
begin
  -- The service's role: never owner, never superuser, never BYPASSRLS.
  if not exists (select from pg_roles where rolname = 'cyberos_app') then
    create role cyberos_app login nosuperuser nocreatedb nocreaterole noinherit nobypassrls;
  end if;
  -- Owner of the SECURITY DEFINER search functions only (see sql/functions/search_lexical.sql
  -- for why). It cannot log in; it bypasses RLS so that the GIN/HNSW indexes can be used,
  -- and every function it owns filters on kb.current_tenant() itself and fails closed.
  if not exists (select from pg_roles where rolname = 'kb_search') then
    create role kb_search nologin nosuperuser nocreatedb nocreaterole noinherit bypassrls;
  end if;
end
$$;

create schema kb;
comment on schema kb is 'kb-rerank: multi-tenant hybrid search (BM25 + pgvector + RRF) and rerank cache';

-- Language-neutral text search configuration: the `simple` parser and dictionary
-- (no stemming, no stop words: a help centre mixes English and Vietnamese, and BM25's
-- IDF weighs frequent words down) with accent folding, so `hoa don` matches `hóa đơn`.
create text search configuration kb.kb_text (copy = pg_catalog.simple);
alter text search configuration kb.kb_text
  alter mapping for asciiword, asciihword, hword_asciipart, word, hword, hword_part, numword, numhword, hword_numpart
  with public.unaccent, pg_catalog.simple;

-- The embedder that produced the stored vectors; the app refuses to start on a mismatch.
create table kb.embedding_config (
  singleton  boolean primary key default true check (singleton),
  dim        integer not null check (dim > 0),
  embedder   text,
  created_at timestamptz not null default now()
);
insert into kb.embedding_config (dim) values ({{embedding_dim}});

create table kb.documents (
  doc_id       uuid primary key default gen_random_uuid(),
  tenant_id    uuid not null,
  source_uri   text not null,
  title        text not null,
  language     text,
  authority    real not null default 1.0 check (authority >= 0),
  content_hash char(64) not null,
  updated_at   timestamptz not null default now(),
  created_at   timestamptz not null default now(),
  unique (tenant_id, source_uri),
  unique (tenant_id, doc_id)
);

create table kb.chunks (
  chunk_id     uuid primary key default gen_random_uuid(),
  tenant_id    uuid not null,
  doc_id       uuid not null,
  position     integer not null check (position >= 0),
  content      text not null check (content <> ''),
  content_hash char(64) not null,
  tsv          tsvector not null,          -- set by trigger kb.chunks_derive
  doc_len      integer not null,           -- token count for BM25, set by the same trigger
  embedding    vector({{embedding_dim}}) not null,
  created_at   timestamptz not null default now(),
  unique (doc_id, position),
  -- a chunk always belongs to a document of the same tenant
  foreign key (tenant_id, doc_id) references kb.documents (tenant_id, doc_id) on delete cascade
);
-- (tenant_id, tsv): btree_gin lets one GIN index serve both the tenant filter and @@.
create index chunks_tenant_tsv_idx on kb.chunks using gin (tenant_id, tsv);
create index chunks_embedding_hnsw_idx on kb.chunks using hnsw (embedding vector_cosine_ops);
create index chunks_tenant_idx on kb.chunks (tenant_id, doc_id);

-- BM25 corpus statistics, per tenant so that no tenant's statistics reflect another's
-- documents. Maintained by statement-level triggers on kb.chunks.
create table kb.term_stats (
  tenant_id uuid not null,
  term      text not null,
  df        integer not null,
  primary key (tenant_id, term)
);
create table kb.corpus_stats (
  tenant_id uuid primary key,
  n_chunks  bigint not null,
  total_len bigint not null
);

-- The spec's cache table (TASK-KB-006), in schema kb.
create table kb.kb_rerank_cache (
  cache_id      uuid primary key,
  tenant_id     uuid not null,
  query_hash    char(64) not null,
  source        text not null check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation')),
  results_jsonb jsonb not null,
  cached_at     timestamptz not null default now(),
  expires_at    timestamptz not null,
  unique (tenant_id, query_hash, source)
);
create index rerank_cache_expiry_idx on kb.kb_rerank_cache (expires_at);
