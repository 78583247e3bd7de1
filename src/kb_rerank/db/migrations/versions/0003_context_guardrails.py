"""context guardrails: injection / stuffing flags on chunks, kb.tenant_policy

Revision ID: 0003_context_guardrails
Revises: 0002_rerank_service
"""
from kb_rerank import sqlfiles

revision = "0003_context_guardrails"
down_revision = "0002_rerank_service"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0003_context_guardrails.sql",)
DOWNGRADE = ("0003_context_guardrails.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
