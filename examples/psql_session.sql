\set qvec `.venv/bin/kb-rerank embed 'how do I emit hóa đơn'`
begin;
select set_config('auth.tenant_id', '00000000-0000-4000-8000-000000000001', true);

-- BM25 (best chunk per document)
select doc_title, round(score::numeric, 3) from kb.search_lexical('ERR_402', 5);

-- hybrid: query text + query embedding (384 floats from the configured embedder), and the
-- query's language (the service detects it; NULL: the tenant's languages decide)
select doc_title, lexical_rank, semantic_rank, round(score::numeric, 4)
from kb.search_hybrid('how do I emit hóa đơn', :'qvec'::vector, language => 'vi');

-- the same, within a metadata filter (docs/filters.md)
select doc_title from kb.search_hybrid('how do I emit hóa đơn', :'qvec'::vector,
                                       filter => '{"language": "vi"}');
commit;
