-- 0003 context guardrails: prompt-injection / keyword-stuffing flags on chunks and the
-- per-tenant policy that decides what a query does with flagged chunks.
-- Versioned: runs once (Alembic revision 0003_context_guardrails). Policies and grants
-- for kb.tenant_policy live in the idempotent file guard/sql/tenant_policy_policies.sql.

-- Set at ingestion, per chunk (kb_rerank.ingest.verdict; detectors in kb_rerank.ingest.detectors).
-- Rows ingested before this revision keep the defaults (not flagged) until the
-- document is re-ingested.
alter table kb.chunks
  add column injection_flag    boolean not null default false,
  add column injection_score   real    not null default 0 check (injection_score >= 0 and injection_score <= 1),
  add column injection_reasons text[]  not null default '{}',
  add column spam_flag         boolean not null default false;

-- What queries do with chunks whose injection_flag is set:
--   exclude  drop them from results (reported in `filtered`)       (default)
--   demote   keep them, relevance multiplied by the demote factor  (reported in `filtered`)
--   allow    no change                                              (still reported as flagged)
-- A tenant without a row gets the defaults.
create table kb.tenant_policy (
  tenant_id        uuid primary key,
  injection_policy text not null default 'exclude' check (injection_policy in ('exclude', 'demote', 'allow')),
  updated_at       timestamptz not null default now()
);

-- POST /v2/rerank ranks caller-supplied documents (no search): its cache entries and
-- audit rows carry the source 'caller_documents'.
alter table kb.kb_rerank_cache drop constraint kb_rerank_cache_source_check;
alter table kb.kb_rerank_cache add constraint kb_rerank_cache_source_check
  check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation','caller_documents'));
alter table kb.kb_rerank_audit drop constraint kb_rerank_audit_source_check;
alter table kb.kb_rerank_audit add constraint kb_rerank_audit_source_check
  check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation','caller_documents'));
