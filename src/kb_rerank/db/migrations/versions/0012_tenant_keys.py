"""tenant-leading keys: the (tenant_id, id) keys become the primary keys of documents, chunks, cache and audit

Revision ID: 0012_tenant_keys
Revises: 0011_english_stem
"""
from kb_rerank import sqlfiles

revision = "0012_tenant_keys"
down_revision = "0011_english_stem"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0012_tenant_keys.sql",)
DOWNGRADE = ("0012_tenant_keys.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
