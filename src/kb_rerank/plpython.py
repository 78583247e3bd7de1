"""``kb.rerank_search``: the search flow of ``POST /v1/kb/search/rerank`` run inside a
PostgreSQL backend by PL/Python (``plpython3u``; the function is in
``endpoints/search/sql/rerank_search.sql``, docs/sql.md).

The same code as the service, not a copy: the request is parsed by
:func:`kb_rerank.endpoints.parse.rerank_request` (the same bounds and messages), the answer is
made by :class:`~kb_rerank.endpoints.search.flow.SearchFlow` run by
:class:`~kb_rerank.endpoints.runner.Pipeline` (cache lookup, query embedding, the retrieval
spec, the pair cache, the scoring and its budget, the fallback rule, the record step), and
returned as the rows of ``flow.answer``.

The database side is the caller's own transaction, through SPI (:class:`SpiConnection`), not a
loopback connection: the store functions' SQL runs as the caller's role, under its tenant and
RLS, in its snapshot, with no credential to hold and no second session to deadlock with. The
parameters are bound by psycopg on the client side (its literal quoting, the adapters the
service's connections use: pgvector, Jsonb) and the rows come back through psycopg's loaders,
so the store functions see the types they see over a connection. A tenant transaction is a
subtransaction (a savepoint): all of it or none.

Per backend (module globals of the PL/Python interpreter): the settings, read once from the
server's environment (``KB_*``: the model comes from there, never from the caller), the
embedder, the cross-encoder (loaded at the first call) and one event loop.

What differs from HTTP, each for a reason:
* no claim across processes (``KB_SHARED_SINGLE_FLIGHT``): a claim written in the caller's
  transaction is invisible to the other processes until it commits;
* a per-tenant SQL reader (``kb_sql_reader``: read only) computes every answer and writes
  nothing (no cache row, pair score or audit row): a reader that could write cache rows could
  plant answers the service serves to its tenant;
* no per-tenant rate limits (the service's buckets live in its processes): a SQL caller is
  bounded by the request's bounds, the rerank budget and ``statement_timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import uuid
from types import SimpleNamespace
from typing import Any, Iterable

import msgspec
from psycopg import adapters as _global_adapters
from psycopg._queries import PostgresClientQuery
from psycopg.adapt import AdaptersMap, Transformer
from psycopg.pq import Format
from psycopg.types import TypeInfo

from kb_rerank.core.settings import Settings
from kb_rerank.endpoints import parse
from kb_rerank.endpoints.runner import Pipeline
from kb_rerank.endpoints.search.flow import SearchFlow

# The columns of kb.rerank_search, in order (endpoints/search/sql/rerank_search.sql declares them).
COLUMNS = ("rank", "chunk_id", "doc_id", "doc_title", "snippet", "rerank_score", "fused_score", "scored_by",
           "ranked_by", "model", "from_cache", "fallback_reason", "partial_reason", "trace_id")


class SpiCursor:
    def __init__(self, rows: list[tuple], rowcount: int) -> None:
        self._rows, self.rowcount = rows, rowcount

    async def fetchone(self):
        return self._rows[0] if self._rows else None

    async def fetchall(self):
        return self._rows


class SpiConnection:
    """The calls the store functions make on an async psycopg connection (``execute``,
    ``transaction``), run through ``plpy`` in the calling transaction."""

    def __init__(self, plpy) -> None:
        self._plpy = plpy
        adapters = AdaptersMap(_global_adapters)
        context = SimpleNamespace(adapters=adapters, connection=None)
        from pgvector.psycopg.vector import register_vector_info

        row = plpy.execute("select t.oid, t.typarray from pg_catalog.pg_type t where t.oid = 'public.vector'::regtype")[0]
        register_vector_info(context, TypeInfo("vector", row["oid"], row["typarray"]))
        self._tx = Transformer(context)
        self._elements: dict[int, int] = {}  # array type oid -> element type oid

    async def execute(self, query, params=None, prepare=None) -> SpiCursor:
        bound = PostgresClientQuery(self._tx)
        bound.convert(query, params)
        result = self._plpy.execute(bound.query.decode("utf-8"))
        names, oids = (result.colnames(), result.coltypes()) if result.status() > 0 and result.colnames() else ([], [])
        if len(set(names)) != len(names):
            raise ValueError(f"a statement run through SPI returns two columns of one name: {names}")
        rows = [tuple(self._load(r[n], oid) for n, oid in zip(names, oids)) for r in result]
        return SpiCursor(rows, result.nrows())

    @contextlib.asynccontextmanager
    async def transaction(self):
        with self._plpy.subtransaction():
            yield self

    def _load(self, value: Any, oid: int) -> Any:
        """A value as psycopg would return it: PL/Python gives the text form of types it does
        not convert itself (uuid, jsonb, vector, timestamps), a list for an array."""
        if value is None:
            return None
        if isinstance(value, list):
            elem = self._element(oid)
            return [self._load(v, elem) for v in value]
        if isinstance(value, str):
            return self._tx.get_loader(oid, Format.TEXT).load(value.encode("utf-8"))
        return value  # bool, int, float, Decimal, bytes: what psycopg gives too

    def _element(self, oid: int) -> int:
        if oid not in self._elements:
            plan = self._plpy.prepare("select typelem from pg_catalog.pg_type where oid = $1", ["oid"])
            self._elements[oid] = self._plpy.execute(plan, [oid])[0]["typelem"]
        return self._elements[oid]


class SpiPool:
    """``pool.connection()`` of the runner: the one SPI connection."""

    def __init__(self, conn: SpiConnection) -> None:
        self._conn = conn

    @contextlib.asynccontextmanager
    async def connection(self):
        yield self._conn


class SqlPipeline(Pipeline):
    """The runner inside a backend: no claim across processes, and nothing written for a
    read-only caller (see the module's notes)."""

    read_only = False

    def _claim(self, flow):
        return None

    async def record(self, *args, **kwargs) -> None:
        if not self.read_only:
            await super().record(*args, **kwargs)


class _Backend:
    """What one backend keeps between calls."""

    def __init__(self, plpy) -> None:
        from kb_rerank.app import build_embedders, build_reranker

        self.settings = Settings.from_env(dict(os.environ))
        self.loop = asyncio.new_event_loop()
        self.conn = SpiConnection(plpy)
        # one embedder: a backend serves one call at a time
        embedder = build_embedders(self.settings.with_(embed_workers=1))
        self.reranker = build_reranker(self.settings)
        self.loop.run_until_complete(self.reranker.ensure_loaded_async())
        self.pipeline = SqlPipeline(self.settings, SpiPool(self.conn), embedder, self.reranker)


_backend: _Backend | None = None


def backend(plpy) -> _Backend:
    global _backend
    if _backend is None:
        _backend = _Backend(plpy)
    else:
        _backend.conn._plpy = plpy
    return _backend


class BadRequest(ValueError):
    """A caller's mistake, said in plain words naming the argument."""


def _request(settings: Settings, query: Any, source: Any, top_n: Any, filter: Any):
    from kb_rerank.http.body import ApiError

    body: dict[str, Any] = {"query": query, "source": source}
    if top_n is not None:
        body["top_n"] = top_n
    if filter is not None:
        body["filter"] = json.loads(filter) if isinstance(filter, str) else filter
    try:
        return parse.rerank_request(json.dumps(body).encode("utf-8"), settings)
    except ApiError as exc:
        field, detail = exc.payload.get("field"), exc.payload.get("detail") or exc.payload.get("error")
        raise BadRequest(f"kb.rerank_search: {detail}" + (f" (argument {field})" if field else "")) from None


def rerank_search(plpy, query: Any, source: Any, top_n: Any, filter: Any) -> Iterable[tuple]:
    """The rows of ``kb.rerank_search``: the API's answer for the caller's tenant (none
    without a tenant)."""
    row = plpy.execute("select kb.current_tenant()::text as t,"
                       " pg_catalog.pg_has_role(session_user, 'kb_sql_reader', 'MEMBER') as reader")[0]
    if row["t"] is None:
        return []
    tenant = uuid.UUID(row["t"])
    b = backend(plpy)
    req = _request(b.settings, query, source, top_n, filter)
    pipeline = b.pipeline
    pipeline.read_only = bool(row["reader"])
    flow = pipeline.flow(SearchFlow, req)
    if pipeline.read_only:
        flow.decode = lambda payload: None  # computed, never read from the cache it does not write
    trace_id = uuid.uuid4().hex
    served = b.loop.run_until_complete(pipeline.run(flow, tenant, trace_id))
    answer = flow.answer(served, trace_id)
    return [
        (i + 1, r.chunk_id, r.doc_id, r.doc_title, r.snippet, r.rerank_score,
         None if r.fused_score is msgspec.UNSET else r.fused_score, r.scored_by, answer.ranked_by, answer.model,
         answer.from_cache, answer.fallback_reason, answer.partial_reason, trace_id)
        for i, r in enumerate(answer.results)
    ]
