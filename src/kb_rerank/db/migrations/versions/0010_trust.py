"""Trust: hardened definer functions and privileges, keyed audit chain,
per-tenant cache generation

Each part has its own versioned file under db/schema/ and its own downgrade file beside it:
  0010_trust_privileges.sql  roles, privileges, temp/public schema, audit MAC column
  0010_trust_cache.sql       per-tenant generation of the knowledge base (cache invalidation)

Revision ID: 0010_trust
Revises: 0009_ts_rank_tf
"""
from kb_rerank import sqlfiles

revision = "0010_trust"
down_revision = "0009_ts_rank_tf"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0010_trust_privileges.sql", "0010_trust_cache.sql")
DOWNGRADE = ("0010_trust_cache.down.sql", "0010_trust_privileges.down.sql")


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
