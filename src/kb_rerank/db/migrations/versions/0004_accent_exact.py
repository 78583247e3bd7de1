"""accent-exact lexemes: index accented words as typed besides their folded form; re-analyse chunks

Revision ID: 0004_accent_exact
Revises: 0003_context_guardrails
"""
from kb_rerank import sqlfiles

revision = "0004_accent_exact"
down_revision = "0003_context_guardrails"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0004_accent_exact.sql", "0004_accent_exact_reanalyse.sql")
DOWNGRADE = ("0004_accent_exact.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
