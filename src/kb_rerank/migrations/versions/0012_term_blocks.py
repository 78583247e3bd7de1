"""BM25 impact-ordered blocks: kb.term_tops holds levels of each common term's chunks

Revision ID: 0012_term_blocks
Revises: 0011_english_stem
"""
from kb_rerank import sqlfiles

revision = "0012_term_blocks"
down_revision = "0011_english_stem"
branch_labels = None
depends_on = None

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0012_term_blocks.sql",)
DOWNGRADE = ("0012_term_blocks.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
