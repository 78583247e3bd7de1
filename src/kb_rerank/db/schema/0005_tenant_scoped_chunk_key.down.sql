-- Downgrade of 0005_tenant_scoped_chunk_key (run by its Alembic revision).
alter table kb.chunks drop constraint chunks_tenant_doc_position_key;
alter table kb.chunks add constraint chunks_doc_id_position_key unique (doc_id, position);
