"""The app role is a setting (KB_APP_ROLE): created when missing, CONNECT on this database
for it alone, cyberos_app left with nothing here when another role is configured

Revision ID: 0016_app_role
Revises: 0015_audit_partitions
"""
from kb_rerank import sqlfiles

revision = "0016_app_role"
down_revision = "0015_audit_partitions"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0016_app_role.sql",)
DOWNGRADE = ("0016_app_role.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
