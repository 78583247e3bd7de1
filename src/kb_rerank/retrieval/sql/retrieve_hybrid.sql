-- kb.retrieve_hybrid(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight,
--                    k1, b, lim, pair_model, pair_query_hash, pair_generation, filter,
--                    language, lexical_chunks, lexical_docs, lexical_scores)
--
-- The service's hybrid read in ONE statement: kb.search_hybrid's best `lim` rows, in its order
-- (score desc, chunk_id), each with its live pair score (kb.kb_rerank_pair_scores) when one is
-- kept, instead of kb.search_hybrid and then the pair-score read as a second statement
-- (kb_rerank/retrieval/spec.py, kb_rerank/retrieval/store.py).
--
-- Same rows as `select * from kb.search_hybrid(query, query_embedding, k, rrf_k, fusion,
-- lexical_weight, semantic_weight, k1, b, filter) order by score desc, chunk_id limit lim`:
-- both rank with kb.hybrid_fusion, and this one reads the title, snippet and content only
-- for the `lim` rows returned (two key lookups a row).
-- tests/retrieval/test_retrieval_speed_equivalence.py compares the two for every fusion.
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
-- language: kb.search_hybrid's, the query's language for the lexical list (NULL: none given).
-- lexical_chunks, lexical_docs, lexical_scores: the lexical list already read, passed to
-- kb.hybrid_fusion (its comment); NULL: read here. The same rows either way
-- (tests/retrieval/test_retrieval_speed_equivalence.py).
-- The signatures before the filter, before the language and before the lexical list (one
-- overload only: positional calls stay unambiguous).
drop function if exists kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                           double precision, double precision, double precision, integer, text,
                                           text, bigint);
drop function if exists kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                           double precision, double precision, double precision, integer, text,
                                           text, bigint, jsonb);
drop function if exists kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                           double precision, double precision, double precision, integer, text,
                                           text, bigint, jsonb, text);
-- Its parameters and returned columns are written out again in kb.hybrid_fusion and
-- kb.search_hybrid: a signature is its callers' contract (named and positional calls, \df), and
-- SQL has no shared one.
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
  filter jsonb default null,
  language text default null,
  lexical_chunks uuid[] default null,
  lexical_docs uuid[] default null,
  lexical_scores double precision[] default null
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
begin
  -- kb.hybrid_fusion checks the fusion's arguments
  if lim is null or lim < 1 or lim > 2000 then
    raise exception 'lim must be between 1 and 2000, got %', lim using errcode = '22023';
  end if;

  return query
  with top as materialized (
    -- the fusion's score and order, cut to lim rows before any text is read
    select f.chunk_id, f.doc_id, f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score, f.score
    from kb.hybrid_fusion(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b,
                          filter, language, lexical_chunks, lexical_docs, lexical_scores) f
    order by f.score desc, f.chunk_id
    limit lim
  )
  select t.chunk_id, t.doc_id, x.doc_title, x.snippet, x.content,
         t.lexical_rank, t.semantic_rank, t.lexical_score, t.semantic_score, t.score, p.score
  from top t
  cross join lateral kb.chunk_texts(t.chunk_id, t.doc_id) x
  left join kb.kb_rerank_pair_scores p
    on p.tenant_id = kb.current_tenant() and p.model = pair_model and p.query_hash = pair_query_hash::bpchar
   and p.generation = pair_generation and p.chunk_id = t.chunk_id
   -- the pair cache's content hash: sha256 hex of the text (kb_rerank.core.candidate.sha256_hex)
   and p.content_hash = pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(x.content, 'UTF8')), 'hex')::bpchar
   and p.expires_at > pg_catalog.now()
  order by t.score desc, t.chunk_id;
end
$$;
comment on function kb.retrieve_hybrid(text, public.vector, integer, integer, text, double precision,
                                       double precision, double precision, double precision, integer, text,
                                       text, bigint, jsonb, text, uuid[], uuid[], double precision[]) is
  'kb.search_hybrid''s best lim rows in its order, each with its live pair score under the given key (NULL: none); one statement';
