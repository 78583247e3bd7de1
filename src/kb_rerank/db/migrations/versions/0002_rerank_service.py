"""rerank service: audit log (hash chain per tenant), curation, cache tracing columns, eviction

Revision ID: 0002_rerank_service
Revises: 0001_foundation
"""
from kb_rerank import sqlfiles

revision = "0002_rerank_service"
down_revision = "0001_foundation"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0002_rerank_service.sql",)
DOWNGRADE = ("0002_rerank_service.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
