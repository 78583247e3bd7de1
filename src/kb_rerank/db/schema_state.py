"""What a database says of its schema: the applied Alembic revision
(public.kb_alembic_version) and the version of the idempotent SQL layer
(``kb.schema_layer_version()``, written by :func:`kb_rerank.db.layer.apply_idempotent`).

Read by the migration environment (is the layer to re-apply?) and by ``/readyz`` (is the
database at this code's head and layer?). Each read is one function here; the ``a``-prefixed
one is the same SQL on an async connection (the request path's pool). Neither needs a
tenant: both run outside a tenant transaction.
"""

from __future__ import annotations

# Two statements each: the function or table is looked up first, so that a database without
# it answers None instead of an error (which would abort the caller's transaction).
REVISION_TABLE = "select to_regclass('public.kb_alembic_version') is not null"
REVISION = "select version_num from public.kb_alembic_version"
LAYER_FUNCTION = "select to_regprocedure('kb.schema_layer_version()') is not null"
LAYER_VERSION = "select kb.schema_layer_version()"


def layer_version(conn) -> str | None:
    """The layer version recorded in the database, or None when none is (a database
    migrated before the layer carried a version, or not migrated)."""
    if not conn.execute(LAYER_FUNCTION).fetchone()[0]:
        return None
    return conn.execute(LAYER_VERSION).fetchone()[0]


async def alayer_version(conn) -> str | None:
    """:func:`layer_version` on an async connection."""
    cur = await conn.execute(LAYER_FUNCTION)
    if not (await cur.fetchone())[0]:
        return None
    cur = await conn.execute(LAYER_VERSION)
    return (await cur.fetchone())[0]


def revision(conn) -> str | None:
    """The applied Alembic revision, or None (no version table, or an empty one)."""
    if not conn.execute(REVISION_TABLE).fetchone()[0]:
        return None
    row = conn.execute(REVISION).fetchone()
    return row[0] if row else None


async def arevision(conn) -> str | None:
    """:func:`revision` on an async connection."""
    cur = await conn.execute(REVISION_TABLE)
    if not (await cur.fetchone())[0]:
        return None
    cur = await conn.execute(REVISION)
    row = await cur.fetchone()
    return row[0] if row else None
