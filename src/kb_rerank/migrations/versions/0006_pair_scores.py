"""pair-score cache: kb.kb_rerank_pair_scores (cross-encoder score per model, query hash, chunk, content hash)

Revision ID: 0006_pair_scores
Revises: 0005_tenant_scoped_chunk_key
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0006_pair_scores"
down_revision = "0005_tenant_scoped_chunk_key"
branch_labels = None
depends_on = None

# Versioned files under sql/schema/ (frozen once shipped: migrations/frozen.sha256).
UPGRADE = ("0006_pair_scores.sql",)
DOWNGRADE = ("0006_pair_scores.down.sql",)


def _run(files: tuple[str, ...]) -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    raw = op.get_bind().connection.driver_connection
    for name in files:
        sqlfiles.apply_versioned(raw, name, embedding_dim=dim)


def upgrade() -> None:
    _run(UPGRADE)


def downgrade() -> None:
    _run(DOWNGRADE)
