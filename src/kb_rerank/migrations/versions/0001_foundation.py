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

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0001_foundation.sql",)
DOWNGRADE = ("0001_foundation.down.sql",)


def _run(files: tuple[str, ...]) -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    raw = op.get_bind().connection.driver_connection
    for name in files:
        sqlfiles.apply_versioned(raw, name, embedding_dim=dim)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
