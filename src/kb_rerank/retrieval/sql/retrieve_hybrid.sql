-- kb.retrieve_hybrid(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight,
--                    k1, b, lim, pair_model, pair_query_hash, pair_generation, filter)
--
-- The service's hybrid read in ONE statement: kb.search_hybrid's best `lim` rows, in its order
-- (score desc, chunk_id), each with its live pair score (kb.kb_rerank_pair_scores) when one is
-- kept, instead of kb.search_hybrid and then the pair-score read as a second statement
-- (kb_rerank/retrieval/spec.py, kb_rerank/retrieval/store.py).
--
-- Same rows as `select * from kb.search_hybrid(query, query_embedding, k, rrf_k, fusion,
-- lexical_weight, semantic_weight, k1, b, filter) order by score desc, chunk_id limit lim`: the same
-- lists without their texts (kb.search_lexical_ids, the search kb.search_lexical adds the texts
-- to, and kb.search_semantic_ids, kb.search_semantic's kNN step),
-- the same deepening of the semantic list, the same per-document fusion written expression for
-- expression (kb.search_hybrid's comment says what it computes), the same ties (chunk_id).
-- tests/retrieval/test_retrieval_speed_equivalence.py compares the two for every fusion; a change to
-- kb.search_hybrid's fusion is made here too. What differs is only where the texts come
-- from: the fusion carries ids, ranks and scores, and the title, snippet and content are
-- read for the `lim` rows returned (two key lookups a row), not carried for the 2 x k
-- chunks of the semantic list through the aggregation, the join and the sorts.
--
--   lim               rows returned, 1..2000 (kb.search_hybrid returns at most 2k)
--   pair_model, pair_query_hash, pair_generation
--                     the pair cache's key of this query (kb_rerank/rerank/pair_cache.py):
--                     pair_score is the live score of (chunk_id, sha256 of content) under it,
--                     NULL when none is kept or when pair_model is NULL (no pair read: a
--                     standby, the CLI, the eval).
--
-- SECURITY INVOKER: it reads what the caller may read, in the caller's tenant transaction
-- (RLS on the chunks, documents and pair scores; the two list functions, definers, filter on
-- kb.current_tenant()). Stable: it writes nothing. search_path pinned, pg_temp last.
-- filter: kb.search_hybrid's, inside both lists before the fusion (NULL: none).
-- The signature before the filter (one overload only: positional calls stay unambiguous).
drop function if exists kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                           double precision, double precision, double precision, integer, text,
                                           text, bigint);
create or replace function kb.retrieve_hybrid(
  query text,
  query_embedding public.vector,
  k integer,
  rrf_k integer,
  fusion text,
  lexical_weight double precision,
  semantic_weight double precision,
  k1 double precision,
  b double precision,
  lim integer,
  pair_model text,
  pair_query_hash text,
  pair_generation bigint,
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  lexical_rank integer,
  semantic_rank integer,
  lexical_score double precision,
  semantic_score double precision,
  score double precision,
  pair_score real
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
  -- kb.search_hybrid's checks, with its messages
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
  if lim is null or lim < 1 or lim > 2000 then
    raise exception 'lim must be between 1 and 2000, got %', lim using errcode = '22023';
  end if;

  -- semantic documents: best chunk per document in chunk-rank order, read deep enough for
  -- k documents (kb.search_hybrid's loop, over ids and scores only)
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
    select l.chunk_id, l.doc_id, l.score, l.rank
    from kb.search_lexical_ids(query, k, k1, b, filter) l
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
  ),
  top as materialized (
    -- kb.search_hybrid's score and order, cut to lim rows before any text is read
    select f.chunk_id, f.doc_id, f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score,
           (case when fusion = 'interleave' then 1.0 / row_number() over (order by f.rr_order, f.chunk_id)
                 else f.fused_score end)::float8 as score
    from fused f
    order by 7 desc, f.chunk_id
    limit lim
  )
  select t.chunk_id, t.doc_id, d.title, left(c.content, 300), c.content,
         t.lexical_rank, t.semantic_rank, t.lexical_score, t.semantic_score, t.score, p.score
  from top t
  join kb.chunks c on c.tenant_id = kb.current_tenant() and c.chunk_id = t.chunk_id
  join kb.documents d on d.tenant_id = kb.current_tenant() and d.doc_id = t.doc_id
  left join kb.kb_rerank_pair_scores p
    on p.tenant_id = kb.current_tenant() and p.model = pair_model and p.query_hash = pair_query_hash::bpchar
   and p.generation = pair_generation and p.chunk_id = t.chunk_id
   -- the pair cache's content hash: sha256 hex of the text (kb_rerank.core.candidate.sha256_hex)
   and p.content_hash = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(c.content, 'UTF8')), 'hex')::bpchar
   and p.expires_at > pg_catalog.now()
  order by t.score desc, t.chunk_id;
end
$$;
comment on function kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                       double precision, double precision, double precision, integer, text,
                                       text, bigint, jsonb) is
  'kb.search_hybrid''s best lim rows in its order, each with its live pair score under the given key (NULL: none); one statement';
