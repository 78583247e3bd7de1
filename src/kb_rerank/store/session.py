"""The tenant transaction: every SQL call of the request path runs inside one, whose first
statement sets ``auth.tenant_id`` for that transaction only (row-level security reads it)."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator, Iterator
from uuid import UUID

import psycopg


SET_TENANT = "select set_config('auth.tenant_id', %s, true)"


@contextlib.contextmanager
def tenant_transaction(conn: psycopg.Connection, tenant_id: UUID | str) -> Iterator[psycopg.Connection]:
    """A transaction whose first statement sets ``auth.tenant_id`` for that transaction only."""
    with conn.transaction():
        conn.execute(SET_TENANT, [str(UUID(str(tenant_id)))])
        yield conn


@contextlib.asynccontextmanager
async def atenant_transaction(conn: psycopg.AsyncConnection, tenant_id: UUID | str) -> AsyncIterator[psycopg.AsyncConnection]:
    async with conn.transaction():
        await conn.execute(SET_TENANT, [str(UUID(str(tenant_id)))])
        yield conn


def configure_connection(conn: psycopg.Connection) -> None:
    from pgvector.psycopg import register_vector

    register_vector(conn)


async def aconfigure_connection(conn: psycopg.AsyncConnection) -> None:
    from pgvector.psycopg import register_vector_async

    await register_vector_async(conn)


class _AwaitedCursor:
    def __init__(self, cur) -> None:
        self._cur = cur

    async def fetchall(self):
        return self._cur.fetchall()

    async def fetchone(self):
        return self._cur.fetchone()


class AwaitedConnection:
    """A synchronous connection seen through the awaited calls of the request path's store
    functions (``await conn.execute(...)``, ``await cur.fetchall()``), so that the CLI and the
    eval read with the very functions the service uses (:func:`run_awaited`)."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    async def execute(self, query, params=None) -> _AwaitedCursor:
        return _AwaitedCursor(self._conn.execute(query, params))


def run_awaited(coro):
    """Run a coroutine that awaits only :class:`AwaitedConnection` calls (which never suspend)
    to its end, without an event loop (the caller may run inside one)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a store function awaited something other than the synchronous connection")
