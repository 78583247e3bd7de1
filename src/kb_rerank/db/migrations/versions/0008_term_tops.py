"""BM25 champion lists: kb.term_tops, built by kb.refresh_term_tops(), kept by a trigger

Revision ID: 0008_term_tops
Revises: 0007_tsv_inline
"""
from kb_rerank import sqlfiles

revision = "0008_term_tops"
down_revision = "0007_tsv_inline"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0008_term_tops.sql",)
DOWNGRADE = ("0008_term_tops.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
