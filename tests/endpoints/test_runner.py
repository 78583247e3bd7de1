"""The request runner (:class:`kb_rerank.endpoints.runner.Pipeline`) tested directly, without
HTTP: its fixed sequence (cache lookup, single flight, retrieve, score, record) over the real
test database, a real connection pool of the app role, the search flow on the lexical list
(no embedder needed) and cross-encoder test doubles."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from psycopg_pool import AsyncConnectionPool

from kb_rerank.core.session import aconfigure_connection, tenant_transaction
from kb_rerank.endpoints.requests import RerankRequest
from kb_rerank.endpoints.runner import Pipeline
from kb_rerank.endpoints.search.flow import SearchFlow
from kb_rerank.testing.doubles import ModelDouble

from tests.helpers import basis, insert_doc

DOCS = [("Refunds", "Refunds reach the original payment method within five days."),
        ("Invoices", "A refund of a paid invoice is issued as a credit note."),
        ("Exports", "Export the billing report as CSV from the settings page.")]


class CountingModel(ModelDouble):
    """Scores each passage by its length (distinct, in 0..1), counting calls and pairs;
    ``delay_s`` holds every call (so concurrent requests overlap); ``fail`` raises."""

    model_name = "runner-test-model"

    def __init__(self, *, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls = 0
        self.pairs = 0
        self.delay_s, self.fail = delay_s, fail

    async def ascore(self, query, passages):
        self.calls += 1
        self.pairs += len(passages)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail:
            raise RuntimeError("model failed")
        return [min(1.0, len(p) / 1000.0) for p in passages]


@pytest.fixture
def kb_tenant(app_conn, tenant) -> uuid.UUID:
    for i, (title, text) in enumerate(DOCS):
        insert_doc(app_conn, tenant, title, [text], [basis(i)])
    return tenant


def audit_rows(app_conn, tenant) -> list[tuple[str, str | None, int, int]]:
    with tenant_transaction(app_conn, tenant):
        return app_conn.execute("select kind, model, candidate_count, returned_count from kb.kb_rerank_audit"
                                " where tenant_id = %s order by seq", [tenant]).fetchall()


def cache_rows(app_conn, tenant) -> int:
    with tenant_transaction(app_conn, tenant):
        return app_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s",
                                [tenant]).fetchone()[0]


def run(settings, app_url, model, scenario):
    """Run ``scenario(pipe, spy)`` with a Pipeline over a fresh pool of the app role; ``spy``
    counts the runner's retrieve and score steps."""

    async def main():
        async def configure(conn):
            await aconfigure_connection(conn, settings)

        pool = AsyncConnectionPool(app_url, min_size=1, max_size=4, open=False, configure=configure,
                                   kwargs={"autocommit": True})
        await pool.open()
        try:
            pipe = Pipeline(settings, pool, embedder=None, reranker=model)
            spy = {"retrieve": 0, "score": 0}
            retrieve, score = pipe.retrieve, pipe.score

            async def counted_retrieve(*a, **kw):
                spy["retrieve"] += 1
                return await retrieve(*a, **kw)

            async def counted_score(*a, **kw):
                spy["score"] += 1
                return await score(*a, **kw)

            pipe.retrieve, pipe.score = counted_retrieve, counted_score
            return await scenario(pipe, spy)
        finally:
            await pool.close()

    return asyncio.run(main())


def search(pipe, query="refund invoice"):
    return pipe.flow(SearchFlow, RerankRequest(query=query, source="lexical_only"))


def test_a_miss_retrieves_scores_and_records_then_a_hit_skips_retrieval_and_scoring(
        settings, app_url, app_conn, kb_tenant):
    model = CountingModel()

    async def scenario(pipe, spy):
        first = await pipe.run(search(pipe), kb_tenant, "trace-miss")
        after_miss = dict(spy)
        second = await pipe.run(search(pipe), kb_tenant, "trace-hit")
        return first, after_miss, second, dict(spy)

    first, after_miss, second, after_hit = run(settings, app_url, model, scenario)
    assert first.from_cache is False and after_miss == {"retrieve": 1, "score": 1}
    n = len(first.body.results)
    assert n == 2 and model.calls == 1 and model.pairs == n  # the two documents holding "refund" and "invoice"
    # the model's order: longer passage first
    assert [r.doc_title for r in first.body.results] == ["Refunds", "Invoices"]

    assert second.from_cache is True and second.body == first.body
    assert after_hit == after_miss and model.calls == 1  # no retrieval, no model call on a hit
    assert audit_rows(app_conn, kb_tenant) == [("served", model.model_name, n, n),
                                               ("cache_hit", model.model_name, 0, n)]
    assert cache_rows(app_conn, kb_tenant) == 1


def test_two_identical_concurrent_misses_compute_once(settings, app_url, app_conn, kb_tenant):
    model = CountingModel(delay_s=0.3)  # the leader is still scoring when the follower arrives

    async def scenario(pipe, spy):
        return await asyncio.gather(pipe.run(search(pipe), kb_tenant, "trace-a"),
                                    pipe.run(search(pipe), kb_tenant, "trace-b")), dict(spy)

    (a, b), spy = run(settings, app_url, model, scenario)
    assert model.calls == 1 and spy == {"retrieve": 1, "score": 1}
    assert a.body == b.body and sorted([a.from_cache, b.from_cache]) == [False, True]
    assert [k for k, *_ in audit_rows(app_conn, kb_tenant)] == ["served", "cache_hit"]  # each request audited
    assert cache_rows(app_conn, kb_tenant) == 1


def test_a_model_failure_falls_back_with_the_reason_and_is_not_cached(settings, app_url, app_conn, kb_tenant):
    model = CountingModel(fail=True)

    async def scenario(pipe, spy):
        return [await pipe.run(search(pipe), kb_tenant, f"trace-{i}") for i in range(2)], dict(spy)

    (first, second), spy = run(settings, app_url, model, scenario)
    for served in (first, second):
        assert served.from_cache is False and served.outcome.fallback_reason == "model_error"
        assert [r.scored_by for r in served.body.results] == ["fused", "fused"]
        assert all(r.rerank_score is None for r in served.body.results)
    assert spy == {"retrieve": 2, "score": 2} and model.calls == 2  # not cached: computed again, model retried
    rows = audit_rows(app_conn, kb_tenant)
    assert [k for k, *_ in rows] == ["fallback", "fallback"]
    assert cache_rows(app_conn, kb_tenant) == 0


def test_the_record_step_writes_one_audit_row_with_the_cache_row(settings, app_url, app_conn, kb_tenant):
    model = CountingModel()

    async def scenario(pipe, spy):
        return await pipe.run(search(pipe, "export csv"), kb_tenant, "trace-record")

    served = run(settings, app_url, model, scenario)
    assert served.from_cache is False and [r.doc_title for r in served.body.results] == ["Exports"]
    assert audit_rows(app_conn, kb_tenant) == [("served", model.model_name, 1, 1)]
    with tenant_transaction(app_conn, kb_tenant):
        trace, query_hash = app_conn.execute("select trace_id, query_hash from kb.kb_rerank_audit"
                                             " where tenant_id = %s", [kb_tenant]).fetchone()
        cached = app_conn.execute("select query_hash from kb.kb_rerank_cache where tenant_id = %s",
                                  [kb_tenant]).fetchall()
    assert trace == "trace-record" and cached == [(query_hash,)]  # the audit row names the cached key
