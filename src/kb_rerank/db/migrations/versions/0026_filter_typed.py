"""the search filter's dates and numbers in typed, indexed rows (kb.document_values) and a
document's own date apart from its ingestion time (kb.documents.ingested_at)
(docs/filters.md); forward-only

Revision ID: 0026_filter_typed
Revises: 0022_document_metadata
"""
from kb_rerank import sqlfiles

revision = "0026_filter_typed"
down_revision = "0022_document_metadata"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0026_filter_typed.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    raise RuntimeError("0026_filter_typed is forward-only: downgrades are done by restoring a backup"
                       " taken before the upgrade")
