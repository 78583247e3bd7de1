-- kb.search_hybrid(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight)
--
-- Takes the top-k of kb.search_lexical (best chunk per document) and the top-k of
-- kb.search_semantic (per chunk), joins them on chunk_id so a chunk found by both appears
-- once, and fuses:
--   fusion = 'rrf'        score = lexical_weight / (rrf_k + lexical_rank)
--                               + semantic_weight / (rrf_k + semantic_rank)   (missing rank: 0)
--   fusion = 'interleave' the spec's round-robin: lexical[1], semantic[1], lexical[2], ...
--                         skipping chunks already taken; score = 1 / position
-- Returns up to 2k rows ordered by score desc, chunk_id. SECURITY INVOKER: it sees
-- exactly what the two search functions return for the caller's tenant.
create or replace function kb.search_hybrid(
  query text,
  query_embedding public.vector,
  k integer default 20,
  rrf_k integer default 60,
  fusion text default 'rrf',
  lexical_weight double precision default 1.0,
  semantic_weight double precision default 1.0
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
  score double precision
)
language plpgsql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
#variable_conflict use_column
begin
  if k is null or k < 1 or k > 1000 then
    raise exception 'k must be between 1 and 1000, got %', k using errcode = '22023';
  end if;
  if rrf_k is null or rrf_k < 0 then
    raise exception 'rrf_k must be >= 0, got %', rrf_k using errcode = '22023';
  end if;
  if fusion is null or fusion not in ('rrf', 'interleave') then
    raise exception 'fusion must be ''rrf'' or ''interleave'', got %', fusion using errcode = '22023';
  end if;

  return query
  with lex as (
    select * from kb.search_lexical(query, k)
  ),
  sem as (
    select * from kb.search_semantic(query_embedding, k)
  ),
  joined as (
    select coalesce(l.chunk_id, s.chunk_id) as chunk_id,
           coalesce(l.doc_id, s.doc_id) as doc_id,
           coalesce(l.doc_title, s.doc_title) as doc_title,
           coalesce(l.snippet, s.snippet) as snippet,
           coalesce(l.content, s.content) as content,
           l.rank as lexical_rank,
           s.rank as semantic_rank,
           l.score as lexical_score,
           s.score as semantic_score
    from lex l
    full outer join sem s on s.chunk_id = l.chunk_id
  ),
  fused as (
    select j.*,
           case when fusion = 'rrf' then
                  coalesce(lexical_weight / (rrf_k + j.lexical_rank), 0)
                + coalesce(semantic_weight / (rrf_k + j.semantic_rank), 0)
                else 0 end as rrf_score,
           least(coalesce(2 * (j.lexical_rank - 1), 2147483647),
                 coalesce(2 * (j.semantic_rank - 1) + 1, 2147483647)) as rr_order
    from joined j
  )
  select f.chunk_id, f.doc_id, f.doc_title, f.snippet, f.content,
         f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score,
         (case when fusion = 'rrf' then f.rrf_score
               else 1.0 / row_number() over (order by f.rr_order, f.chunk_id) end)::float8
  from fused f
  order by 10 desc, f.chunk_id;
end
$$;
comment on function kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision) is
  'Hybrid search: lexical (BM25) and semantic top-k fused by RRF (default) or round-robin interleave';
