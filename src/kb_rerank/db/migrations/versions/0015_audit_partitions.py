"""Audit log partitioned by month, signed chain checkpoints (retention)

Revision ID: 0015_audit_partitions
Revises: 0014_term_blocks
"""
from kb_rerank import sqlfiles

revision = "0015_audit_partitions"
down_revision = "0014_term_blocks"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0015_audit_partitions.sql",)
DOWNGRADE = ("0015_audit_partitions.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
