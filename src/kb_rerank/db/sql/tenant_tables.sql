-- Every tenant table, one line each: its row-level security, its tenant policies and the app
-- role's privileges on it, through the one rule (kb.apply_tenant_policies,
-- db/sql/tenant_policies.sql). What a table has beyond the rule (another role's grants, a
-- policy for a definer's owner) is in its capability's *_policies.sql, applied after this file.

-- The app reads and writes its tenant's rows.
select kb.apply_tenant_policies('kb.documents', 'Documents', '{select,insert,update,delete}');
select kb.apply_tenant_policies('kb.chunks', 'Chunks', '{select,insert,update,delete}');
-- The foreign key on (tenant_id, chunk_id) keeps every pinned chunk inside the curating tenant.
select kb.apply_tenant_policies('kb.kb_rerank_curation', 'Curations', '{select,insert,update,delete}');

-- Written and deleted, never updated: a document's typed metadata values are rewritten by the
-- trigger on kb.documents (as the writer); an expired pair score is deleted, then a new one
-- inserted (ON CONFLICT DO NOTHING).
select kb.apply_tenant_policies('kb.document_values', 'Document values', '{select,insert,delete}');
select kb.apply_tenant_policies('kb.kb_rerank_pair_scores', 'Pair scores', '{select,insert,delete}');

-- Never deleted by the app: a tenant's guard policy row, and a person's allow / block of a
-- chunk's text (`kb-rerank guard allow` / `block`), which outlives the document it was made on
-- so that the same text ingested again is still reviewed.
select kb.apply_tenant_policies('kb.tenant_policy', 'Tenant policies', '{select,insert,update}');
select kb.apply_tenant_policies('kb.guard_reviews', 'Guard reviews', '{select,insert,update}',
                                names => '{"insert": "Guard reviews are recorded by their tenant",
                                           "update": "Guard reviews are changed by their tenant"}');

-- One policy for every command; the app selects, inserts and deletes, never updates: an
-- expired cache row is deleted, then a new one inserted; a single-flight claim is never
-- extended (released or expired). A SQL caller holding the app role claims only keys of its
-- own tenant, and a follower waits at most until the claim's expiry capped by its own budget,
-- so a forged claim delays nobody else.
select kb.apply_tenant_policies('kb.kb_rerank_cache', null, '{}', '{select,insert,delete}', one_policy => 'rerank_cache_rls');
select kb.apply_tenant_policies('kb.kb_rerank_inflight', null, '{}', '{select,insert,delete}', one_policy => 'rerank_inflight_rls');

-- Read-only for the app: written by definers or triggers whose owners have their own grants
-- (retrieval/sql/corpus_stats_policies.sql, cache/sql/kb_generation_policies.sql).
select kb.apply_tenant_policies('kb.term_stats', 'Term statistics', '{select}');
select kb.apply_tenant_policies('kb.corpus_stats', 'Corpus statistics', '{select}');
select kb.apply_tenant_policies('kb.term_language_stats', 'Term statistics per language', '{select}');
select kb.apply_tenant_policies('kb.corpus_language_stats', 'Corpus statistics per language', '{select}');
select kb.apply_tenant_policies('kb.term_blocks', 'Term blocks', '{select}');
select kb.apply_tenant_policies('kb.kb_generation', 'Generation', '{select}',
                                names => '{"select": "Generation is visible to its tenant"}');

-- The audit chain: appended only through kb.audit_append (a definer owned by kb_audit, whose
-- INSERT the insert policy binds); the app only reads its entries (with INSERT it could write
-- a back-dated or chain-breaking row). The checkpoints and heads are not the app's at all
-- (audit/sql/audit_policies.sql).
select kb.apply_tenant_policies('kb.kb_rerank_audit', 'Audit entries', '{select,insert}', '{select}',
                                names => '{"insert": "Audit entries are appended by their tenant"}');
select kb.apply_tenant_policies('kb.audit_checkpoints', 'Audit checkpoints', '{select}', '{}');
select kb.apply_tenant_policies('kb.audit_heads', null, '{}', '{}', one_policy => 'Audit heads belong to their tenant');

-- kb_search owns the search functions, definers that filter the tenant themselves.
grant select on kb.documents, kb.chunks, kb.document_values to kb_search;
