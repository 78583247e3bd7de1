"""BM25 champion lists: kb.term_tops, built by kb.refresh_term_tops(), kept by a trigger

Revision ID: 0008_term_tops
Revises: 0007_tsv_inline
"""
from alembic import context, op

from kb_rerank import sqlfiles

revision = "0008_term_tops"
down_revision = "0007_tsv_inline"
branch_labels = None
depends_on = None


def _raw():
    return op.get_bind().connection.driver_connection


def upgrade() -> None:
    dim = context.config.attributes["kb_embedding_dim"]
    sqlfiles.apply_versioned(_raw(), "0008_term_tops.sql", embedding_dim=dim)


# The trigger and functions that write the lists go with the table (kb.bm25_tf_part stays:
# kb.search_lexical scores with it). kb.search_lexical (an idempotent file, not re-applied by
# a downgrade) checks that the table exists before it reads it, so the search keeps working
# at 0007, without the lists.
DOWNGRADE = """
drop trigger if exists chunks_term_tops_insert on kb.chunks;
drop trigger if exists chunks_term_tops_update on kb.chunks;
drop trigger if exists chunks_term_tops_delete on kb.chunks;
drop function if exists kb.chunks_maintain_term_tops();
drop function if exists kb.refresh_term_tops(integer, integer, double precision, double precision);
drop function if exists kb.term_tops_lock_key(uuid);
drop table if exists kb.term_tops;
"""


def downgrade() -> None:
    sqlfiles.execute_script(_raw(), DOWNGRADE)
