-- 0008: kb.term_tops, per tenant and common term, the chunks where the term weighs most in
-- BM25 ("champion lists"), so that kb.search_lexical can answer a query made of common words
-- (or of rare words padded with common ones) without scoring every chunk of a common term.
--
-- Invariant, per row: every chunk of the tenant that contains `term` and is not in
-- `chunk_ids` has tf_part <= tail, where
--   tf_part = tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avglen))
-- with the row's k1, b and avglen (the tenant's average chunk length when the list was
-- built). kb.refresh_term_tops() builds the lists; the insert/update trigger
-- kb.chunks_maintain_term_tops appends any new or changed chunk above a list's tail, so the
-- invariant holds between refreshes (deleted chunks may stay listed: harmless, they match
-- nothing). When the average length later moves to A, tf_part at A <= tf_part at avglen *
-- max(1, A / avglen) (the length term's share of the denominator shrinks by at most
-- avglen / A), which is the bound the search uses. Derived data: readable by its tenant,
-- written only by functions owned by kb_search (policies: retrieval/sql/corpus_stats_policies.sql).
create table kb.term_tops (
  tenant_id uuid not null,
  term      text not null,
  chunk_ids uuid[] not null,
  tail      double precision not null check (tail >= 0),
  avglen    double precision not null check (avglen > 0),
  k1        double precision not null check (k1 >= 0),
  b         double precision not null check (b >= 0 and b <= 1),
  built_at  timestamptz not null default now(),
  primary key (tenant_id, term)
);
comment on table kb.term_tops is
  'BM25 champion lists: per tenant and common term, the chunks above tail (see sql/schema/0008_term_tops.sql)';
