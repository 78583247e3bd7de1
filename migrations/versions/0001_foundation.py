"""foundation: schema kb, documents, chunks, BM25 statistics, rerank cache, RLS, search functions

Revision ID: 0001_foundation
Revises:
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0001_foundation"
down_revision = None
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0001_foundation.sql", embedding_dim=dim)


def downgrade() -> None:
    # Roles are cluster-wide and may serve other databases: they are left in place.
    sqlfiles.execute_script(_raw(), "drop schema if exists kb cascade;")
