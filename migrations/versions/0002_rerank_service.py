"""rerank service: audit log (hash chain per tenant), curation, cache tracing columns, eviction

Revision ID: 0002_rerank_service
Revises: 0001_foundation
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0002_rerank_service"
down_revision = "0001_foundation"
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0002_rerank_service.sql", embedding_dim=dim)


# Drops what 0002 added: the objects of sql/views/cache_stats.sql,
# sql/functions/2*_*.sql and the policy files die with their tables or are dropped here.
# The role kb_maint is cluster-wide and may serve other databases: it is left in place,
# holding no privilege and owning nothing in this database.
DOWNGRADE = """
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
"""


def downgrade() -> None:
    sqlfiles.execute_script(_raw(), DOWNGRADE)
