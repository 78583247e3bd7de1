-- Downgrade of 0002_rerank_service (run by its Alembic revision).
-- Drops what 0002 added: the objects of sql/views/cache_stats.sql,
-- sql/functions/2*_*.sql and the policy files die with their tables or are dropped here.
-- The role kb_maint is cluster-wide and may serve other databases: it is left in place,
-- holding no privilege and owning nothing in this database.
drop view if exists kb.cache_hit_ratio, kb.audit_summary, kb.cache_stats;
drop function if exists kb.evict_expired_cache(integer);
drop function if exists kb.audit_verify();
drop function if exists kb.audit_append(text, smallint, text, text, text, text, integer, integer, real, text);
drop function if exists kb.audit_row_hash(kb.kb_rerank_audit);
drop table if exists kb.kb_rerank_curation;
drop table if exists kb.kb_rerank_audit;
alter table kb.chunks drop constraint if exists chunks_tenant_chunk_key;
alter table kb.kb_rerank_cache drop column if exists trace_id, drop column if exists model;
do $$
begin
  if exists (select from pg_roles where rolname = 'kb_maint') then
    revoke all on kb.kb_rerank_cache from kb_maint;
    revoke all on schema kb from kb_maint;
  end if;
end
$$;
