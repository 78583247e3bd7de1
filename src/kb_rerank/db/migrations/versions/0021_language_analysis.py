"""every language analysed: a chunk's stemmed field in its document's language (PostgreSQL's
Snowball stemmers), character n-grams for scripts written without spaces, each chunk counted
in its language for the query side's prior

Revision ID: 0021_language_analysis
Revises: 0020_sql_access
"""
from kb_rerank import sqlfiles

revision = "0021_language_analysis"
down_revision = "0020_sql_access"
branch_labels = None
depends_on = None

# Versioned files under db/schema/ (frozen once shipped: db/migrations/frozen.sha256).
UPGRADE = ("0021_language_analysis.sql",)
DOWNGRADE = ("0021_language_analysis.down.sql",)


def upgrade() -> None:
    sqlfiles.run_versioned(UPGRADE)


def downgrade() -> None:
    sqlfiles.run_versioned(DOWNGRADE)
