"""Reading and applying the SQL files under sql/.

sql/schema/NNNN_*.sql are versioned (each run once by its Alembic revision);
sql/functions, sql/policies and sql/views are idempotent and re-applied, in that order
and by file name, once at the end of every upgrade run (migrations/env.py).
"""

from __future__ import annotations

from pathlib import Path

from .db import SQL_DIR

IDEMPOTENT_DIRS = ("functions", "policies", "views")


def render(path: Path, *, embedding_dim: int) -> str:
    if not isinstance(embedding_dim, int) or not 0 < embedding_dim <= 16000:
        raise ValueError(f"embedding_dim must be an integer in 1..16000, got {embedding_dim!r}")
    return path.read_text(encoding="utf-8").replace("{{embedding_dim}}", str(embedding_dim))


def versioned_file(name: str) -> Path:
    path = SQL_DIR / "schema" / name
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def idempotent_files() -> list[Path]:
    files: list[Path] = []
    for d in IDEMPOTENT_DIRS:
        files.extend(sorted((SQL_DIR / d).glob("*.sql")))
    return files


def execute_script(dbapi_conn, text: str) -> None:
    """Run a multi-statement script on a raw psycopg connection (no parameters, so no
    placeholder parsing: `%` and `:` in the SQL are left alone)."""
    dbapi_conn.execute(text)


def apply_versioned(dbapi_conn, name: str, *, embedding_dim: int) -> None:
    execute_script(dbapi_conn, render(versioned_file(name), embedding_dim=embedding_dim))


def apply_idempotent(dbapi_conn, *, embedding_dim: int, only: tuple[str, ...] | None = None) -> None:
    """Apply the idempotent files (all, or those whose path relative to sql/ is in ``only``,
    for a revision whose data step needs a function before the end of the upgrade)."""
    for path in idempotent_files():
        if only is not None and path.relative_to(SQL_DIR).as_posix() not in only:
            continue
        try:
            execute_script(dbapi_conn, render(path, embedding_dim=embedding_dim))
        except Exception as exc:
            raise RuntimeError(f"applying {path.relative_to(SQL_DIR.parent)} failed: {exc}") from exc
