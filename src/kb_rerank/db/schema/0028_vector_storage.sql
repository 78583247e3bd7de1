-- 0028 The vectors beside the (tenant_id, doc_id) key: a B-tree on kb.chunks (tenant_id, doc_id)
-- that also holds each chunk's id and embedding (INCLUDE), so the semantic list's exact search
-- over a filter's documents (kb.search_semantic_ids) is an index-only scan: each vector read
-- from the index's leaf pages, next to its neighbours of the same document, instead of one
-- heap visit and one TOAST lookup a chunk (kb.chunks' rows exceed the TOAST threshold, so the
-- embedding is stored out of line). It replaces chunks_tenant_idx, whose (tenant_id, doc_id)
-- prefix it serves. Built from the rows already stored (no table rewrite); its size is about
-- the vectors' (1.6 kB a chunk at 384 dimensions).
-- A B-tree entry holds at most 2704 bytes: three uuids (48) and the vector (8 + 4 bytes a
-- dimension) with the entry's header (8) fit up to 660 dimensions. Above that (bge-m3's 1024)
-- no such index is made and the exact search reads the vectors from the table.
do $$
begin
  if {{embedding_dim}} <= 660 then
    create index if not exists chunks_tenant_doc_vectors_idx on kb.chunks (tenant_id, doc_id) include (chunk_id, embedding);
    drop index if exists kb.chunks_tenant_idx;
  end if;
end
$$;
