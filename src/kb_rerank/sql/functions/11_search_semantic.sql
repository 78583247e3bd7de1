-- kb.search_semantic(query_embedding, k): cosine nearest neighbours in the caller's tenant.
--
-- SECURITY DEFINER, owned by kb_search, for the same reason as kb.search_lexical: the
-- tenant filter is applied here, on kb.current_tenant(), so the HNSW index is used and
-- no other tenant's rows are visible; with no tenant set it returns no rows.
-- The kNN step is a plain `ORDER BY embedding <=> q LIMIT k` (no join or window
-- function inside it) so the HNSW index serves it. hnsw.iterative_scan lets pgvector 0.8
-- keep scanning the graph until k rows pass the tenant filter, so a small tenant among
-- many still gets its full top-k; ef_search 100 keeps recall high.
-- The document join names the chunk's tenant: kb.documents' key is (tenant_id, doc_id), and
-- on doc_id alone each of the k lookups skip-scanned the key over every tenant (about 2 ms
-- of a 120-deep call at 10 tenants). The rows are the same: a chunk's document is its
-- tenant's.
create or replace function kb.search_semantic(
  query_embedding public.vector,
  k integer default 20
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
language sql
stable
parallel safe
security definer
set search_path = pg_catalog, kb, pg_temp
set hnsw.iterative_scan = relaxed_order
set hnsw.ef_search = 100
as $$
  with nn as materialized (
    select c.chunk_id, c.doc_id, c.tenant_id, c.content, c.embedding OPERATOR(public.<=>) query_embedding as distance
    from kb.chunks c
    where c.tenant_id = kb.current_tenant()
    order by c.embedding OPERATOR(public.<=>) query_embedding
    limit greatest(least(k, 1000), 0)
  )
  select nn.chunk_id, nn.doc_id, d.title, left(nn.content, 300), nn.content,
         1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
  from nn
  join kb.documents d on d.tenant_id = nn.tenant_id and d.doc_id = nn.doc_id
  order by nn.distance, nn.chunk_id
$$;
alter function kb.search_semantic(public.vector, integer) owner to kb_search;
comment on function kb.search_semantic(public.vector, integer) is
  'Cosine top-k chunks (score = cosine similarity) for the tenant in auth.tenant_id; empty when unset';
