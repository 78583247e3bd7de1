"""One tenant's filtered searches cannot hold the database from the others: while another
tenant is served, a tenant runs at most ``KB_TENANT_RETRIEVAL_SLOTS`` retrievals at once (the
next wait their turn, then 429 ``tenant_busy`` with Retry-After) and the other tenant's search is
served meanwhile; one client's filtered searches one after another are never refused; a
filter's price, charged before it runs, grows with its ranges and the tenant's documents.
(Another tenant's latency during a flood is measured by bench/filter_flood.py, not here.)"""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import psycopg
import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.core.session import tenant_transaction

from tests.live_server import SECRET, FakeReranker, bearer, serve_in_thread

URL = "/v1/kb/search/rerank"


def _ranges(n: int) -> dict:
    return {f"k{i}": {"$gte": "2024-01-01", "$lt": "2025-01-01"} for i in range(n)}


def _app(settings, embedder, **changes):
    return create_app(settings.with_(jwt_secret=SECRET, **changes), reranker=FakeReranker(), embedder=embedder)


def _tenant(app_url, documents: int) -> uuid.UUID:
    """A tenant of ``documents`` documents with 16 dated metadata keys (no chunks: a search
    reads the filter and finds nothing)."""
    t = uuid.uuid4()
    with psycopg.connect(app_url) as conn, tenant_transaction(conn, t):
        conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
            " select %s, 'd' || g || '.md', 'd', 'h',"
            "        (select jsonb_object_agg('k' || k, '2024-0' || (1 + (g + k) %% 9) || '-01')"
            "         from generate_series(0, 15) as k)"
            " from generate_series(1, %s) as g", [t, documents])
    return t


@pytest.fixture(scope="module")
def small(app_url):
    return _tenant(app_url, 30)


@pytest.fixture(scope="module")
def large(app_url):
    return _tenant(app_url, 3000)


@pytest.fixture
def slow_filters(monkeypatch):
    """A filtered retrieval holds its statement 0.6 s longer (a pg_sleep in its transaction),
    so that concurrent ones overlap."""
    from kb_rerank.endpoints import runner

    read = runner.read_spec

    async def slow(conn, spec, *args, **kw):
        if spec.filter:
            await conn.execute("select pg_sleep(0.6)")
        return await read(conn, spec, *args, **kw)

    monkeypatch.setattr(runner, "read_spec", slow)


async def _flood(base: str, a: uuid.UUID, b: uuid.UUID, n: int) -> tuple[list[httpx.Response], httpx.Response, list[str]]:
    """B searches once (the service is shared from then on); then A sends ``n`` filtered
    searches at once and B one more, a moment later. Returns A's answers, B's, and the order
    in which they finished."""
    done: list[str] = []
    async with httpx.AsyncClient(base_url=base, timeout=60) as client:
        first = await client.post(URL, json={"query": "how do I reset my password"}, headers=bearer(b))
        assert first.status_code == 200, first.text

        async def post(t, i, who):
            r = await client.post(URL, headers=bearer(t), json={
                "query": f"flood {who} {i} {uuid.uuid4().hex[:6]}", "source": "lexical_only",
                **({"filter": _ranges(16)} if who == "a" else {})})
            done.append(who)
            return r

        async def later():
            await asyncio.sleep(0.2)
            return await post(b, 0, "b")

        *flood, quiet = await asyncio.gather(*[post(a, i, "a") for i in range(n)], later())
    return flood, quiet, done


def test_concurrent_filtered_searches_beyond_the_cap_get_429_while_another_tenant_is_served(
        settings, embedder, small, slow_filters):
    a, b = small, uuid.uuid4()
    app = _app(settings, embedder, tenant_retrieval_slots=1, tenant_wait_s=0.2, rate_limit_per_minute=0)
    with serve_in_thread(app) as base:
        flood, quiet, _ = asyncio.run(_flood(base, a, b, 3))
    assert sorted(r.status_code for r in flood) == [200, 429, 429], [r.text for r in flood]
    for r in flood:
        if r.status_code == 429:
            assert r.json()["error"] == "tenant_busy" and r.json()["resource"] == "retrieval", r.text
            assert int(r.headers["retry-after"]) >= 1
    assert quiet.status_code == 200, quiet.text


def test_within_the_wait_they_take_turns_and_the_other_tenant_does_not_queue_behind(
        settings, embedder, small, slow_filters):
    """With a wait longer than the queue, A's searches all pass, one at a time; B's search,
    sent after them, is answered before A's last (it does not wait behind A's turn)."""
    a, b = small, uuid.uuid4()
    app = _app(settings, embedder, tenant_retrieval_slots=1, tenant_wait_s=10.0, rate_limit_per_minute=0)
    with serve_in_thread(app) as base:
        flood, quiet, done = asyncio.run(_flood(base, a, b, 3))
    assert [r.status_code for r in flood] == [200, 200, 200], [r.text for r in flood]
    assert quiet.status_code == 200 and done[-1] == "a", done


@pytest.mark.parametrize("shared", [False, True])
def test_one_clients_filtered_searches_one_after_another_are_never_refused(settings, embedder, large, shared):
    """Default limits. Alone, even a filter priced above the whole bucket is one token a
    request (work-conserving); with another tenant served, the default prices and one
    retrieval slot: a client that waits for each answer holds one slot and is never refused."""
    changes = {} if shared else {"rate_cost_per_filter_kdoc": 10.0}  # 16 ranges x 3 kdoc x 10: 480 > 300
    app = _app(settings, embedder, **changes)
    with TestClient(app) as client:
        if shared:
            r = client.post(URL, json={"query": "how do I reset my password"}, headers=bearer(uuid.uuid4()))
            assert r.status_code == 200, r.text
        for i in range(12):
            r = client.post(URL, json={"query": f"one after another {i} {uuid.uuid4().hex[:6]}",
                                       "source": "lexical_only", "filter": _ranges(16)}, headers=bearer(large))
            assert r.status_code == 200, (i, r.text)
        assert app.state.limits.retrieval.busy_keys() == 0


def test_a_filters_price_grows_with_its_ranges_and_the_tenants_documents(settings, embedder, small, large):
    """Charged before the filter runs (the full prices): 1 + price per range per 1000
    documents (at least 1000) x ranges x thousands of documents."""
    app = _app(settings, embedder, rate_work_conserving=False, rate_cost_per_filter_kdoc=1.0,
               rate_limit_per_minute=1, rate_limit_burst=1000)
    bucket = app.state.limits.tenant_rate

    def paid(client, tenant, ranges):
        before = bucket.level(tenant)
        r = client.post(URL, json={"query": f"price {uuid.uuid4().hex[:8]}", "source": "lexical_only",
                                   "filter": _ranges(ranges)}, headers=bearer(tenant))
        assert r.status_code == 200, r.text
        return before - bucket.level(tenant)

    with TestClient(app) as client:
        got = {(t, n): paid(client, tenant, n) for t, tenant in (("small", small), ("large", large))
               for n in (1, 16)}
    # 1 token a request, plus ranges x max(1, documents / 1000); the refill (1 a minute) is
    # well under one token during the test
    assert got[("small", 1)] == pytest.approx(1 + 1, abs=0.1)
    assert got[("small", 16)] == pytest.approx(1 + 16, abs=0.1)
    assert got[("large", 1)] == pytest.approx(1 + 3, abs=0.1)
    assert got[("large", 16)] == pytest.approx(1 + 48, abs=0.1)


def test_the_tenants_document_count_is_read_once_per_generation(settings, embedder, app_url, monkeypatch):
    """The filter's price needs the tenant's documents: read in the first filtered search's
    transaction, then known before a connection is taken until the tenant's documents change
    (a new generation), when it is read again and the price follows."""
    from kb_rerank.endpoints import runner

    reads = []
    count = runner.documents.count

    async def counted(conn):
        n = await count(conn)
        reads.append(n)
        return n

    monkeypatch.setattr(runner.documents, "count", counted)
    tenant = _tenant(app_url, 1000)
    app = _app(settings, embedder, rate_work_conserving=False, rate_cost_per_filter_kdoc=1.0,
               rate_limit_per_minute=1, rate_limit_burst=1000)
    bucket = app.state.limits.tenant_rate

    def search():
        before = bucket.level(tenant)
        r = client.post(URL, json={"query": f"count {uuid.uuid4().hex[:8]}", "source": "lexical_only",
                                   "filter": _ranges(4)}, headers=bearer(tenant))
        assert r.status_code == 200, r.text
        return before - bucket.level(tenant)

    with TestClient(app) as client:
        paid = [search() for _ in range(3)]
        assert reads == [1000] and paid == pytest.approx([1 + 4] * 3, abs=0.1)
        _add_documents(app_url, tenant, 1000)
        assert search() == pytest.approx(1 + 8, abs=0.1) and reads == [1000, 2000]


def _add_documents(app_url, tenant, n):
    with psycopg.connect(app_url) as conn, tenant_transaction(conn, tenant):
        conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
                     " select %s, 'more' || g || '.md', 'd', 'h', '{}' from generate_series(1, %s) as g",
                     [tenant, n])
