-- kb.search_hybrid(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b, filter,
--                  language)
--
-- kb.hybrid_fusion's rows (it says how the lexical and semantic lists are read and fused:
-- 'convex', 'rrf' or 'interleave'), each with its chunk's title, snippet (the first 300
-- characters) and content, ordered by score desc, chunk_id: up to 2k rows (documents).
-- SECURITY INVOKER: it sees exactly what the list functions return for the caller's tenant,
-- and reads the texts under the caller's row-level security.
-- k1, b: the BM25 parameters of the lexical list (the service passes KB_BM25_K1 / KB_BM25_B,
-- as it does to kb.search_lexical).
-- filter: a search filter (kb.search_filter's grammar, docs/filters.md), applied inside both
-- lists (each is the top k within the filter's documents) before the fusion; NULL or {}: none.
--
-- language: the query's language, for the lexical list (kb.search_lexical); NULL: the
-- tenant's languages decide (kb.query_languages).
--
-- The defaults are the settings' defaults (KB_FUSION_DEPTH, KB_RRF_K, KB_FUSION_METHOD,
-- KB_LEXICAL_WEIGHT, KB_SEMANTIC_WEIGHT, KB_BM25_K1, KB_BM25_B), rendered from their
-- declarations (kb_rerank/core/settings.py) by kb_rerank.db.layer, so
-- `select * from kb.search_hybrid('query', embedding)` ranks as the API's first stage does
-- with the default settings (the service keeps the first 2 x KB_CANDIDATES rows of this
-- order: kb.retrieve_hybrid); tests/retrieval/test_one_default.py compares the SQL function,
-- `kb-rerank search`, the eval and the API.
-- The signatures before k1 / b, before the filter and before the language (one overload only:
-- callers' positional calls stay unambiguous).
drop function if exists kb.search_hybrid(text, public.vector, integer, integer, text, double precision,
                                         double precision);
drop function if exists kb.search_hybrid(text, public.vector, integer, integer, text, double precision,
                                         double precision, double precision, double precision);
drop function if exists kb.search_hybrid(text, public.vector, integer, integer, text, double precision,
                                         double precision, double precision, double precision, jsonb);
-- Its parameters and returned columns are written out again in kb.hybrid_fusion,
-- kb.retrieve_hybrid and the list searches: a signature is its callers' contract (named and
-- positional calls, \df), and SQL has no shared one.
create or replace function kb.search_hybrid(
  query text,
  query_embedding public.vector,
  k integer default {{default:fusion_depth}},
  rrf_k integer default {{default:rrf_k}},
  fusion text default {{default:fusion_method}},
  lexical_weight double precision default {{default:lexical_weight}},
  semantic_weight double precision default {{default:semantic_weight}},
  k1 double precision default {{default:bm25_k1}},
  b double precision default {{default:bm25_b}},
  filter jsonb default null,
  language text default null
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
language sql
stable
security invoker
set search_path = pg_catalog, kb, pg_temp
as $$
  select f.chunk_id, f.doc_id, t.doc_title, t.snippet, t.content,
         f.lexical_rank, f.semantic_rank, f.lexical_score, f.semantic_score, f.score
  from kb.hybrid_fusion(query, query_embedding, k, rrf_k, fusion, lexical_weight, semantic_weight, k1, b, filter, language) f
  cross join lateral kb.chunk_texts(f.chunk_id, f.doc_id) t
  order by f.score desc, f.chunk_id
$$;
comment on function kb.search_hybrid(text, public.vector, integer, integer, text, double precision, double precision,
                                  double precision, double precision, jsonb, text) is
  'Hybrid search per document: lexical (BM25) and semantic top-k documents (within a search filter when given) fused '
  'by a convex combination of min-max normalised scores (the default), RRF or round-robin interleave; one chunk '
  'per document; the defaults are the service''s settings';
