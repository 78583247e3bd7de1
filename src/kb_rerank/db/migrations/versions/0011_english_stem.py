"""stemmed field: Snowball English lexemes ('~ ' prefix) beside the exact ones; re-derive chunks

Revision ID: 0011_english_stem
Revises: 0010_trust
"""
from kb_rerank import sqlfiles

revision = "0011_english_stem"
down_revision = "0010_trust"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0011_english_stem.sql",)
DOWNGRADE = ("0011_english_stem.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
