"""Trust (issue 13): hardened definer functions and privileges, keyed audit chain,
per-tenant cache generation

Each part has its own versioned file under sql/schema/ and its own downgrade file beside it:
  0010_trust_privileges.sql  roles, privileges, temp/public schema, audit MAC column
  0010_trust_cache.sql       per-tenant generation of the knowledge base (cache invalidation)

Revision ID: 0010_trust
Revises: 0009_ts_rank_tf
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0010_trust"
down_revision = "0009_ts_rank_tf"
branch_labels = None
depends_on = None

PARTS = ("0010_trust_privileges", "0010_trust_cache")


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    for part in PARTS:
        sqlfiles.apply_versioned(_raw(), f"{part}.sql", embedding_dim=dim)


def downgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    for part in reversed(PARTS):
        sqlfiles.apply_versioned(_raw(), f"{part}.down.sql", embedding_dim=dim)
