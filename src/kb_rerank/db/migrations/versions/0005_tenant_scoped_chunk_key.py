"""tenant-scoped chunk key: unique (tenant_id, doc_id, position) instead of (doc_id, position)

Revision ID: 0005_tenant_scoped_chunk_key
Revises: 0004_accent_exact
"""
from kb_rerank import sqlfiles

revision = "0005_tenant_scoped_chunk_key"
down_revision = "0004_accent_exact"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0005_tenant_scoped_chunk_key.sql",)
DOWNGRADE = ("0005_tenant_scoped_chunk_key.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
