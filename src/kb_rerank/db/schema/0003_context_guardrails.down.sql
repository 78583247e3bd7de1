-- Downgrade of 0003_context_guardrails (run by its Alembic revision).
-- Drops what 0003 added (the policies of sql/policies/tenant_policy.sql die with the table).
drop table if exists kb.tenant_policy;
alter table kb.chunks
  drop column if exists injection_flag,
  drop column if exists injection_score,
  drop column if exists injection_reasons,
  drop column if exists spam_flag;
-- 'caller_documents' rows: cache entries are dropped; audit rows are append-only (a hash
-- chain), so when some exist the 0002 constraint comes back NOT VALID (checked for new
-- rows only) instead of deleting history.
delete from kb.kb_rerank_cache where source = 'caller_documents';
alter table kb.kb_rerank_cache drop constraint if exists kb_rerank_cache_source_check;
alter table kb.kb_rerank_cache add constraint kb_rerank_cache_source_check
  check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation'));
alter table kb.kb_rerank_audit drop constraint if exists kb_rerank_audit_source_check;
do $$
begin
  if exists (select from kb.kb_rerank_audit where source = 'caller_documents') then
    alter table kb.kb_rerank_audit add constraint kb_rerank_audit_source_check
      check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation')) not valid;
  else
    alter table kb.kb_rerank_audit add constraint kb_rerank_audit_source_check
      check (source in ('lexical_only','semantic_only','hybrid_lexical_semantic','manual_curation'));
  end if;
end
$$;
