-- kb.search_semantic_ids(query_embedding, k, filter): cosine nearest neighbours in the
-- caller's tenant, as chunk id, document id, score (cosine similarity) and rank; within
-- `filter`'s documents when one is given (kb.search_filter's grammar: docs/filters.md). The
-- kNN step of kb.search_semantic (which adds the texts) and of kb.hybrid_fusion.
--
-- SECURITY DEFINER, owned by kb_search: under RLS the planner would not use the HNSW index;
-- the tenant filter is applied here, on kb.current_tenant(), so the index is used and no
-- other tenant's rows are visible; with no tenant set it returns no rows. search_path
-- pinned, pg_temp last. The tenant is read once (v_tenant) and compared as a value:
-- kb.current_tenant() in a condition is inlined (a CASE on pg_has_role) and evaluated again
-- for each row the graph walk's filter visits.
--
-- The kNN step is a plain `ORDER BY embedding <=> q LIMIT k` (no join or window function
-- inside it) so the HNSW index serves it. hnsw.iterative_scan (pgvector 0.8, a function-level
-- SET: it holds for this call only) lets the index scan go on until k rows pass the tenant
-- and filter conditions, so a small tenant among many, or a filter, still gets its full
-- top k (up to hnsw.max_scan_tuples visited, pgvector's default 20000). ef_search 200: the
-- walk's candidate list is longer than the service's list (120 chunks: twice the fusion depth),
-- so an unfiltered walk of a tenant alone fills it in one pass; with 100 the first pass ends at
-- 100 and the iterative scan starts a second. Measured at 120 (bench/results/semantic-ef-search.md):
-- as many of the exact top 120 as 100 and its second pass found, more of the exact top 60, in
-- less time; a 60-chunk list (the semantic search alone) costs more than at 100 and finds
-- more. (A function-level SET, not set_config by k: set_config is refused in a parallel
-- query, and this function is parallel safe.) With a filter, a chunk qualifies when its document is in
-- kb.search_filter_docs(filter): on the index scan, `(c.doc_id in (select unnest($3))) is
-- true`, a hashed subplan built once (one lookup a visited chunk; `c.doc_id = any ($3)` is
-- not hashed on the index scan and compares each visited chunk with the whole array).
-- A clearly broad filter on a large tenant is not listed at all: the walk checks each visited
-- chunk's document (below, where the sample decides).
-- When the filter's documents hold at most {{semantic_exact_max_chunks}} chunks
-- (kb_rerank.core.knn.SEMANTIC_EXACT_MAX_CHUNKS), the exact search: every such chunk's
-- distance. It reads only chunk_id, doc_id and embedding, which the covering index
-- chunks_tenant_doc_vectors_idx (tenant_id, doc_id) INCLUDE (chunk_id, embedding) holds: an
-- index-only scan, no heap visit or TOAST lookup a chunk (where the vectors fit a B-tree
-- entry, db/schema/0028_vector_storage.sql; else the vectors are read from the table). The
-- graph walk loses the filter's nearest chunks when they are a minority of the graph's
-- neighbourhoods (recall@60 0.86 at 10 % of a 100k-chunk tenant, whatever ef_search, scan
-- memory or tuple limit); the exact search keeps all of them
-- (bench/results/semantic-exact-threshold.md measures the paths).
-- ROWS: at most k rows, the candidate list's default by default; the planner's default guess
-- for a set-returning function (1000) made callers join its rows to the texts by merging with
-- every document of the tenant instead of looking up each row's.
-- the signature before the filter (one overload only: positional calls stay unambiguous)
drop function if exists kb.search_semantic_ids(public.vector, integer);
create or replace function kb.search_semantic_ids(
  query_embedding public.vector,
  k integer default {{default:candidates}},
  filter jsonb default null
)
returns table (
  chunk_id uuid,
  doc_id uuid,
  score double precision,
  rank integer
)
language plpgsql
stable
parallel safe
rows {{default:candidates}}
security definer
set search_path = pg_catalog, kb, pg_temp
set hnsw.iterative_scan = relaxed_order
set hnsw.ef_search = 200
as $fn$
#variable_conflict use_column
declare
  v_k integer := greatest(least(k, 1000), 0);
  v_tenant uuid := kb.current_tenant();
  v_f jsonb;
  v_docs uuid[];
  v_n integer;
  v_rows bigint;
  v_per_doc float8;
  v_a record;
  v_tenant_chunks bigint;
  v_sampled integer;
  v_hits integer;
  v_size integer;
  v_ids uuid[];
  v_doc_ids uuid[];
  v_dists float8[];
begin
  -- A clearly broad filter: no listing of its documents; the graph walk checks each chunk it
  -- visits against its document (kb.search_filter_docs_where on that row, found by its
  -- primary key): the same walk as the listed documents' below, so the same recall. "Clearly":
  -- of {{semantic_walk_sample}} of the tenant's chunks (chunk ids are random: from the point
  -- the md5 of the query vector's bytes names on, by the (tenant_id, chunk_id) key, from the
  -- first id on where the last is reached), a share of at least
  -- {{semantic_walk_min_share}} passes and that share of the tenant's chunks (kb.corpus_stats)
  -- is at least {{semantic_walk_min_chunks}}, twice the exact search's threshold: the margin
  -- (kb_rerank.core.knn) puts a filter within the threshold 6 or more standard deviations
  -- from this path. Should the walk still come back short of k (a filter narrower than its
  -- sample: hnsw.max_scan_tuples reached), the listing below answers instead.
  select cs.n_chunks into v_tenant_chunks from kb.corpus_stats cs where cs.tenant_id = v_tenant;
  if v_tenant_chunks >= {{semantic_walk_min_chunks}} and v_k > 0 then
    v_f := kb.search_filter(filter);
  end if;
  if v_f is not null then
    select * into v_a from kb.search_filter_docs_args(v_f);
    -- a quarter of the sample first: a filter that fails it (most narrow ones) costs that only
    foreach v_size in array array[{{semantic_walk_sample}} / 4, {{semantic_walk_sample}}] loop
      execute format($q$
          select count(*)::integer,
                 (count(*) filter (where (select %s from kb.documents d
                                          where d.tenant_id = $16 and d.doc_id = s.doc_id) is true))::integer
          from ((select c.doc_id from kb.chunks c
                 where c.tenant_id = $16 and c.chunk_id >= $18
                 order by c.chunk_id limit $19)
                union all
                (select c.doc_id from kb.chunks c
                 where c.tenant_id = $16 and c.chunk_id < $18
                 order by c.chunk_id limit $19)
                limit $19) as s
        $q$, kb.search_filter_docs_where())
        into v_sampled, v_hits
        using v_a.jp, null::uuid[], v_a.source_uri, v_a.language, v_a.title,
              v_a.updated_in, v_a.updated_gte, v_a.updated_gt, v_a.updated_lte, v_a.updated_lt,
              v_a.ingested_in, v_a.ingested_gte, v_a.ingested_gt, v_a.ingested_lte, v_a.ingested_lt,
              v_tenant, v_a.ranges, md5(public.vector_send(query_embedding))::uuid, v_size;
      exit when v_sampled < v_size or v_hits < {{semantic_walk_min_share}} * v_sampled;
    end loop;
    if v_sampled = {{semantic_walk_sample}}
       and v_hits >= {{semantic_walk_min_share}} * v_sampled
       and v_hits::float8 / v_sampled * v_tenant_chunks >= {{semantic_walk_min_chunks}} then
      execute format($q$
          with nn as materialized (
            select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) $18 as distance
            from kb.chunks c
            where c.tenant_id = $16
              and (select %s from kb.documents d where d.tenant_id = $16 and d.doc_id = c.doc_id) is true
            order by c.embedding OPERATOR(public.<=>) $18
            limit $19
          )
          select array_agg(nn.chunk_id order by nn.distance, nn.chunk_id),
                 array_agg(nn.doc_id order by nn.distance, nn.chunk_id),
                 array_agg(nn.distance order by nn.distance, nn.chunk_id)
          from nn
        $q$, kb.search_filter_docs_where())
        into v_ids, v_doc_ids, v_dists
        using v_a.jp, null::uuid[], v_a.source_uri, v_a.language, v_a.title,
              v_a.updated_in, v_a.updated_gte, v_a.updated_gt, v_a.updated_lte, v_a.updated_lt,
              v_a.ingested_in, v_a.ingested_gte, v_a.ingested_gt, v_a.ingested_lte, v_a.ingested_lt,
              v_tenant, v_a.ranges, query_embedding, v_k;
      if cardinality(v_ids) = v_k then
        return query
          select u.chunk_id, u.doc_id, 1 - u.distance, u.rank::integer
          from unnest(v_ids, v_doc_ids, v_dists) with ordinality as u (chunk_id, doc_id, distance, rank)
          order by u.rank;
        return;
      end if;
    end if;
  end if;
  v_docs := kb.search_filter_docs(filter);
  if v_docs is null then
    return query
      with nn as materialized (
        select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) query_embedding as distance
        from kb.chunks c
        where c.tenant_id = v_tenant
        order by c.embedding OPERATOR(public.<=>) query_embedding
        limit v_k
      )
      select nn.chunk_id, nn.doc_id, 1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
      from nn
      order by nn.distance, nn.chunk_id;
    return;
  end if;
  if cardinality(v_docs) = 0 or v_k = 0 then
    return;
  end if;
  -- Where the filter's documents likely hold at most the threshold's chunks (the database's
  -- chunks per document, from the planner's statistics: a guess, used only to order the
  -- work), the exact search runs first and counts its own candidates (LIMIT threshold + 1):
  -- no rows back means none or more than the threshold, and the count below decides as
  -- before. The path taken is the count's in every case; a good guess saves the separate
  -- count (~0.4 us a chunk), a wrong one costs one exact search before the graph walk.
  select c.reltuples / nullif(d.reltuples, 0) into v_per_doc
  from pg_catalog.pg_class c, pg_catalog.pg_class d
  where c.oid = 'kb.chunks'::regclass and d.oid = 'kb.documents'::regclass;
  if v_per_doc > 0 and cardinality(v_docs) * v_per_doc <= {{semantic_exact_max_chunks}} then
    return query
      with cand as materialized (
        select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) query_embedding as distance
        from kb.chunks c
        where c.tenant_id = v_tenant and c.doc_id = any (v_docs)
        limit {{semantic_exact_max_chunks}} + 1
      ), nn as materialized (
        select cand.chunk_id, cand.doc_id, cand.distance
        from cand
        where (select count(*) from cand) <= {{semantic_exact_max_chunks}}
        order by cand.distance, cand.chunk_id
        limit v_k
      )
      select nn.chunk_id, nn.doc_id, 1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
      from nn
      order by nn.distance, nn.chunk_id;
    get diagnostics v_rows = row_count;
    if v_rows > 0 then
      return;
    end if;
  end if;
  select count(*)::integer into v_n
  from (select 1 from kb.chunks c
        where c.tenant_id = v_tenant and c.doc_id = any (v_docs) limit {{semantic_exact_max_chunks}} + 1) as x;
  -- exact: the distance of every chunk of the filter's documents (`+ 0`: not the HNSW order)
  -- approximate: the HNSW index scan, iterative, with the documents as a filter
  return query execute format($q$
      with nn as materialized (
        select c.chunk_id, c.doc_id, c.embedding OPERATOR(public.<=>) $1 as distance
        from kb.chunks c
        where c.tenant_id = $4 and %s
        order by %s
        limit $2
      )
      select nn.chunk_id, nn.doc_id, 1 - nn.distance, (row_number() over (order by nn.distance, nn.chunk_id))::integer
      from nn
      order by nn.distance, nn.chunk_id
    $q$, case when v_n <= {{semantic_exact_max_chunks}} then 'c.doc_id = any ($3)' else '(c.doc_id in (select unnest($3::uuid[]))) is true' end,
         case when v_n <= {{semantic_exact_max_chunks}} then '(c.embedding OPERATOR(public.<=>) $1) + 0, c.chunk_id'
              else 'c.embedding OPERATOR(public.<=>) $1' end)
    using query_embedding, v_k, v_docs, v_tenant;
end
$fn$;
alter function kb.search_semantic_ids(public.vector, integer, jsonb) owner to kb_search;
comment on function kb.search_semantic_ids(public.vector, integer, jsonb) is
  'Cosine top-k chunks (id, document, score, rank) for the tenant in auth.tenant_id, within a search filter''s documents when given; empty when no tenant is set';
