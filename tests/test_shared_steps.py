"""Behaviour the three endpoints share, tested once against all three (issue 14, item 1):
POST /v1/kb/search/rerank, POST /v1/kb/context and POST /v2/rerank."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kb_rerank.v2 import CONTEXT_SOURCE, V2_SOURCE

from .live_server import OPS
from .test_api import bearer, client_for

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
    with client_for(settings, rr, embedder) as client:
        for attempt in range(2):  # the second identical request is not served from the cache
            r = client.post(path, json=body, headers=bearer(tenant))
            assert r.status_code == 200, r.text
            got = report(r.json())
            assert got["fallback"] is True and got["fallback_reason"] == reason
            assert got["from_cache"] is False, f"attempt {attempt}: a fallback answer was cached"
        assert rr.calls == (2 if kind == "raises" else 0)  # the model is retried, not skipped
        assert fallbacks(client) == {(source, reason): 2.0}
