-- Downgrade of 0010_trust_cache.sql. The role kb_generation is cluster-wide and may serve
-- other databases: it is left in place (as 0001 leaves its roles).
drop trigger if exists documents_bump_generation_insert on kb.documents;
drop trigger if exists documents_bump_generation_update on kb.documents;
drop trigger if exists documents_bump_generation_delete on kb.documents;
drop trigger if exists documents_bump_generation_truncate on kb.documents;
drop trigger if exists chunks_bump_generation_insert on kb.chunks;
drop trigger if exists chunks_bump_generation_update on kb.chunks;
drop trigger if exists chunks_bump_generation_delete on kb.chunks;
drop trigger if exists chunks_bump_generation_truncate on kb.chunks;
drop function if exists kb.bump_generation();
drop table if exists kb.kb_generation;

-- Rows of several generations may share a (tenant, query, source) key: keep none (a cache).
truncate kb.kb_rerank_cache, kb.kb_rerank_pair_scores;
alter table kb.kb_rerank_pair_scores drop constraint kb_rerank_pair_scores_pkey;
alter table kb.kb_rerank_pair_scores drop column generation;
alter table kb.kb_rerank_pair_scores add primary key (tenant_id, model, query_hash, chunk_id, content_hash);
alter table kb.kb_rerank_cache drop constraint kb_rerank_cache_tenant_id_query_hash_source_generation_key;
alter table kb.kb_rerank_cache drop column generation;
alter table kb.kb_rerank_cache add constraint kb_rerank_cache_tenant_id_query_hash_source_key
  unique (tenant_id, query_hash, source);
revoke all on schema kb from kb_generation;
