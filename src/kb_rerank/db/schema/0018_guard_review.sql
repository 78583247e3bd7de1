-- 0018 guard review: the strength of a chunk's injection evidence, and a person's review of
-- flagged (or unflagged) chunks.
-- Versioned: runs once (Alembic revision 0018_guard_review). The policies and grants of
-- kb.guard_reviews live in the idempotent file guard/sql/guard_reviews_policies.sql; the triggers
-- that keep kb.chunks.injection_review equal to the review of the chunk's text in
-- guard/sql/chunks_take_review.sql and guard/sql/guard_reviews_apply.sql.

-- Set at ingestion and by `kb-rerank guard scan` (kb_rerank.ingest.verdict.strong_evidence):
-- strong evidence of injection, which the default policy `exclude` excludes; a flagged chunk
-- without it is doubtful and only demoted. Rows stored before this revision are doubtful
-- (false) until `kb-rerank guard scan` re-scores them: a chunk they flagged is demoted, kept,
-- instead of excluded, in the meantime.
--
-- injection_review: the decision of kb.guard_reviews for this chunk's text (tenant_id,
-- content_hash), materialised on the chunk row so that the query path reads it with the
-- verdict, without a join: 'allow' (a false positive: kept at its rank), 'block' (treated as
-- strong evidence), or null (not reviewed).
alter table kb.chunks
  add column injection_strong boolean not null default false,
  add column injection_review text check (injection_review in ('allow', 'block'));

-- A person's review of a chunk's text, keyed by its content hash (kb.chunks.content_hash,
-- the SHA-256 of the text as hex): it applies to every chunk of the tenant with that text,
-- survives a re-scan and a re-ingest that keeps the text, and does not apply to a changed
-- text (a new hash). doc_id and chunk_id name the chunk the review was made on
-- (informational: a re-ingest gives the chunk a new id; no foreign key, so a review
-- outlives the document it was made on and applies again if the text comes back).
create table kb.guard_reviews (
  tenant_id    uuid not null,
  content_hash char(64) not null,
  decision     text not null check (decision in ('allow', 'block')),
  doc_id       uuid,
  chunk_id     uuid,
  note         text,
  reviewed_at  timestamptz not null default now(),
  reviewed_by  text not null default session_user,
  primary key (tenant_id, content_hash)
);
