"""foundation: schema kb, documents, chunks, BM25 statistics, rerank cache, RLS, search functions

Revision ID: 0001_foundation
Revises:
"""
from kb_rerank import sqlfiles

revision = "0001_foundation"
down_revision = None
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0001_foundation.sql",)
DOWNGRADE = ("0001_foundation.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
