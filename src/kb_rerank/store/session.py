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
