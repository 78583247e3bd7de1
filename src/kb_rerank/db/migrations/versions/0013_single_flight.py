"""single flight across processes: kb.kb_rerank_inflight, claims on the misses being computed

Revision ID: 0013_single_flight
Revises: 0012_tenant_keys
"""
from kb_rerank import sqlfiles

revision = "0013_single_flight"
down_revision = "0012_tenant_keys"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0013_single_flight.sql",)
DOWNGRADE = ("0013_single_flight.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
