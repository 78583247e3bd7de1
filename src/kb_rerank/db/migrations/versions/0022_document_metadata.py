"""a document's metadata (front-matter keys) in kb.documents.metadata, GIN-indexed, for the
search filter (docs/filters.md); down: the column goes and the searches are 0021's again

Revision ID: 0022_document_metadata
Revises: 0021_language_analysis
"""
from kb_rerank import sqlfiles

revision = "0022_document_metadata"
down_revision = "0021_language_analysis"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0022_document_metadata.sql",)
DOWNGRADE = ("0022_document_metadata.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
