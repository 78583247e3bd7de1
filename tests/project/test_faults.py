"""Faults: PostgreSQL stopped under load (a separate embedded server, so the session's is
not disturbed), a failing cross-encoder (what tests/endpoints/test_rerank_route.py::test_19 does not cover),
requests cancelled mid-flight, and hand-corrupted cache rows."""

from __future__ import annotations

import asyncio
import contextlib
import math
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import psycopg_pool
import pytest
from litestar.testing import TestClient

from kb_rerank.endpoints.runner import Pipeline
from kb_rerank.endpoints.search.flow import SearchFlow
from kb_rerank.endpoints.requests import RerankRequest
from kb_rerank.db import database as db
from kb_rerank.app import create_app
from kb_rerank.core.query import normalize_query, query_hash, query_hash_key
from kb_rerank.core.settings import Settings

from tests.helpers import app_search_key
from tests.live_server import (
    OPS, OPS_TOKEN, SECRET, URL, FakeReranker, advisory_locks, bearer, busy_app_backends, ingest_small_tenant,
    metric_values, serve_in_thread, wait_until,
)
from kb_rerank.core import session


def _cache_audit(owner_conn, tenant, query, app, source="hybrid_lexical_semantic"):
    qh = app_search_key(app, normalize_query(query), source)
    cache = owner_conn.execute("select trace_id, results_jsonb from kb.kb_rerank_cache"
                               " where tenant_id = %s and query_hash = %s and source = %s", [tenant, qh, source]).fetchall()
    audit = owner_conn.execute("select kind, severity, detail, trace_id from kb.kb_rerank_audit"
                               " where tenant_id = %s and query_hash = %s order by seq", [tenant, qh]).fetchall()
    return cache, audit


# --------------------------------------------------------------------------- (a) database stopped under load


@pytest.fixture(scope="module")
def own_server(embedder, tmp_path_factory):
    """A separate embedded PostgreSQL, migrated, with two small tenants."""
    data = Path(tempfile.mkdtemp(prefix="kbfault-", dir="/tmp"))
    pg = Settings(data_dir=data, database_name="kb_fault")
    url = db.start_embedded(pg)
    try:
        s = Settings(database_url=url)
        db.migrate(s)
        tenants = [uuid.uuid4(), uuid.uuid4()]
        with psycopg.connect(db.app_url(s)) as conn:
            session.configure_connection(conn)
            for i, t in enumerate(tenants):
                ingest_small_tenant(conn, t, embedder, s, tmp_path_factory.mktemp("fault-docs"), flavour=f"f{i}")
        yield pg, s, tenants
    finally:
        db.stop_embedded(pg)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow
def test_database_stopped_under_load_fails_fast_and_recovers(own_server, embedder):
    pg, s, tenants = own_server
    db_timeout = 1.5
    # no limits (the rate and the per-tenant retrieval slots): this is about the database's
    # faults, and three clients of a tenant in a tight loop would queue behind one slot
    app = create_app(s.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, db_timeout_s=db_timeout, statement_timeout_ms=2000,
                             rate_limit_per_minute=0, tenant_retrieval_slots=0),
                     reranker=FakeReranker(), embedder=embedder)
    records: list[dict] = []
    marks: dict[str, float] = {}

    async def client(i, base, stop_at):
        n = 0
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            while time.monotonic() < stop_at and "end" not in marks:
                n += 1
                tenant = tenants[i % 2]
                q = f"fault run {i} {n} recurring invoice" if n % 3 else "fault repeated export csv"
                src = ("hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation")[n % 4]
                t0 = time.monotonic()
                r = await c.post(URL, json={"query": q, "source": src}, headers=bearer(tenant))
                records.append({"start": t0, "end": time.monotonic(), "status": r.status_code, "body": r.json(),
                                "headers": r.headers, "tenant": tenant})
                await asyncio.sleep(0.02)

    async def scenario(base):
        stop_at = time.monotonic() + 60
        clients = [asyncio.create_task(client(i, base, stop_at)) for i in range(6)]
        async with httpx.AsyncClient(base_url=base, timeout=30) as c:
            await asyncio.sleep(2.0)
            assert (await c.get("/readyz")).status_code == 200
            marks["stop"] = time.monotonic()
            await asyncio.to_thread(db.stop_embedded, pg)
            marks["stopped"] = time.monotonic()
            ready = await c.get("/readyz", headers=OPS)
            marks["readyz_down"] = ready.status_code
            marks["readyz_down_body"] = ready.json()
            await asyncio.sleep(3.0)
            marks["restart"] = time.monotonic()
            url = await asyncio.to_thread(db.start_embedded, pg)
            marks["same_url"] = url == s.database_url
            marks["started"] = time.monotonic()
            # recovery: the first fresh request answered 200, and /readyz 200 again
            while time.monotonic() - marks["started"] < 15:
                r = await c.post(URL, json={"query": f"recovery probe {time.monotonic()}"}, headers=bearer(tenants[0]))
                if r.status_code == 200 and (await c.get("/readyz")).status_code == 200:
                    marks["recovered"] = time.monotonic()
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(3.0)
        marks["end"] = time.monotonic()
        await asyncio.gather(*clients)  # they finish their last request: every answer is recorded

    with serve_in_thread(app) as base:
        asyncio.run(scenario(base))
        settled = wait_until(lambda: metric_values(httpx.get(base + "/metrics", headers=OPS).text)["kb_rerank_inflight_keys"] == 0, 10)

    assert marks["same_url"]
    assert marks["readyz_down"] == 503 and marks["readyz_down_body"]["database"] == "unavailable"
    statuses = {r["status"] for r in records}
    assert statuses <= {200, 503}, statuses
    failed = [r for r in records if r["status"] == 503]
    assert failed, "no request ran while the database was down"
    for r in failed:
        assert r["body"] == {"error": "database_unavailable"} and r["headers"]["retry-after"]
        # fail fast: no request waits much beyond the pool timeout
        assert r["end"] - r["start"] <= db_timeout + 1.5, r["end"] - r["start"]
    assert "recovered" in marks, "the service did not recover within 15 s of the database restart"
    recovery = marks["recovered"] - marks["started"]
    # requests that start once a leader in flight at the restart has ended (it fails within the
    # pool timeout, and a follower fails with its leader: single flight, no herd on a down
    # database) are all answered
    after = [r for r in records if r["start"] > marks["recovered"] + db_timeout]
    print(f"\nFAULT db: {len(records)} requests, {len(failed)} answered 503 while down "
          f"(slowest {max(r['end'] - r['start'] for r in failed):.2f}s, timeout {db_timeout}s); "
          f"pg stopped for {marks['started'] - marks['stop']:.1f}s; recovered {recovery:.2f}s after restart; "
          f"{len(after)} requests after recovery, statuses {sorted({r['status'] for r in after})}")
    assert recovery <= 5.0
    assert after and all(r["status"] == 200 for r in after)
    assert settled, "the single-flight map did not empty after the load stopped"

    # no half-written request: each cache row has the served audit row of the same request
    with psycopg.connect(s.database_url, autocommit=True) as owner:
        orphans = owner.execute(
            "select c.tenant_id, c.query_hash, c.source, c.trace_id from kb.kb_rerank_cache c"
            " where c.tenant_id = any(%s) and not exists (select 1 from kb.kb_rerank_audit a"
            "  where a.tenant_id = c.tenant_id and a.trace_id = c.trace_id and a.kind = 'served'"
            "  and a.query_hash = c.query_hash and a.source = c.source)", [tenants]).fetchall()
        assert orphans == []
        ok_per_tenant = {t: sum(1 for r in records if r["status"] == 200 and r["tenant"] == t) for t in tenants}
        for t, rows, a, b, reason in owner.execute("select * from kb.audit_verify()"):
            assert (a, b, reason) == (None, None, None)
            # every 200 wrote its audit row; 503s wrote none (the probes are tenant 0's extra rows)
            if t == tenants[1]:
                assert rows == ok_per_tenant[t]
        assert advisory_locks(owner, "kb_fault") == []


# --------------------------------------------------------------------------- (b) model faults not in test_rerank_route


class BadScores(FakeReranker):
    def __init__(self, make):
        super().__init__()
        self.make = make

    async def ascore(self, query, passages):
        self.calls += 1
        return self.make(len(passages))


class HangsForever(FakeReranker):
    async def ascore(self, query, passages):
        self.calls += 1
        await asyncio.Event().wait()


class BlocksThenNaN(FakeReranker):
    async def ascore(self, query, passages):
        self.calls += 1
        await asyncio.sleep(0.3)
        return [math.nan] * len(passages)


BAD = {
    "inf": (lambda n: [math.inf] * n, "invalid_scores"),
    "minus_inf": (lambda n: [-math.inf] * n, "invalid_scores"),
    "nan_one": (lambda n: [0.5] * (n - 1) + [math.nan], "invalid_scores"),
    "above_one": (lambda n: [1.5] * n, "invalid_scores"),
    "negative": (lambda n: [-0.1] * n, "invalid_scores"),
    "too_few": (lambda n: [0.5] * (n - 1), "invalid_scores"),
    "too_many": (lambda n: [0.5] * (n + 1), "invalid_scores"),
    "none": (lambda n: None, "invalid_scores"),
    "strings": (lambda n: ["high"] * n, "invalid_scores"),
    "nan_strings": (lambda n: ["nan"] * n, "invalid_scores"),
}


@pytest.mark.parametrize("kind", [*BAD, "hangs_forever"])
def test_model_bad_output_falls_back_nan_never_reaches_a_response(kind, settings, embedder, sample_tenant, owner_conn):
    rr = HangsForever() if kind == "hangs_forever" else BadScores(BAD[kind][0])
    reason = "model_timeout" if kind == "hangs_forever" else BAD[kind][1]
    query = f"model fault {kind}: recurring invoices"
    app = create_app(settings.with_(jwt_secret=SECRET, rerank_timeout_s=0.3, rate_limit_per_minute=0),
                     reranker=rr, embedder=embedder)
    with TestClient(app) as client:
        t0 = time.monotonic()
        r = client.post(URL, json={"query": query}, headers=bearer(sample_tenant))
        assert time.monotonic() - t0 < 10
        assert r.status_code == 200, r.text
        for token in ("NaN", "Infinity", "nan", "inf"):
            assert token not in r.text.replace("information", "").replace("invoice", "")
        body = r.json()
        assert body["fallback"] is True and body["fallback_reason"] == reason and r.headers["x-kb-fallback"] == reason
        # no relevance from a model that gave none: the first stage's score, said to be one
        assert body["results"] and all(x["rerank_score"] is None and x["scored_by"] == "fused"
                                       and isinstance(x["fused_score"], float) and math.isfinite(x["fused_score"])
                                       for x in body["results"])
    cache, audit = _cache_audit(owner_conn, sample_tenant, query, app)
    assert cache == [] and [(a[0], a[1], a[2]) for a in audit] == [("fallback", 2, reason)]


def test_concurrent_identical_requests_share_one_failing_model_call(settings, embedder, sample_tenant, owner_conn):
    rr = BlocksThenNaN()
    query = "model fault: concurrent identical requests"
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0),
                     reranker=rr, embedder=embedder)
    with TestClient(app) as client:
        async def burst():
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as ac:
                return await asyncio.gather(*[ac.post(URL, json={"query": query}, headers=bearer(sample_tenant))
                                              for _ in range(5)])

        responses = client.blocking_portal.call(burst)
    assert [r.status_code for r in responses] == [200] * 5
    assert rr.calls == 1
    assert all(r.json()["fallback_reason"] == "invalid_scores" for r in responses)
    cache, audit = _cache_audit(owner_conn, sample_tenant, query, app)
    assert cache == []
    assert sorted((a[0], a[1], a[2]) for a in audit) == (
        [("fallback", 2, "invalid_scores")] + [("fallback", 2, "invalid_scores;single_flight")] * 4)
    assert len({a[3] for a in audit}) == 5  # each request audited under its own trace id


# --------------------------------------------------------------------------- (c) cancelled requests


def _clean(owner_conn, base):
    dbname = owner_conn.info.dbname
    m = metric_values(httpx.get(base + "/metrics", headers=OPS).text)
    return (m["kb_rerank_inflight_keys"] == 0 and m["kb_rerank_db_pool_available"] == m["kb_rerank_db_pool_size"]
            and m["kb_rerank_db_pool_waiting"] == 0 and not busy_app_backends(owner_conn, dbname)
            and not advisory_locks(owner_conn, dbname))


@pytest.mark.slow
def test_client_disconnect_and_cancellation_leave_nothing_behind(settings, embedder, sample_tenant, owner_conn):
    rr = FakeReranker(delay_s=1.0)
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0),
                     reranker=rr, embedder=embedder)
    with serve_in_thread(app) as base:
        # 1) clients that give up (read timeout: the connection is closed) mid-request
        async def impatient():
            async with httpx.AsyncClient(base_url=base, timeout=0.2) as c:
                async def one(i):
                    with contextlib.suppress(httpx.TimeoutException):
                        await c.post(URL, json={"query": f"impatient {i % 3} invoices"}, headers=bearer(sample_tenant))
                await asyncio.gather(*[one(i) for i in range(9)])

        asyncio.run(impatient())
        assert wait_until(lambda: _clean(owner_conn, base), 10)

        # 2) tasks cancelled at every stage: in the model call, and inside the audit
        #    transaction while it waits for the tenant's audit lock
        pipe = app.state.pipeline

        async def cancel_at(delay, query):
            flow = pipe.flow(SearchFlow, RerankRequest(query=query, source="hybrid_lexical_semantic"))
            task = asyncio.ensure_future(pipe.run(flow, sample_tenant, uuid.uuid4().hex))
            await asyncio.sleep(delay)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return task.cancelled()

        def run_in_app(coro_fn, *args):
            fut = asyncio.run_coroutine_threadsafe(coro_fn(*args), _server_loop(app))
            return fut.result(30)

        for delay in (0.0, 0.01, 0.05, 0.2, 0.6):
            run_in_app(cancel_at, delay, f"cancelled at {delay} export csv")
        # the tenant's audit lock is its kb.audit_heads row (no advisory key); the
        # owner (superuser in tests) holds it
        with psycopg.connect(settings.database_url) as locker:
            locker.execute(  # the head row, as kb.audit_append starts it when missing
                "insert into kb.audit_heads (tenant_id, seq, row_hash) select %(t)s, coalesce(max(seq), 0),"
                " coalesce((array_agg(row_hash order by seq desc))[1], repeat('0', 64)) from kb.kb_rerank_audit"
                " where tenant_id = %(t)s on conflict (tenant_id) do nothing", {"t": sample_tenant})
            assert locker.execute("select 1 from kb.audit_heads where tenant_id = %s for update",
                                  [sample_tenant]).fetchone() == (1,)
            cancelled = run_in_app(cancel_at, 1.6, "cancelled waiting for the audit lock")
            assert cancelled
            locker.rollback()
        assert wait_until(lambda: _clean(owner_conn, base), 10), (
            busy_app_backends(owner_conn, owner_conn.info.dbname), advisory_locks(owner_conn, owner_conn.info.dbname))
        # nothing half-written for the cancelled requests, and the key still works
        cache, audit = _cache_audit(owner_conn, sample_tenant, "cancelled waiting for the audit lock", app)
        assert cache == [] and audit == []
        r = httpx.post(base + URL, json={"query": "cancelled waiting for the audit lock"},
                       headers=bearer(sample_tenant), timeout=30)
        assert r.status_code == 200 and r.json()["from_cache"] is False
        assert _clean(owner_conn, base)


def _server_loop(app):
    return app.state.test_server_loop


# --------------------------------------------------------------------------- (d) corrupted cache rows


CORRUPT = {
    "not_a_list": '{"x": 1}',
    "score_above_one": None,  # filled from the real row
    "score_negative": None,
    "score_string": None,
    "extra_field": None,
    "duplicate_chunks": None,
    "too_many": None,
}


@pytest.mark.parametrize("kind", list(CORRUPT))
def test_corrupted_cache_row_is_a_miss_and_replaced(kind, settings, embedder, sample_tenant, owner_conn):
    query = f"corrupt cache {kind}: payment reminders"
    rr = FakeReranker()
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0),
                     reranker=rr, embedder=embedder)
    with TestClient(app) as client:
        first = client.post(URL, json={"query": query}, headers=bearer(sample_tenant)).json()
        assert first["from_cache"] is False and first["results"]
        import json
        res = first["results"]
        bad = {
            "not_a_list": {"x": 1},
            "score_above_one": [{**res[0], "rerank_score": 5.0}] + res[1:],
            "score_negative": [{**res[0], "rerank_score": -1}] + res[1:],
            "score_string": [{**res[0], "rerank_score": "NaN"}] + res[1:],
            "extra_field": [{**res[0], "leak": "other tenant"}] + res[1:],
            "duplicate_chunks": [res[0], res[0]],
            "too_many": res * 2,
        }[kind]
        qh = app_search_key(app, normalize_query(query))
        n = owner_conn.execute("update kb.kb_rerank_cache set results_jsonb = %s::jsonb"
                               " where tenant_id = %s and query_hash = %s and source = 'hybrid_lexical_semantic'",
                               [json.dumps(bad), sample_tenant, qh]).rowcount
        assert n == 1
        calls = rr.calls
        again = client.post(URL, json={"query": query}, headers=bearer(sample_tenant))
        assert again.status_code == 200
        body = again.json()
        # a miss: recomputed from the candidates (their scores come from the pair-score cache,
        # so the model is not called again)
        assert body["from_cache"] is False and rr.calls == calls
        assert body["results"] == first["results"]
        third = client.post(URL, json={"query": query}, headers=bearer(sample_tenant)).json()
        assert third["from_cache"] is True and third["results"] == first["results"]
    cache, audit = _cache_audit(owner_conn, sample_tenant, query, app)
    assert len(cache) == 1 and cache[0][1]["results"] == first["results"] and cache[0][0] == body["trace_id"]
    assert [a[0] for a in audit] == ["served", "served", "cache_hit"]


class _DownPool:
    """A pool whose every checkout times out (the database is down), counting checkouts."""

    def __init__(self) -> None:
        self.checkouts = 0

    @contextlib.asynccontextmanager
    async def connection(self):
        self.checkouts += 1
        await asyncio.sleep(0.2)
        raise psycopg_pool.PoolTimeout("couldn't get a connection after 0.20 sec")
        yield  # pragma: no cover


def test_single_flight_followers_fail_with_the_leader_without_a_second_wait(settings):
    """Identical requests that wait for a leader whose database is unavailable fail with the
    leader's error when it does: they do not each wait out another pool timeout."""
    pool = _DownPool()
    svc = Pipeline(settings, pool, embedder=None, reranker=None)

    def flow():
        return svc.flow(SearchFlow, RerankRequest(query="same query", source="lexical_only"))

    async def scenario():
        leader = asyncio.create_task(svc.run(flow(), uuid.UUID(int=1), "t0"))
        await asyncio.sleep(0.05)  # the leader is registered and waiting on the pool
        followers = [asyncio.create_task(svc.run(flow(), uuid.UUID(int=1), f"t{i}"))
                     for i in range(1, 4)]
        return await asyncio.gather(leader, *followers, return_exceptions=True)

    results = asyncio.run(scenario())
    assert all(isinstance(r, psycopg_pool.PoolTimeout) for r in results), results
    assert pool.checkouts == 1  # only the leader asked the pool
    assert svc.inflight == 0
