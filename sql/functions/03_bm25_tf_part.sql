-- The BM25 term-frequency part of one term in one chunk: tf * (k1 + 1) / (tf + k1 *
-- (1 - b + b * doc_len / avglen)). kb.search_lexical scores with it (times qtf * idf), and
-- the champion lists (kb.term_tops) are ordered and bounded by it, so both compute it alike.
-- Plain SQL without SET clauses, so that the planner inlines it.
create or replace function kb.bm25_tf_part(
  tf double precision,
  doc_len double precision,
  k1 double precision,
  b double precision,
  avglen double precision
)
returns double precision
language sql
immutable
strict
parallel safe
security invoker
as $$
  select tf * (k1 + 1) / (tf + k1 * (1 - b + b * doc_len / avglen))
$$;
