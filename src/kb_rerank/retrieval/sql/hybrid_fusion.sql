-- kb.hybrid_fusion(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b, filter,
--                  language, lexical_chunks, lexical_docs, lexical_scores)
--
-- The one home of the hybrid fusion: kb.search_hybrid (with the texts, for SQL callers) and
-- kb.retrieve_hybrid (the service's read, with the pair scores) both rank with it. Ids, ranks
-- and scores only; the callers read the texts of the rows they return.
--
-- Fuses per DOCUMENT: a document's lexical rank and semantic rank meet in one
-- row, so a document found by both lists through different chunks counts once, with both
-- ranks (fusing on chunk ids counted it twice, each time with one rank).
--   lexical list  = kb.search_lexical_ids(query, k, k1, b, filter, language): the top-k documents by BM25
--                   (the best chunk per document; rank = document rank)
--   semantic list = the top-k documents by their best chunk's cosine similarity: the
--                   first-seen order of documents in kb.search_semantic_ids' chunk list, read
--                   2k chunks deep and deeper (x4, up to 1000) while that holds fewer than
--                   k documents and the tenant has more chunks, so the list is the exact
--                   prefix of the document ranking (ranks as a per-document dense search
--                   gives them) up to that cap.
-- Each row carries ONE chunk of the document for the reranker: the chunk of the list that
-- ranks the document higher (semantic on a tie); it is the evidence for its better rank.
-- lexical_score is the document's BM25 score, semantic_score its best chunk's similarity
-- (whichever chunk is carried), so the relevance gate still sees the best similarity.
--   fusion = 'rrf'        score = lexical_weight / (rrf_k + lexical_rank)
--                               + semantic_weight / (rrf_k + semantic_rank)   (missing rank: 0)
--   fusion = 'convex'     score = (lexical_weight * lexn + semantic_weight * semn)
--                                 / (lexical_weight + semantic_weight)
--                         lexn / semn = min-max normalised score within the list's top-k
--                         ((s - min) / (max - min); 1 when max = min; missing: 0)
--   fusion = 'interleave' round-robin: lexical[1], semantic[1], lexical[2], ...
--                         skipping documents already taken; score = 1 / position
-- k1, b: the BM25 parameters of the lexical list. filter: a search filter (kb.search_filter's
-- grammar, docs/filters.md), applied inside both lists (each is the top k within the
-- filter's documents) before the fusion; NULL or {}: none.
-- language: the query's language, for the lexical list (kb.search_lexical); NULL: the
-- tenant's languages decide (kb.query_languages).
-- lexical_chunks, lexical_docs, lexical_scores: the lexical list itself, already read (the
-- service reads it while the query is being embedded, in a transaction of its own): the
-- columns chunk_id, doc_id and score of kb.search_lexical_ids(query, k, k1, b, filter,
-- language)'s rows in its order (its rank is the position), at most k of them; then that
-- search is not run and language is not used. NULL (the default): the search is run here.
-- The ids are the caller's word: they are fused as given, and every text or score a caller
-- reads with them is read under its own tenant (kb.chunk_texts, RLS), so a forged list shows
-- nothing of another tenant.
-- Returns up to 2k rows (documents) ordered by score desc, chunk_id (the order callers keep).
--
-- SECURITY INVOKER: it sees exactly what the two list functions (definers that filter on
-- kb.current_tenant()) return for the caller's tenant. Stable: it writes nothing.
-- search_path pinned, pg_temp last.
-- Its parameters and returned columns are written out again in kb.search_hybrid and
-- kb.retrieve_hybrid: a signature is its callers' contract (named and positional calls, \df),
-- and SQL has no shared one.
-- The signature before the lexical list argument (one overload only: positional calls stay
-- unambiguous).
drop function if exists kb.hybrid_fusion(text, public.vector, integer, integer, text, double precision,
                                         double precision, double precision, double precision, jsonb, text);
create or replace function kb.hybrid_fusion(
  query text,
  query_embedding public.vector,
  k integer,
  rrf_k integer,
  fusion text,
  lexical_weight double precision,
  semantic_weight double precision,
  k1 double precision,
  b double precision,
  filter jsonb,
  language text,
  lexical_chunks uuid[] default null,
  lexical_docs uuid[] default null,
  lexical_scores double precision[] default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  lexical_rank integer,
  semantic_rank integer,
  lexical_score double precision,
  semantic_score double precision,
  score double precision
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
#variable_conflict use_column
declare
  depth integer;
  n_chunks integer;
  s_doc uuid[];
  s_chunk uuid[];
  s_score float8[];
begin
  if k is null or k < 1 or k > 1000 then
    raise exception 'k must be between 1 and 1000, got %', k using errcode = '22023';
  end if;
  if rrf_k is null or rrf_k < 0 then
    raise exception 'rrf_k must be >= 0, got %', rrf_k using errcode = '22023';
  end if;
  if fusion is null or fusion not in ('rrf', 'convex', 'interleave') then
    raise exception 'fusion must be ''rrf'', ''convex'' or ''interleave'', got %', fusion using errcode = '22023';
  end if;
  if fusion = 'convex' and (lexical_weight is null or semantic_weight is null or lexical_weight < 0
                            or semantic_weight < 0 or lexical_weight + semantic_weight <= 0) then
    raise exception 'convex fusion needs weights >= 0 with a positive sum, got % and %',
      lexical_weight, semantic_weight using errcode = '22023';
  end if;
  if lexical_chunks is not null and (lexical_docs is null or lexical_scores is null
                                     or cardinality(lexical_docs) <> cardinality(lexical_chunks)
                                     or cardinality(lexical_scores) <> cardinality(lexical_chunks)
                                     or cardinality(lexical_chunks) > k) then
    raise exception 'a given lexical list needs lexical_chunks, lexical_docs and lexical_scores of one length, at most k (%)',
      k using errcode = '22023';
  end if;

  -- semantic documents: best chunk per document in chunk-rank order, read deep enough for
  -- k documents (one kNN call in the usual case: 2k chunks rarely hold fewer than k documents)
  depth := least(2 * k, 1000);
  loop
    select count(*)::integer,
           array_agg(b.doc_id order by b.rank) filter (where b.is_first),
           array_agg(b.chunk_id order by b.rank) filter (where b.is_first),
           array_agg(b.score order by b.rank) filter (where b.is_first)
      into n_chunks, s_doc, s_chunk, s_score
    from (select s.*, row_number() over (partition by s.doc_id order by s.rank) = 1 as is_first
          from kb.search_semantic_ids(query_embedding, depth, filter) s) b;
    exit when coalesce(cardinality(s_doc), 0) >= k or n_chunks < depth or depth >= 1000;
    depth := least(depth * 4, 1000);
  end loop;

  return query
  with lex as (
    -- one of the two branches runs (the other's condition is false once, before any row)
    select l.chunk_id, l.doc_id, l.score, l.rank
    from kb.search_lexical_ids(query, k, k1, b, filter, language) l
    where lexical_chunks is null
    union all
    select g.chunk_id, g.doc_id, g.score, g.rank::integer
    from unnest(lexical_chunks, lexical_docs, lexical_scores) with ordinality as g(chunk_id, doc_id, score, rank)
    where lexical_chunks is not null
  ),
  sem as (
    select u.doc_id, u.chunk_id, u.score, u.rank::integer as rank
    from unnest(s_doc, s_chunk, s_score) with ordinality as u(doc_id, chunk_id, score, rank)
    where u.rank <= k
  ),
  joined as (
    select l.rank as lexical_rank,
           s.rank as semantic_rank,
           l.score as lexical_score,
           s.score as semantic_score,
           -- the carried chunk: from the list that ranks the document higher (semantic on a tie)
           (s.rank is not null and (l.rank is null or s.rank <= l.rank)) as sem_chunk,
           l.chunk_id as l_chunk, l.doc_id as l_doc,
           s.chunk_id as s_chunk, s.doc_id as s_doc
    from lex l
    full outer join sem s on s.doc_id = l.doc_id
  ),
  normed as (
    select j.*,
           case when j.lexical_score is null then 0
                when max(j.lexical_score) over () = min(j.lexical_score) over () then 1
                else (j.lexical_score - min(j.lexical_score) over ())
                     / (max(j.lexical_score) over () - min(j.lexical_score) over ()) end as lexn,
           case when j.semantic_score is null then 0
                when max(j.semantic_score) over () = min(j.semantic_score) over () then 1
                else (j.semantic_score - min(j.semantic_score) over ())
                     / (max(j.semantic_score) over () - min(j.semantic_score) over ()) end as semn
    from joined j
  ),
  fused as (
    select case when n.sem_chunk then n.s_chunk else n.l_chunk end as chunk_id,
           case when n.sem_chunk then n.s_doc else n.l_doc end as doc_id,
           n.lexical_rank, n.semantic_rank, n.lexical_score, n.semantic_score,
           case when fusion = 'rrf' then
                  coalesce(lexical_weight / (rrf_k + n.lexical_rank), 0)
                + coalesce(semantic_weight / (rrf_k + n.semantic_rank), 0)
                when fusion = 'convex' then
                  (lexical_weight * n.lexn + semantic_weight * n.semn) / (lexical_weight + semantic_weight)
                else 0 end as fused_score,
           least(coalesce(2 * (n.lexical_rank - 1), 2147483647),
                 coalesce(2 * (n.semantic_rank - 1) + 1, 2147483647)) as rr_order
    from normed n
  )
  select f.chunk_id, f.doc_id, f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score,
         (case when fusion = 'interleave' then 1.0 / row_number() over (order by f.rr_order, f.chunk_id)
               else f.fused_score end)::float8
  from fused f
  order by 7 desc, f.chunk_id;
end
$$;
comment on function kb.hybrid_fusion(text, public.vector, integer, integer, text, double precision, double precision,
                                     double precision, double precision, jsonb, text, uuid[], uuid[],
                                     double precision[]) is
  'The hybrid fusion per document (ids, ranks, scores) that kb.search_hybrid and kb.retrieve_hybrid rank with: '
  'convex combination of min-max normalised scores, RRF or round-robin interleave of the lexical and semantic top-k';
