-- 0022: a document's metadata (its front-matter keys other than those kept in columns:
-- tags, product, version, ...), for the search filter (kb.search_filter, docs/filters.md).
-- Existing documents get {} (a constant default: no table rewrite); ingestion writes the
-- keys from then on (kb_rerank/ingest/loader.py), and re-ingesting a folder fills them.
-- An object, at most 64 KiB as text (ingestion keeps scalars and lists of scalars, bounded).
alter table kb.documents add column metadata jsonb not null default '{}'::jsonb;
alter table kb.documents add constraint documents_metadata_object
  check (jsonb_typeof(metadata) = 'object' and octet_length(metadata::text) <= 65536);
-- The filter's equality and $in on metadata are jsonpath predicates (metadata @@ '$."f" == v'),
-- which a jsonb_path_ops GIN index serves (smaller than jsonb_ops, and @@ / @> are all the
-- filter uses); tenant_id first through btree_gin, as chunks_tenant_tsv_idx.
create index documents_tenant_metadata_idx on kb.documents using gin (tenant_id, metadata jsonb_path_ops);
