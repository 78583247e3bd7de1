"""title field: a chunk's lexical columns derived from its document's title and its content;
chunks re-derived when a document's title or language changes

Revision ID: 0017_title_field
Revises: 0016_app_role
"""
from kb_rerank import sqlfiles

revision = "0017_title_field"
down_revision = "0016_app_role"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0017_title_field.sql",)
DOWNGRADE = ("0017_title_field.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
