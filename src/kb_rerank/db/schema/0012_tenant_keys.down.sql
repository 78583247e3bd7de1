-- Down of 0012: the surrogate ids become the primary keys again, (tenant_id, id) unique keys
-- carry the foreign keys. Fails (unique violation) if two tenants' rows came to share an id
-- after the upgrade, which the service never does (random UUIDs, one identity).

alter table kb.kb_rerank_audit drop constraint kb_rerank_audit_pkey;
alter table kb.kb_rerank_audit add constraint kb_rerank_audit_pkey primary key (audit_id);

alter table kb.kb_rerank_cache drop constraint kb_rerank_cache_pkey;
alter table kb.kb_rerank_cache add constraint kb_rerank_cache_pkey primary key (cache_id);

alter table kb.kb_rerank_curation drop constraint kb_rerank_curation_tenant_id_chunk_id_fkey;
alter table kb.chunks drop constraint chunks_tenant_id_doc_id_fkey;

alter table kb.chunks drop constraint chunks_pkey;
alter table kb.chunks add constraint chunks_pkey primary key (chunk_id);
alter table kb.chunks add constraint chunks_tenant_chunk_key unique (tenant_id, chunk_id);

alter table kb.documents drop constraint documents_pkey;
alter table kb.documents add constraint documents_pkey primary key (doc_id);
alter table kb.documents add constraint documents_tenant_id_doc_id_key unique (tenant_id, doc_id);

alter table kb.chunks add constraint chunks_tenant_id_doc_id_fkey
  foreign key (tenant_id, doc_id) references kb.documents (tenant_id, doc_id) on delete cascade;
alter table kb.kb_rerank_curation add constraint kb_rerank_curation_tenant_id_chunk_id_fkey
  foreign key (tenant_id, chunk_id) references kb.chunks (tenant_id, chunk_id) on delete cascade;
