"""tsvector stored in the heap row (storage main): BM25 reads it for every candidate

Revision ID: 0007_tsv_inline
Revises: 0006_pair_scores
"""
from kb_rerank import sqlfiles

revision = "0007_tsv_inline"
down_revision = "0006_pair_scores"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0007_tsv_inline.sql",)
DOWNGRADE = ("0007_tsv_inline.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
