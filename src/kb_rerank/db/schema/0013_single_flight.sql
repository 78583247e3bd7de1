-- 0013: kb.kb_rerank_inflight, the misses being computed now, shared by every app process.
-- A process about to compute a miss claims its key here (one short
-- transaction: insert ... on conflict do nothing); a process that finds the key claimed waits
-- for the claimant's cache row instead of calling the model again, and computes itself only
-- when the claim is released without a cacheable answer or expires. Keyed like the cache row.
--
-- UNLOGGED: a claim is worth nothing after a crash (it expires anyway) and should not cost
-- WAL; the table lives on the primary only (standbys serve no claims). expires_at bounds a
-- claim whose process died: set by the claimant from its own model budget.
create unlogged table kb.kb_rerank_inflight (
  tenant_id   uuid not null,
  query_hash  char(64) not null,
  source      text not null,
  generation  bigint not null,
  claimant    uuid not null,
  claimed_at  timestamptz not null default now(),
  expires_at  timestamptz not null,
  primary key (tenant_id, query_hash, source, generation)
);
comment on table kb.kb_rerank_inflight is
  'Misses being computed now, one claim per cache key, shared by all app processes (sql/schema/0013_single_flight.sql)';
