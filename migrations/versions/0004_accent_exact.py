"""accent-exact lexemes: index accented words as typed besides their folded form; re-analyse chunks

Revision ID: 0004_accent_exact
Revises: 0003_context_guardrails
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0004_accent_exact"
down_revision = "0003_context_guardrails"
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0004_accent_exact.sql", embedding_dim=dim)
    # the new analysis functions must exist before the chunks are re-analysed (the rest of
    # the idempotent layer is applied when the upgrade reaches head)
    sqlfiles.apply_idempotent(_raw(), embedding_dim=dim,
                              only=("functions/01_text_analysis.sql", "functions/02_chunks_derive.sql"))
    # the update trigger re-derives tsv and doc_len; the statistics triggers keep BM25 exact
    sqlfiles.execute_script(_raw(), "update kb.chunks set content = content;")


def downgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0004_accent_exact.down.sql", embedding_dim=dim)
