"""accent-exact lexemes: index accented words as typed besides their folded form; re-analyse chunks

Revision ID: 0004_accent_exact
Revises: 0003_context_guardrails
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0004_accent_exact"
down_revision = "0003_context_guardrails"
branch_labels = None
depends_on = None

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0004_accent_exact.sql", "0004_accent_exact_reanalyse.sql")
DOWNGRADE = ("0004_accent_exact.down.sql",)


def _run(files: tuple[str, ...]) -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    raw = op.get_bind().connection.driver_connection
    for name in files:
        sqlfiles.apply_versioned(raw, name, embedding_dim=dim)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
