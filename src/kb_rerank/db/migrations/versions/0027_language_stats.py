"""BM25 statistics per (tenant, language): kb.corpus_language_stats, kb.term_language_stats,
backfilled from the chunks stored (docs/quality.md, "Every language analysed"); forward-only

Revision ID: 0027_language_stats
Revises: 0026_filter_typed
"""
from kb_rerank import sqlfiles

revision = "0027_language_stats"
down_revision = "0026_filter_typed"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0027_language_stats.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    raise RuntimeError("0027_language_stats is forward-only: downgrades are done by restoring a backup"
                       " taken before the upgrade")
