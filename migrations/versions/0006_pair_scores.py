"""pair-score cache: kb.kb_rerank_pair_scores (cross-encoder score per model, query hash, chunk, content hash)

Revision ID: 0006_pair_scores
Revises: 0005_tenant_scoped_chunk_key
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0006_pair_scores"
down_revision = "0005_tenant_scoped_chunk_key"
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0006_pair_scores.sql", embedding_dim=dim)


# Drops the table (its policies and grants go with it) and puts back the 0002..0005 body of
# kb.evict_expired_cache (cache rows only), which would otherwise name a missing table: the
# idempotent files are re-applied only by an upgrade that reaches head.
DOWNGRADE = """
drop table if exists kb.kb_rerank_pair_scores;
do $do$
begin
  if to_regprocedure('kb.evict_expired_cache(integer)') is not null then
    create or replace function kb.evict_expired_cache(batch integer default 10000)
    returns bigint
    language plpgsql
    volatile
    security definer
    set search_path = pg_catalog, kb
    as $$
    declare
      n bigint;
    begin
      if batch is null or batch < 1 or batch > 1000000 then
        raise exception 'batch must be between 1 and 1000000, got %', batch using errcode = '22023';
      end if;
      with doomed as (
        select c.cache_id
        from kb.kb_rerank_cache c
        where c.expires_at <= now()
        order by c.expires_at
        limit batch
      )
      delete from kb.kb_rerank_cache c
      using doomed d
      where c.cache_id = d.cache_id
        and c.expires_at <= now();
      get diagnostics n = row_count;
      return n;
    end
    $$;
    comment on function kb.evict_expired_cache(integer) is
      'Delete up to batch expired rerank cache rows of all tenants; returns the count (SECURITY DEFINER, owner kb_maint)';
  end if;
end
$do$;
"""


def downgrade() -> None:
    sqlfiles.execute_script(_raw(), DOWNGRADE)
