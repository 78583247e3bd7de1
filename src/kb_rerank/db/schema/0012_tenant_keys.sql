-- 0012: every primary and unique key of a tenant table leads with tenant_id.
--
-- Why now: on a database sharded by tenant (Citus, docs/scaling.md) a distributed table's
-- primary and unique keys must contain the distribution column, and a key that leads with it
-- routes every lookup of a tenant to one shard. Until now four tables had a surrogate id as
-- their primary key (documents.doc_id, chunks.chunk_id, kb_rerank_cache.cache_id,
-- kb_rerank_audit.audit_id) beside a (tenant_id, id) unique key that the foreign keys used.
-- The (tenant_id, id) key becomes the primary key; the id alone is no longer unique by
-- constraint (the ids are random UUIDs or an identity, so nothing changes for the service;
-- every query of the service filters on the tenant anyway: RLS or kb.current_tenant()).
-- The only exception is kb.embedding_config (one row, no tenant: a reference table).
--
-- The foreign keys that rest on the old unique keys are dropped and re-created on the new
-- primary keys (same columns, same ON DELETE CASCADE); re-creating them validates them, one
-- scan of the referencing table.

alter table kb.kb_rerank_curation drop constraint kb_rerank_curation_tenant_id_chunk_id_fkey;
alter table kb.chunks drop constraint chunks_tenant_id_doc_id_fkey;

alter table kb.documents drop constraint documents_pkey;
alter table kb.documents drop constraint documents_tenant_id_doc_id_key;
alter table kb.documents add constraint documents_pkey primary key (tenant_id, doc_id);

alter table kb.chunks drop constraint chunks_pkey;
alter table kb.chunks drop constraint chunks_tenant_chunk_key;
alter table kb.chunks add constraint chunks_pkey primary key (tenant_id, chunk_id);

alter table kb.chunks add constraint chunks_tenant_id_doc_id_fkey
  foreign key (tenant_id, doc_id) references kb.documents (tenant_id, doc_id) on delete cascade;
alter table kb.kb_rerank_curation add constraint kb_rerank_curation_tenant_id_chunk_id_fkey
  foreign key (tenant_id, chunk_id) references kb.chunks (tenant_id, chunk_id) on delete cascade;

alter table kb.kb_rerank_cache drop constraint kb_rerank_cache_pkey;
alter table kb.kb_rerank_cache add constraint kb_rerank_cache_pkey primary key (tenant_id, cache_id);

alter table kb.kb_rerank_audit drop constraint kb_rerank_audit_pkey;
alter table kb.kb_rerank_audit add constraint kb_rerank_audit_pkey primary key (tenant_id, audit_id);
