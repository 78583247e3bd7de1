"""The path the frozen Alembic revisions import (``from kb_rerank import sqlfiles``): it stays,
and the SQL files' reading and applying live in :mod:`kb_rerank.db.layer`."""

from kb_rerank.db.layer import run_versioned  # noqa: F401 - the frozen revisions' one call
