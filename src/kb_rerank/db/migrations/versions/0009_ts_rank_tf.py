"""BM25 term frequencies read through ts_rank (kb.ts_rank_tf): functions only

kb.search_lexical scores a candidate with one expression over its tsvector instead of
unnesting it (retrieval/sql/ts_rank_tf.sql explains how). This revision has no table
change: reaching head re-applies the idempotent files (db/migrations/env.py), which installs
kb.ts_rank_tf(), kb.ts_rank_tf_compute(), the new kb.bm25_tf_part form and the new search.

Revision ID: 0009_ts_rank_tf
Revises: 0008_term_tops
"""

revision = "0009_ts_rank_tf"
down_revision = "0008_term_tops"
branch_labels = None
depends_on = None

# No versioned file: functions only (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE: tuple[str, ...] = ()
DOWNGRADE: tuple[str, ...] = ()


def upgrade() -> None:
    pass  # functions only: applied with the other idempotent files once head is reached


def downgrade() -> None:
    # kb.search_lexical, an idempotent file, is not re-applied by a downgrade: the function
    # it calls stays, as kb.bm25_tf_part stays below 0008
    pass
