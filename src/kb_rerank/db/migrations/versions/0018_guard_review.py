"""guard review: kb.chunks.injection_strong (strong evidence of injection) and
injection_review, kb.guard_reviews (a person's allow / block of a chunk's text)

Revision ID: 0018_guard_review
Revises: 0017_title_field
"""
from kb_rerank import sqlfiles

revision = "0018_guard_review"
down_revision = "0017_title_field"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0018_guard_review.sql",)
DOWNGRADE = ("0018_guard_review.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
