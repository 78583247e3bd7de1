"""tenant-scoped chunk key: unique (tenant_id, doc_id, position) instead of (doc_id, position)

Revision ID: 0005_tenant_scoped_chunk_key
Revises: 0004_accent_exact
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0005_tenant_scoped_chunk_key"
down_revision = "0004_accent_exact"
branch_labels = None
depends_on = None

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0005_tenant_scoped_chunk_key.sql",)
DOWNGRADE = ("0005_tenant_scoped_chunk_key.down.sql",)


def _run(files: tuple[str, ...]) -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    raw = op.get_bind().connection.driver_connection
    for name in files:
        sqlfiles.apply_versioned(raw, name, embedding_dim=dim)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
