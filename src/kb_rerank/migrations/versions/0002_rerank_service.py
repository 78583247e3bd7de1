"""rerank service: audit log (hash chain per tenant), curation, cache tracing columns, eviction

Revision ID: 0002_rerank_service
Revises: 0001_foundation
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0002_rerank_service"
down_revision = "0001_foundation"
branch_labels = None
depends_on = None

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0002_rerank_service.sql",)
DOWNGRADE = ("0002_rerank_service.down.sql",)


def _run(files: tuple[str, ...]) -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    raw = op.get_bind().connection.driver_connection
    for name in files:
        sqlfiles.apply_versioned(raw, name, embedding_dim=dim)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
