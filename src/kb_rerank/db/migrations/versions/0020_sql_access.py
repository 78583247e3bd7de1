"""SQL access for one tenant: the group role kb_sql_reader, the owner role kb_access of the
mapping lookup, and the mapping kb.sql_access (login role -> tenant)

Revision ID: 0020_sql_access
Revises: 0019_term_blocks_name
"""
from kb_rerank import sqlfiles

revision = "0020_sql_access"
down_revision = "0019_term_blocks_name"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0020_sql_access.sql",)
DOWNGRADE = ("0020_sql_access.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
