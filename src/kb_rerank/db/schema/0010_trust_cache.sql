-- 0010 trust (cache): versioned, run once by Alembic revision 0010_trust.
--
-- Per-tenant generation of the knowledge base. Every statement that
-- changes a tenant's kb.documents or kb.chunks rows bumps that tenant's generation, in the
-- same transaction (triggers and their SECURITY DEFINER function:
-- cache/sql/kb_generation.sql; RLS and grants: cache/sql/kb_generation_policies.sql).
-- The generation is part of the key of every cached answer (kb.kb_rerank_cache) and of
-- every pair score of a knowledge-base chunk (kb.kb_rerank_pair_scores), and the service
-- reads it before it reads any candidate, so an answer computed before a delete or a
-- re-ingest is stored under the old generation and is never served at the new one.
-- A tenant without a row is at generation 0.

-- Roles are cluster-wide, so it is created only when missing. kb_generation owns the
-- trigger function and nothing else; it can only read and write kb.kb_generation (no
-- BYPASSRLS: a policy of that table lets it write there, and nowhere else).
do $$
begin
  if not exists (select from pg_roles where rolname = 'kb_generation') then
    create role kb_generation nologin nosuperuser nocreatedb nocreaterole noinherit nobypassrls;
  end if;
end
$$;

create table kb.kb_generation (
  tenant_id  uuid primary key,
  generation bigint not null check (generation >= 0)
);

-- Cached answers and pair scores written before this revision were keyed by a plain
-- SHA-256 of the query and by no generation: drop them (a cache; TRUNCATE is not subject
-- to RLS, so this empties every tenant's rows whoever the migrating owner is).
truncate kb.kb_rerank_cache, kb.kb_rerank_pair_scores;

alter table kb.kb_rerank_cache add column generation bigint not null default 0;
alter table kb.kb_rerank_cache drop constraint kb_rerank_cache_tenant_id_query_hash_source_key;
alter table kb.kb_rerank_cache add constraint kb_rerank_cache_tenant_id_query_hash_source_generation_key
  unique (tenant_id, query_hash, source, generation);

-- Pair scores of caller documents (/v2/rerank, chunk id = the zero uuid) do not depend on
-- the knowledge base: they are written with generation 0.
alter table kb.kb_rerank_pair_scores add column generation bigint not null default 0;
alter table kb.kb_rerank_pair_scores drop constraint kb_rerank_pair_scores_pkey;
alter table kb.kb_rerank_pair_scores add primary key (tenant_id, model, query_hash, generation, chunk_id, content_hash);
