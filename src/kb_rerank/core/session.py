"""The tenant transaction: every SQL call of the request path runs inside one, whose first
statement sets ``auth.tenant_id`` for that transaction only (row-level security reads it).

The store functions (retrieval, caches, audit, guard reviews, curation, documents) are async
only. The CLI, ingestion and the eval hold synchronous connections: they open the tenant
transaction with :func:`tenant_transaction` and call a store function through :func:`run`,
the one sync bridge."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, AsyncIterator, Iterator
from uuid import UUID

import psycopg

if TYPE_CHECKING:
    from kb_rerank.core.settings import Settings


SET_TENANT = "select set_config('auth.tenant_id', %s, true)"


@contextlib.contextmanager
def tenant_transaction(conn: psycopg.Connection, tenant_id: UUID | str) -> Iterator[psycopg.Connection]:
    """A transaction whose first statement sets ``auth.tenant_id`` for that transaction only
    (the sync bridge's: :func:`atenant_transaction` on the service's connections)."""
    with conn.transaction():
        conn.execute(SET_TENANT, [str(UUID(str(tenant_id)))])
        yield conn


@contextlib.asynccontextmanager
async def atenant_transaction(conn: psycopg.AsyncConnection, tenant_id: UUID | str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with conn.transaction():
        await conn.execute(SET_TENANT, [str(UUID(str(tenant_id)))])
        yield conn


# psycopg prepares a query server-side once it has run this many times on a connection (its
# default); None disables it (KB_PREPARED_STATEMENTS off).
PREPARE_THRESHOLD = 5


def prepare_threshold(settings: "Settings | None") -> int | None:
    """The connection's ``prepare_threshold``: psycopg's default when KB_PREPARED_STATEMENTS is
    on, else None. A transaction pooler (PgBouncer ``pool_mode=transaction`` before 1.21)
    gives each transaction any server connection: a statement prepared on one is missing on
    the next ("prepared statement ... does not exist"), so nothing is prepared unless the
    setting says the path allows it. No settings (tests, tools): off."""
    return PREPARE_THRESHOLD if settings is not None and settings.prepared_statements else None


def configure_connection(conn: psycopg.Connection, settings: "Settings | None" = None) -> None:
    """Per-connection set-up, client side only: the pgvector type and whether psycopg may
    prepare statements. Nothing is SET on the server session: behind a transaction pooler
    the session is not this connection's (every server-side setting of the request path is
    per transaction: set_config(..., true))."""
    from pgvector.psycopg import register_vector

    conn.prepare_threshold = prepare_threshold(settings)
    register_vector(conn)


async def aconfigure_connection(conn: psycopg.AsyncConnection, settings: "Settings | None" = None) -> None:
    """:func:`configure_connection` of the service's pool connections."""
    from pgvector.psycopg import register_vector_async

    conn.prepare_threshold = prepare_threshold(settings)
    await register_vector_async(conn)


class _AwaitedCursor:
    """A synchronous cursor seen through the awaited calls of an async one."""

    def __init__(self, cur) -> None:
        self._cur = cur

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    @property
    def description(self):
        return self._cur.description

    async def execute(self, query, params=None) -> "_AwaitedCursor":
        self._cur.execute(query, params)
        return self

    async def fetchall(self):
        return self._cur.fetchall()

    async def fetchone(self):
        return self._cur.fetchone()

    def __aiter__(self):
        self._rows = iter(self._cur)  # a server-side cursor fetches its rows in batches
        return self

    async def __anext__(self):
        try:
            return next(self._rows)
        except StopIteration:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> "_AwaitedCursor":
        self._cur.__enter__()
        return self

    async def __aexit__(self, *exc) -> None:
        self._cur.__exit__(*exc)


class AwaitedConnection:
    """A synchronous connection seen through the awaited calls of the store functions
    (``await conn.execute(...)``, ``await cur.fetchall()``, ``async for row in cur``), so that
    the CLI, ingestion and the eval run the very functions the service uses (:func:`run`)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    @property
    def autocommit(self) -> bool:
        return self._conn.autocommit

    @property
    def prepare_threshold(self) -> int | None:
        return self._conn.prepare_threshold

    async def execute(self, query, params=None, *, prepare: bool | None = None) -> _AwaitedCursor:
        return _AwaitedCursor(self._conn.execute(query, params, prepare=prepare))

    def cursor(self, *args, **kw) -> _AwaitedCursor:
        return _AwaitedCursor(self._conn.cursor(*args, **kw))


def run_awaited(coro):
    """Run a coroutine that awaits only :class:`AwaitedConnection` calls (which never suspend)
    to its end, without an event loop (the caller may run inside one)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a store function awaited something other than the synchronous connection")


def run(conn, fn, *args, **kw):
    """The sync bridge: call the async store function ``fn(conn, *args, **kw)`` on the
    synchronous connection ``conn`` (in the caller's transaction) and return its result."""
    if not isinstance(conn, AwaitedConnection):
        conn = AwaitedConnection(conn)
    return run_awaited(fn(conn, *args, **kw))
