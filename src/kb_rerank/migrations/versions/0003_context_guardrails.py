"""context guardrails: injection / stuffing flags on chunks, kb.tenant_policy

Revision ID: 0003_context_guardrails
Revises: 0002_rerank_service
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0003_context_guardrails"
down_revision = "0002_rerank_service"
branch_labels = None
depends_on = None

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0003_context_guardrails.sql",)
DOWNGRADE = ("0003_context_guardrails.down.sql",)


def _run(files: tuple[str, ...]) -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    raw = op.get_bind().connection.driver_connection
    for name in files:
        sqlfiles.apply_versioned(raw, name, embedding_dim=dim)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
