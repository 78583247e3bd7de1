-- The BM25 term-frequency part of one term in one chunk: tf * (k1 + 1) / (tf + k1 * (1 - b +
-- b * doc_len / avglen)), 0 when tf = 0. kb.search_lexical scores with it (times qtf * idf),
-- and the term blocks (kb.term_blocks) are ordered and bounded by it, so both compute it
-- alike. Written as (k1 + 1) / (1 + K / tf), each argument used once: plain SQL without SET
-- clauses, not strict, so that the planner inlines it even when tf is an expression (an
-- argument used twice would be computed twice, or block inlining).
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
parallel safe
security invoker
as $$
  select coalesce((k1 + 1) / (1 + k1 * (1 - b + b * doc_len / avglen) / nullif(tf, 0)), 0)
$$;
