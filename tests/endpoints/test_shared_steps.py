"""Behaviour the three endpoints share, tested once against all three:
POST /v1/kb/search/rerank, POST /v1/kb/context and POST /v2/rerank."""

from __future__ import annotations

import asyncio
import json
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from kb_rerank.testing.doubles import ModelDouble
from prometheus_client.parser import text_string_to_metric_families

from kb_rerank.endpoints.context.flow import SOURCE as CONTEXT_SOURCE
from kb_rerank.endpoints.v2_rerank.flow import SOURCE as V2_SOURCE

from tests.live_server import OPS
from tests.endpoints.test_rerank_route import bearer, client_for, reranker, tiny_model_dir  # noqa: F401 - module fixtures

DOCS = ["Refunds are issued to the original payment method within five days.",
        "Credit notes cancel an invoice in part or in full."]

# path, body, where the endpoint reports fallback / from_cache, the source it is counted under
ENDPOINTS = {
    "v1_rerank": ("/v1/kb/search/rerank", {"query": "shared steps: refund a paid invoice"},
                  lambda b: b, "hybrid_lexical_semantic"),
    "context": ("/v1/kb/context", {"query": "shared steps: refund a paid invoice"},
                lambda b: b, CONTEXT_SOURCE),
    "v2_rerank": ("/v2/rerank", {"query": "shared steps: refund a paid invoice", "documents": DOCS},
                  lambda b: b["meta"], V2_SOURCE),
}


class FailingReranker:
    """``raises``: ready, but every call fails; ``not_ready``: the model is not loaded."""

    model_name = "failing-test-model"

    def __init__(self, kind: str) -> None:
        self.ready = kind == "raises"
        self.calls = 0

    async def ascore(self, query, passages):
        self.calls += 1
        raise RuntimeError("boom")

    async def ensure_loaded_async(self):
        return False


def fallbacks(client) -> dict[tuple[str, str], float]:
    """(source, reason) -> count of kb_rerank_fallbacks_total."""
    r = client.get("/metrics", headers=OPS)
    assert r.status_code == 200, r.text
    return {(s.labels["source"], s.labels["reason"]): s.value
            for fam in text_string_to_metric_families(r.text) if fam.name == "kb_rerank_fallbacks"
            for s in fam.samples if s.name == "kb_rerank_fallbacks_total" and s.value}


@pytest.mark.parametrize("kind,reason", [("raises", "model_error"), ("not_ready", "model_not_ready")])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_model_failure_is_a_fallback_not_cached_and_counted_under_the_endpoints_source(
        endpoint, kind, reason, settings, embedder, sample_tenant):
    path, body, report, source = ENDPOINTS[endpoint]
    rr = FailingReranker(kind)
    tenant = sample_tenant if endpoint != "v2_rerank" else uuid.uuid4()
    # /v2/rerank answers a fallback only when asked to (its default is a 503: tests/endpoints/test_degraded.py)
    with client_for(settings, rr, embedder, v2_fallback="fused") as client:
        for attempt in range(2):  # the second identical request is not served from the cache
            r = client.post(path, json=body, headers=bearer(tenant))
            assert r.status_code == 200, r.text
            got = report(r.json())
            assert got["fallback"] is True and got["fallback_reason"] == reason
            assert got["from_cache"] is False, f"attempt {attempt}: a fallback answer was cached"
        assert rr.calls == (2 if kind == "raises" else 0)  # the model is retried, not skipped
        assert fallbacks(client) == {(source, reason): 2.0}


class SlowReranker(ModelDouble):
    """Ready; each call waits ``delay`` seconds, then scores by passage length (0..1)."""

    model_name = "slow-test-model"
    ready = True

    def __init__(self, delay: float = 0.4) -> None:
        self.delay = delay
        self.calls = 0

    async def ascore(self, query, passages):
        self.calls += 1
        await asyncio.sleep(self.delay)
        return [min(1.0, len(p) / 2000.0) for p in passages]


def _body_for(endpoint: str, query: str) -> dict:
    body = dict(ENDPOINTS[endpoint][1])
    body["query"] = query
    return body


def _tenant_for(endpoint: str, sample_tenant):
    return sample_tenant if endpoint != "v2_rerank" else uuid.uuid4()


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_single_flight_identical_concurrent_misses_call_the_model_once(endpoint, settings, embedder, sample_tenant,
                                                                        owner_conn):
    """Every endpoint has single flight. Eight identical misses at once:
    one model call, one cache row, every request answered the same and audited."""
    path, _, report, source = ENDPOINTS[endpoint]
    tenant = _tenant_for(endpoint, sample_tenant)
    body = _body_for(endpoint, f"single flight {endpoint} {uuid.uuid4().hex[:8]} refund invoice")
    rr = SlowReranker()
    with client_for(settings.with_(pair_cache=False), rr, embedder) as client:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: client.post(path, json=body, headers=bearer(tenant)), range(8)))
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    assert rr.calls == 1
    results = {json.dumps(a.json()["results"], sort_keys=True) for a in answers}
    assert len(results) == 1  # the same answer for all
    assert sum(1 for a in answers if report(a.json())["from_cache"]) == 7
    trace_ids = [a.headers["x-trace-id"] for a in answers]
    rows = owner_conn.execute(
        "select kind, count(*) from kb.kb_rerank_audit where tenant_id = %s and trace_id = any(%s) group by kind",
        [tenant, trace_ids]).fetchall()
    assert dict(rows) == {"served": 1, "cache_hit": 7}
    cached = owner_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s and source = %s"
                                " and trace_id = any(%s)", [tenant, source, trace_ids]).fetchone()[0]
    assert cached == 1


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_deeply_nested_json_is_a_400_naming_no_field(endpoint, settings, reranker, embedder, sample_tenant):
    """JSON nested too deeply is the same 400 on every endpoint, naming no field."""
    path = ENDPOINTS[endpoint][0]
    raw = '{"query": "x", "deep": ' + "[" * 5000 + "]" * 5000 + "}"
    with client_for(settings, reranker, embedder) as client:
        r = client.post(path, content=raw.encode(), headers={**bearer(sample_tenant),
                                                              "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid_json" and r.json()["field"] is None


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_malformed_cache_row_is_a_miss_and_is_replaced(endpoint, settings, reranker, embedder, sample_tenant,
                                                         owner_conn):
    """Every endpoint checks a cached row before serving it.
    A cached row edited into garbage (by a DBA, a bad migration) is never served: it is
    deleted, the request computes afresh and writes a good row."""
    path, _, report, source = ENDPOINTS[endpoint]
    tenant = _tenant_for(endpoint, sample_tenant)
    body = _body_for(endpoint, f"malformed row {endpoint} {uuid.uuid4().hex[:8]} refund invoice")
    # no rerank budget: with one, how many candidates the model scores depends on how busy the
    # machine is, and a partial answer is not cached (tests/rerank/test_rerank_budget.py has those)
    with client_for(settings, reranker, embedder, rerank_budget_ms=0) as client:
        first = client.post(path, json=body, headers=bearer(tenant))
        assert first.status_code == 200 and report(first.json())["from_cache"] is False
        tid = first.headers["x-trace-id"]
        n = owner_conn.execute("update kb.kb_rerank_cache set results_jsonb = '{\"kind\": \"other\"}'::jsonb"
                               " where tenant_id = %s and source = %s and trace_id = %s",
                               [tenant, source, tid]).rowcount
        assert n == 1
        second = client.post(path, json=body, headers=bearer(tenant))
        assert second.status_code == 200, second.text
        assert report(second.json())["from_cache"] is False  # computed afresh, not the garbage
        assert len(second.json()["results"]) == len(first.json()["results"])
        third = client.post(path, json=body, headers=bearer(tenant))
        # the fresh answer was stored in place of the malformed row (not compared with the first
        # answer: other tests' ingests in the same database move the HNSW graph between them)
        assert report(third.json())["from_cache"] is True
        assert third.json()["results"] == second.json()["results"]
    assert owner_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s and trace_id = %s",
                              [tenant, tid]).fetchone()[0] == 0


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_latency_hits_and_misses_are_counted_under_the_endpoints_source(endpoint, settings, reranker, embedder,
                                                                        sample_tenant):
    path, _, report, source = ENDPOINTS[endpoint]
    tenant = _tenant_for(endpoint, sample_tenant)
    body = _body_for(endpoint, f"metrics {endpoint} {uuid.uuid4().hex[:8]} refund invoice")
    # no rerank budget: with one, how many candidates the model scores depends on how busy the
    # machine is, and a partial answer is not cached (tests/rerank/test_rerank_budget.py has those)
    with client_for(settings, reranker, embedder, rerank_budget_ms=0) as client:
        for _ in range(2):
            assert client.post(path, json=body, headers=bearer(tenant)).status_code == 200
        text = client.get("/metrics", headers=OPS).text
    samples = {(s.name, s.labels.get("source")): s.value for fam in text_string_to_metric_families(text)
               for s in fam.samples}
    assert samples[("kb_rerank_cache_misses_total", source)] == 1
    assert samples[("kb_rerank_cache_hits_total", source)] == 1
    assert samples[("kb_rerank_rerank_duration_seconds_count", source)] == 2


@pytest.mark.parametrize("change", [{"candidates": 7}, {"rerank_top_n": 5}, {"demote_factor": 0.3},
                                    {"fusion_method": "rrf"}, {"guard_lexical_threshold": 0.9}])
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_change_of_configuration_is_not_served_the_old_configurations_answers(endpoint, change, settings,
                                                                                reranker, embedder, sample_tenant):
    """The cache key names every setting that changes an answer (flow.answer_config): an app
    started with another value misses, and the first app's answers stay its own."""
    if settings.with_(**change) == settings:
        change = {"fusion_method": "convex"}  # the default already: change it the other way
    # no rerank budget: with one, how many candidates the model scores depends on how busy the
    # machine is, and a partial answer is not cached (tests/rerank/test_rerank_budget.py has those)
    settings = settings.with_(rerank_budget_ms=0)
    path, _, report, _source = ENDPOINTS[endpoint]
    tenant = _tenant_for(endpoint, sample_tenant)
    body = _body_for(endpoint, f"configured key {endpoint} {uuid.uuid4().hex[:8]} refund invoice")

    def ask(client):
        r = client.post(path, json=body, headers=bearer(tenant))
        assert r.status_code == 200, r.text
        return report(r.json())["from_cache"]

    with client_for(settings, reranker, embedder) as client:
        assert ask(client) is False and ask(client) is True
    with client_for(settings.with_(**change), reranker, embedder) as client:
        assert ask(client) is False  # another configuration: computed afresh
        assert ask(client) is True
    with client_for(settings, reranker, embedder) as client:
        assert ask(client) is True  # the first configuration's answer is still its own
