-- 0005: the (document, position) key of a chunk is scoped by tenant. Checked across tenants,
-- `unique (doc_id, position)` answered a chunk insert into another tenant's document with a
-- unique violation instead of the foreign-key error a random doc_id gets: an oracle for the
-- existence of another tenant's document. With the tenant in the key, both get the same error.
alter table kb.chunks drop constraint chunks_doc_id_position_key;
alter table kb.chunks add constraint chunks_tenant_doc_position_key unique (tenant_id, doc_id, position);
