"""BM25 impact-ordered blocks: kb.term_tops holds levels of each common term's chunks

Revision ID: 0014_term_blocks
Revises: 0013_single_flight
"""
from kb_rerank import sqlfiles

revision = "0014_term_blocks"
down_revision = "0013_single_flight"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0014_term_blocks.sql",)
DOWNGRADE = ("0014_term_blocks.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
