-- kb.search_semantic(query_embedding, k, filter): cosine nearest neighbours in the caller's
-- tenant with their texts: kb.search_semantic_ids' chunks (the kNN step, with the filter,
-- retrieval/sql/search_semantic_ids.sql) in its order, each with its document's title, a
-- snippet and its content.
--
-- SECURITY DEFINER, owned by kb_search like the search it calls (so that a caller needs
-- EXECUTE on this function only): the texts are read by kb.chunk_texts, whose lookups name
-- kb.current_tenant(), and with no tenant set the search returns no rows. plpgsql (not sql): its body names
-- kb.search_semantic_ids, created after this file (retrieval/sql/search_semantic_ids.sql sorts later).
-- the signature before the filter (one overload only: positional calls stay unambiguous)
drop function if exists kb.search_semantic(public.vector, integer);
-- Its parameters and returned columns are written out again in kb.search_semantic_ids and the
-- lexical searches: a signature is its callers' contract (named and positional calls, \df), and
-- SQL has no shared one.
create or replace function kb.search_semantic(
  query_embedding public.vector,
  k integer default {{default:candidates}},
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  doc_title text,
  snippet text,
  content text,
  score double precision,
  rank integer
)
language plpgsql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
as $fn$
#variable_conflict use_column
begin
  return query
    select s.chunk_id, s.doc_id, x.doc_title, x.snippet, x.content, s.score, s.rank
    from kb.search_semantic_ids(query_embedding, k, filter) as s
    cross join lateral kb.chunk_texts(s.chunk_id, s.doc_id) x
    order by s.rank;
end
$fn$;
alter function kb.search_semantic(public.vector, integer, jsonb) owner to kb_search;
comment on function kb.search_semantic(public.vector, integer, jsonb) is
  'Cosine top-k chunks (score = cosine similarity) for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when unset';
