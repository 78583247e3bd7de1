"""tsvector stored in the heap row (storage main): BM25 reads it for every candidate

Revision ID: 0007_tsv_inline
Revises: 0006_pair_scores
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0007_tsv_inline"
down_revision = "0006_pair_scores"
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0007_tsv_inline.sql", embedding_dim=dim)


def downgrade() -> None:
    # rows keep their in-line tsvector until they are next written; that is harmless
    sqlfiles.execute_script(_raw(), "alter table kb.chunks alter column tsv set storage extended;")
