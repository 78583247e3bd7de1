"""The vectors beside the (tenant_id, doc_id) key: a covering B-tree index on kb.chunks, so
the semantic list's exact search over a filter reads no TOAST (384-dimension embedders;
up to 660 dimensions); forward-only

Revision ID: 0028_vector_storage
Revises: 0027_language_stats
"""
from kb_rerank import sqlfiles

revision = "0028_vector_storage"
down_revision = "0027_language_stats"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0028_vector_storage.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    raise RuntimeError("0028_vector_storage is forward-only: downgrades are done by restoring a backup"
                       " taken before the upgrade")
