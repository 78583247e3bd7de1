"""pair-score cache: kb.kb_rerank_pair_scores (cross-encoder score per model, query hash, chunk, content hash)

Revision ID: 0006_pair_scores
Revises: 0005_tenant_scoped_chunk_key
"""
from kb_rerank import sqlfiles

revision = "0006_pair_scores"
down_revision = "0005_tenant_scoped_chunk_key"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0006_pair_scores.sql",)
DOWNGRADE = ("0006_pair_scores.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
