"""one name for the BM25 term blocks: kb.term_tops becomes kb.term_blocks (its functions,
triggers and policy follow); kb.query_terms and kb.search_terms (used by nothing) go

Revision ID: 0019_term_blocks_name
Revises: 0018_guard_review
"""
from kb_rerank import sqlfiles

revision = "0019_term_blocks_name"
down_revision = "0018_guard_review"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0019_term_blocks_name.sql",)
DOWNGRADE = ("0019_term_blocks_name.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
