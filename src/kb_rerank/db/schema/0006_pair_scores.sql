-- 0006 pair-score cache: the cross-encoder's score of one (query, chunk) pair, kept per
-- tenant for the cache TTL, so a query asked again with another source, or a candidate
-- seen again, is never scored twice. The key holds the model, the normalised query's hash
-- (never the query text), the chunk id and the sha256 of the chunk text that was scored
-- (kb.chunks.content_hash): a chunk whose content changed misses and is scored again.
-- Append-only for the app (SELECT, INSERT, DELETE; no UPDATE): an expired row is deleted,
-- then a new one inserted with ON CONFLICT DO NOTHING. Expired rows of all tenants are
-- evicted by kb.evict_expired_cache() (cache/sql/evict_expired_cache.sql). RLS, policies
-- and grants: rerank/sql/pair_scores_policies.sql.
-- No foreign key to kb.chunks: /v2/rerank keys caller documents (no chunk) by the zero
-- uuid and the sha256 of the document text, and a deleted chunk's rows simply expire.
create table kb.kb_rerank_pair_scores (
  tenant_id    uuid not null,
  model        text not null,
  query_hash   char(64) not null,
  chunk_id     uuid not null,
  content_hash char(64) not null,
  score        real not null check (score >= 0 and score <= 1),
  expires_at   timestamptz not null,
  primary key (tenant_id, model, query_hash, chunk_id, content_hash)
);
create index rerank_pair_scores_expires_idx on kb.kb_rerank_pair_scores (expires_at);
