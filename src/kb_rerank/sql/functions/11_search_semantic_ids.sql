-- kb.search_semantic_ids(query_embedding, k): kb.search_semantic's chunk list without the
-- texts: chunk id, document id, score and rank only (kb.retrieve_hybrid reads it, and fetches
-- the texts of the rows it returns only).
--
-- The kNN step is kb.search_semantic's (the same filter, order and limit inside a
-- materialized CTE, the same settings hnsw.iterative_scan = relaxed_order and
-- hnsw.ef_search = 100, the same order and ranks; only the columns it carries differ), so both return the same chunks in the same order with the same scores
-- (tests/test_retrieval_speed_equivalence.py compares them); keep the two in step. What it
-- leaves out is the document join (one index lookup a chunk) and the content and snippet of
-- up to 1000 chunks, most of which the hybrid fusion drops.
--
-- SECURITY DEFINER, owned by kb_search, for kb.search_semantic's reason: the tenant filter is
-- applied here, on kb.current_tenant(), so the HNSW index is used and no other tenant's rows
-- are visible; with no tenant set it returns no rows. search_path pinned, pg_temp last.
create or replace function kb.search_semantic_ids(
  query_embedding public.vector,
  k integer default 20
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  score double precision,
  rank integer
)
language sql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
set hnsw.iterative_scan = relaxed_order
set hnsw.ef_search = 100
as $$
  with nn as materialized (
    select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) query_embedding as distance
    from kb.chunks c
    where c.tenant_id = kb.current_tenant()
    order by c.embedding OPERATOR(public.<=>) query_embedding
    limit greatest(least(k, 1000), 0)
  )
  select nn.chunk_id, nn.doc_id, 1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
  from nn
  order by nn.distance, nn.chunk_id
$$;
alter function kb.search_semantic_ids(public.vector, integer) owner to kb_search;
comment on function kb.search_semantic_ids(public.vector, integer) is
  'kb.search_semantic''s cosine top-k chunks (id, document, score, rank) without their texts; empty when no tenant is set';
