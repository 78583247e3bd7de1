"""A degraded answer must not look like a real one. Every test runs a real
server (uvicorn on a loopback port, :func:`tests.live_server.serve_in_thread`) and talks HTTP
to it; ``/v2/rerank`` is also read by the official Cohere Python SDK.

The rule (:mod:`kb_rerank.rerank.compose`, written once, used by the three flows): a result
the model did not score reports no relevance, no score made of one and no tier, a fallback
answer names no model
(``ranked_by: "fused"``), and a header says so (``X-KB-Fallback: <reason>``);
``/v2/rerank`` answers 503 instead by default (``KB_V2_FALLBACK``); ``/readyz`` says
``ready`` / ``degraded`` / ``not_ready`` (``KB_READY_WHEN_DEGRADED``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import time
import uuid

import cohere
import httpx
import pytest

from kb_rerank.app import create_app
from kb_rerank.http.auth import mint_token

from tests.live_server import JWT, OPS, OPS_TOKEN, SECRET, FakeReranker, bearer, metric_values, serve_in_thread
from tests.endpoints.test_openapi import _assert_valid

V1_SEARCH, V1_CONTEXT, V2 = "/v1/kb/search/rerank", "/v1/kb/context", "/v2/rerank"
DOCS = ["Carson City is the capital city of the American state of Nevada.",
        "Washington, D.C. is the capital of the United States.",
        "Capital punishment has existed in the United States since before it was a country."]
# each endpoint: its body, where it reports fallback / model, its results' relevance field
ENDPOINTS = {
    "v1_search": (V1_SEARCH, {"query": "how do I create a recurring invoice"}, lambda b: b, "rerank_score"),
    "v1_context": (V1_CONTEXT, {"query": "how do I create a recurring invoice", "explain": True}, lambda b: b,
                   "rerank_score"),
    "v2_rerank": (V2, {"model": "rerank-v3.5", "query": "What is the capital of the United States?",
                       "documents": DOCS, "explain": True}, lambda b: b["meta"], "relevance_score"),
}


class NotReady(FakeReranker):
    """A model still loading (or failed, or absent): ``ready`` False, its load never ends."""

    model_name = "BAAI/bge-reranker-v2-m3"
    ready = False
    state = "loading"

    async def ensure_loaded_async(self):
        return False


class Raising(FakeReranker):
    """Ready, but every call fails (``model_error``)."""

    async def ascore(self, query, passages):
        self.calls += 1
        raise RuntimeError("boom")


@contextlib.contextmanager
def server(settings, embedder, reranker, **changes):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0, **changes),
                     reranker=reranker, embedder=embedder)
    with serve_in_thread(app) as base:
        yield app, base


def on_app_loop(app, coro):
    """Run ``coro`` on the server's event loop (its pool lives there)."""
    return asyncio.run_coroutine_threadsafe(coro, app.state.test_server_loop).result(30)


def audit_of(owner_conn, tenant, trace_id):
    return owner_conn.execute("select kind, severity, detail from kb.kb_rerank_audit where tenant_id = %s"
                              " and trace_id = %s", [tenant, trace_id]).fetchall()


@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_a_fallback_answer_says_so_on_every_endpoint(endpoint, settings, embedder, sample_tenant, owner_conn):
    """The one rule, against the three endpoints (``/v2/rerank`` with ``KB_V2_FALLBACK=fused``):
    no relevance and no tier from a fused score, no model named, the reason in a header; the
    answer is not cached (asked twice: the same, the header again) and matches the OpenAPI
    document; the search endpoint keeps the candidate order and writes a severity-2 audit
    row."""
    path, body, meta_of, relevance = ENDPOINTS[endpoint]
    tenant = sample_tenant if path != V2 else uuid.uuid4()
    with server(settings, embedder, NotReady(), v2_fallback="fused") as (_app, base):
        spec = httpx.get(base + "/schema/openapi.json").json()
        schema = spec["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        answers = []
        for attempt in range(2):
            r = httpx.post(base + path, json=body, headers=bearer(tenant), timeout=60)
            assert r.status_code == 200, r.text
            assert r.headers["x-kb-fallback"] == "model_not_ready" and "x-kb-partial" not in r.headers
            answer = r.json()
            _assert_valid(spec, schema, answer, (path, attempt))
            answers.append((r.headers["x-trace-id"], answer))
    for trace_id, answer in answers:
        meta = meta_of(answer)
        assert meta["fallback"] is True and meta["fallback_reason"] == "model_not_ready"
        assert meta["model"] is None and meta["ranked_by"] == "fused" and meta["from_cache"] is False
        results = answer["results"]
        assert len(results) >= 2
        for x in results:
            assert x["scored_by"] == "fused" and x[relevance] is None, x
            # no tier and no composite of a fused score (the search endpoint has neither at all)
            assert x.get("tier") is None and x.get("final_score") is None
        if path == V1_SEARCH:
            fused = [x["fused_score"] for x in results]
            assert all(isinstance(f, float) for f in fused) and fused == sorted(fused, reverse=True)  # the first-stage order
            assert audit_of(owner_conn, tenant, trace_id) == [("fallback", 2, "model_not_ready")]
        if path == V1_CONTEXT:
            assert all(x["scores"]["rerank"] is None and x["ranks"]["rerank"] is None for x in results)
            assert all(x["scores"]["final"] is None for x in results)
            assert [x["rank"] for x in results] == list(range(1, len(results) + 1))  # the order is the answer's
            assert all(s["rerank"] == {"score": None, "rank": None} and s["final"]["score"] is None
                       for s in answer["stages"])
            assert all(isinstance(x["scores"]["fused"], float) for x in results)
        if path == V2:
            assert "fused" in meta["warnings"][0] or "first-stage" in meta["warnings"][0]
            assert all(x["stages"]["rerank"]["score"] is None and x["stages"]["final"]["score"] is None
                       for x in results)
    assert answers[0][1]["results"] == answers[1][1]["results"]


def test_a_model_answer_carries_no_fallback_header_and_names_its_model(settings, embedder, sample_tenant):
    with server(settings, embedder, FakeReranker()) as (_app, base):
        for name, (path, body, meta_of, relevance) in ENDPOINTS.items():
            r = httpx.post(base + path, json=body, headers=bearer(sample_tenant if path != V2 else uuid.uuid4()),
                           timeout=60)
            assert r.status_code == 200, r.text
            assert "x-kb-fallback" not in r.headers and "x-kb-partial" not in r.headers, name
            meta, results = meta_of(r.json()), r.json()["results"]
            assert meta["model"] == "fake-reranker" and meta["ranked_by"] == "model" and meta["fallback"] is False
            assert results and all(x["scored_by"] == "model" and 0 <= x[relevance] <= 1 for x in results)
            assert "fused_score" not in results[0] and "warnings" not in meta


@pytest.mark.parametrize("rr,reason,retry", [(NotReady, "model_not_ready", "10"), (Raising, "model_error", "2")])
def test_v2_rerank_without_a_model_score_is_a_503_by_default(rr, reason, retry, settings, embedder, owner_conn,
                                                             caplog):
    """The caller asked for a reranker: no model score is an error, as TEI and hosted
    rerankers answer (503, the reason, Retry-After), not a fused order dressed as relevance;
    nothing is cached, and no traceback is logged (a model loading is a state, not a bug)."""
    tenant = uuid.uuid4()
    with server(settings, embedder, rr()) as (_app, base):
        r = httpx.post(base + V2, json={"query": "capital of the united states", "documents": DOCS},
                       headers=bearer(tenant), timeout=60)
        assert r.status_code == 503, r.text
        assert r.headers["retry-after"] == retry and r.headers["x-trace-id"]
        assert r.json() == {"error": "model_unavailable", "reason": reason,
                            "detail": "no cross-encoder could score the documents; retry later",
                            "retry_after_s": int(retry)}
        metrics = metric_values(httpx.get(base + "/metrics", headers=OPS).text)
        assert metrics['kb_rerank_rejected_total{reason=model_unavailable}'] == 1
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR], caplog.text
    assert owner_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s",
                              [tenant]).fetchone()[0] == 0


def test_the_cohere_sdk_reads_scores_a_503_and_the_fused_fallback(settings, embedder):
    """The official Cohere SDK against the server: with a model, relevance scores; without
    one, by default an error carrying 503 (no relevance 1.0 for document 0); with
    ``KB_V2_FALLBACK=fused``, relevance ``None`` for every document and the reason in
    ``meta.warnings``."""
    token = mint_token(uuid.uuid4(), JWT)
    no_retry = {"max_retries": 0}
    query = "What is the capital of the United States?"
    with server(settings, embedder, FakeReranker()) as (_app, base):
        co = cohere.ClientV2(base_url=base, api_key=token)
        got = co.rerank(model="rerank-v3.5", query=query, documents=DOCS, request_options=no_retry)
        scores = [x.relevance_score for x in got.results]
        assert len(scores) == 3 and all(isinstance(s, float) and 0 <= s <= 1 for s in scores)
        assert sorted(x.index for x in got.results) == [0, 1, 2] and not got.meta.warnings
    with server(settings, embedder, NotReady()) as (_app, base):
        co = cohere.ClientV2(base_url=base, api_key=token)
        with pytest.raises(cohere.core.api_error.ApiError) as err:
            co.rerank(model="rerank-v3.5", query=query, documents=DOCS, request_options=no_retry)
        assert err.value.status_code == 503
        assert err.value.body["error"] == "model_unavailable" and err.value.body["reason"] == "model_not_ready"
    with server(settings, embedder, NotReady(), v2_fallback="fused") as (_app, base):
        co = cohere.ClientV2(base_url=base, api_key=token)
        got = co.rerank(model="rerank-v3.5", query=query, documents=DOCS, request_options=no_retry)
        assert [x.index for x in got.results] == [0, 1, 2]  # the first stage: input order
        assert [x.relevance_score for x in got.results] == [None, None, None]
        assert "model_not_ready" in got.meta.warnings[0]


class FailsOnce(FakeReranker):
    """Ready; its first call fails (``model_error``), the next ones score."""

    async def ascore(self, query, passages):
        if self.calls == 0:
            self.calls += 1
            raise RuntimeError("boom")
        return await super().ascore(query, passages)


def test_the_cohere_sdk_waits_the_retry_after_and_gets_the_scores(settings, embedder):
    """The SDK's own retries (two by default) honour ``Retry-After``: a caller whose first try
    met a failing model gets the model's scores from the retry, not an error or a fake score."""
    rr = FailsOnce()
    with server(settings, embedder, rr) as (_app, base):
        co = cohere.ClientV2(base_url=base, api_key=mint_token(uuid.uuid4(), JWT))
        t0 = time.monotonic()
        got = co.rerank(model="rerank-v3.5", query="capital", documents=DOCS)
        waited = time.monotonic() - t0
    assert rr.calls == 2 and waited >= 2  # Retry-After: 2 for model_error
    assert all(isinstance(x.relevance_score, float) for x in got.results) and not got.meta.warnings


@pytest.mark.parametrize("when_degraded", [False, True])
def test_readyz_says_ready_degraded_or_not_ready(when_degraded, settings, embedder):
    """``degraded``: the database is fine, the model is not (503 by default, 200 with
    ``KB_READY_WHEN_DEGRADED=true``); ``ready`` once the model is; ``not_ready`` (503 either
    way) when the database is not. The coarse body without the ops token, the model's state
    with it, and the ``model_ready`` gauge."""
    rr = NotReady()
    with server(settings, embedder, rr, ready_when_degraded=when_degraded) as (app, base):
        r = httpx.get(base + "/readyz")
        assert (r.status_code, r.json()) == (200 if when_degraded else 503, {"status": "degraded"})
        detail = httpx.get(base + "/readyz", headers=OPS).json()
        assert detail["status"] == "degraded" and detail["database"] == "ok" and detail["schema"] == "ok"
        assert detail["model"]["ready"] is False and detail["model"]["state"] == "loading"
        assert metric_values(httpx.get(base + "/metrics", headers=OPS).text)["kb_rerank_model_ready"] == 0
        rr.ready, rr.state = True, "ready"  # the load finished
        r = httpx.get(base + "/readyz")
        assert (r.status_code, r.json()) == (200, {"status": "ready"})
        assert metric_values(httpx.get(base + "/metrics", headers=OPS).text)["kb_rerank_model_ready"] == 1
        on_app_loop(app, app.state.pipeline.pool.close())
        r = httpx.get(base + "/readyz")
        assert (r.status_code, r.json()) == (503, {"status": "not_ready"})


def test_readyz_without_a_reranker_is_degraded(settings, embedder):
    """A pipeline with no cross-encoder at all (reported ``absent``, not ``ready``)."""
    with server(settings, embedder, FakeReranker()) as (app, base):
        app.state.pipeline.reranker = None
        r = httpx.get(base + "/readyz", headers=OPS)
        assert r.status_code == 503 and r.json()["status"] == "degraded"
        assert r.json()["model"]["state"] == "absent" and r.json()["model"]["ready"] is False


README_SNIPPET = """\
from pathlib import Path
from kb_rerank.testing import build_tiny_cross_encoder

model_dir = build_tiny_cross_encoder(Path("tiny-cross-encoder"))  # KB_RERANKER_MODEL=tiny-cross-encoder
"""


def test_the_readme_import_of_the_tiny_model_works_as_written(tmp_path):
    """The snippet (as the README shows it, run in a fresh interpreter) writes a model folder
    the service's cross-encoder loads and scores with."""
    subprocess.run([sys.executable, "-c", README_SNIPPET], cwd=tmp_path, check=True, timeout=300)
    from kb_rerank.models.cross_encoder import Reranker

    r = Reranker(str(tmp_path / "tiny-cross-encoder"), device="cpu")
    try:
        r.load()
        scores = asyncio.run(r.ascore("capital", DOCS))
        assert r.ready and len(scores) == 3 and all(0 <= s <= 1 for s in scores)
    finally:
        r.close()
