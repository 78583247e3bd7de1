"""The request runner (:class:`kb_rerank.endpoints.runner.Pipeline`) tested directly, without
HTTP: its fixed sequence (cache lookup, single flight, retrieve, score, record) over the real
test database, a real connection pool of the app role, the search flow on the lexical list
(no embedder needed) and cross-encoder test doubles."""

from __future__ import annotations

import asyncio
import time
import uuid

import psycopg
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


async def app_pool(settings, app_url) -> AsyncConnectionPool:
    """An open pool of the app role, its connections configured as the service's."""
    async def configure(conn):
        await aconfigure_connection(conn, settings)

    pool = AsyncConnectionPool(app_url, min_size=1, max_size=4, open=False, configure=configure,
                               kwargs={"autocommit": True})
    await pool.open()
    return pool


def run(settings, app_url, model, scenario):
    """Run ``scenario(pipe, spy)`` with a Pipeline over a fresh pool of the app role; ``spy``
    counts the runner's retrieve and score steps."""

    async def main():
        pool = await app_pool(settings, app_url)
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


# --------------------------------------------------------------------------- a hybrid miss's lexical list,
# read while the query is being embedded (Pipeline._embed_query)

class QueryEmbedder:
    """A query embedder double: ``delay_s`` in its worker thread, then basis(0), or raises."""

    name, dim = "runner-test-embedder", 384

    def __init__(self, *, delay_s: float = 0.0, fail: bool = False) -> None:
        self.delay_s, self.fail, self.done_at = delay_s, fail, None

    def embed_query(self, text):
        time.sleep(self.delay_s)
        self.done_at = time.perf_counter()
        if self.fail:
            raise RuntimeError("embedder failed")
        return basis(0)


def run_hybrid(settings, app_url, embedder, scenario, *, lexical_sleep_s: float = 0.0, lexical_fails: bool = False):
    """``scenario(pipe, seen)`` with a Pipeline whose embedder is ``embedder``; ``seen`` holds
    the lexical task (its asyncio task, when it ended, what it returned) and what the read got;
    the lexical read can be held in the database (``lexical_sleep_s``) or fail. Returns the
    scenario's result and the pool's connections in use once it ended."""
    from kb_rerank.endpoints import runner
    from kb_rerank.core.embedding import EmbedPool

    async def main():
        pool = await app_pool(settings, app_url)
        embed = EmbedPool([embedder])
        orig_lexical, orig_read = runner.read_lexical, runner.read_spec
        seen: dict = {}

        async def read_lexical(conn, *a, **kw):
            seen["task"] = asyncio.current_task()
            if lexical_sleep_s:
                await conn.execute("select pg_sleep(%s)", [lexical_sleep_s])
            if lexical_fails:
                raise psycopg.errors.QueryCanceled("canceling statement due to statement timeout")
            out = await orig_lexical(conn, *a, **kw)
            seen["lexical_at"], seen["lexical"] = time.perf_counter(), out
            return out

        async def read_spec(conn, *a, **kw):
            seen["read_given"] = kw.get("lexical")
            return await orig_read(conn, *a, **kw)

        runner.read_lexical, runner.read_spec = read_lexical, read_spec
        try:
            pipe = Pipeline(settings, pool, embedder=embed, reranker=CountingModel())
            try:
                out = await scenario(pipe, seen)
            finally:
                embed.close()
            # a connection given back after a cancelled statement is reset by the pool's
            # workers first: wait (bounded) for them
            for _ in range(50):
                if in_use(pool.get_stats()) == 0:
                    break
                await asyncio.sleep(0.1)
            return out, seen, pool.get_stats()
        finally:
            runner.read_lexical, runner.read_spec = orig_lexical, orig_read
            await pool.close()

    return asyncio.run(main())


def hybrid(pipe, query="refund invoice"):
    return pipe.flow(SearchFlow, RerankRequest(query=query, source="hybrid_lexical_semantic"))


def in_use(stats) -> int:
    return stats.get("pool_size", 0) - stats.get("pool_available", 0)


def test_a_hybrid_miss_reads_its_lexical_list_while_the_query_is_embedded(settings, app_url, kb_tenant):
    embedder = QueryEmbedder(delay_s=0.5)

    async def scenario(pipe, seen):
        return await pipe.run(hybrid(pipe), kb_tenant, "trace-overlap")

    served, seen, stats = run_hybrid(settings, app_url, embedder, scenario)
    assert served.from_cache is False and {"Refunds", "Invoices"} <= {r.doc_title for r in served.body.results}
    assert seen["lexical_at"] < embedder.done_at  # read during the embedding
    assert seen["read_given"] is seen["lexical"] and seen["lexical"].ids[0]  # the read fused it
    assert in_use(stats) == 0


def test_lexical_only_and_semantic_only_read_no_list_beforehand(settings, app_url, kb_tenant):
    async def scenario(pipe, seen):
        for source in ("lexical_only", "semantic_only"):
            await pipe.run(pipe.flow(SearchFlow, RerankRequest(query="refund", source=source)), kb_tenant, "t")

    _, seen, _ = run_hybrid(settings, app_url, QueryEmbedder(), scenario)
    assert "task" not in seen and seen["read_given"] is None


@pytest.mark.parametrize("how", ["embedder fails", "request cancelled", "lexical list fails"])
def test_the_lexical_task_ends_with_the_miss_and_leaves_no_connection(settings, app_url, app_conn, kb_tenant, how):
    """The embedding fails or the request is cancelled while the lexical list is being read:
    its task is cancelled and its connection back in the pool; the list's read fails: the
    miss fails with its error, as the read would. Nothing cached in any case."""
    embedder = QueryEmbedder(delay_s=0.3, fail=how == "embedder fails")

    async def scenario(pipe, seen):
        task = asyncio.get_running_loop().create_task(pipe.run(hybrid(pipe), kb_tenant, "trace-fail"))
        if how == "request cancelled":
            await asyncio.sleep(0.15)
            task.cancel()
        try:
            await task
        except BaseException as exc:  # noqa: BLE001 - what the miss ended with
            return exc
        return None

    exc, seen, stats = run_hybrid(settings, app_url, embedder, scenario,
                                  lexical_sleep_s=0.0 if how == "lexical list fails" else 5.0,
                                  lexical_fails=how == "lexical list fails")
    expected = {"embedder fails": RuntimeError, "request cancelled": asyncio.CancelledError,
                "lexical list fails": psycopg.errors.QueryCanceled}[how]
    assert isinstance(exc, expected), exc
    assert seen["task"].done() and "lexical" not in seen and "read_given" not in seen
    if how != "lexical list fails":
        assert seen["task"].cancelled()
    assert in_use(stats) == 0
    assert cache_rows(app_conn, kb_tenant) == 0
