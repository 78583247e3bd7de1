"""Limits never refuse one person's ordinary use (work-conserving prices,
kb_rerank.core.limits): at the default settings a tenant alone sends searches and
``/v2/rerank`` calls one after another with any model (fast, slower than the budget, absent)
and gets no 429; once another tenant is served, the full prices apply again."""

from __future__ import annotations

import uuid

import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.core.costs import Bill, Work
from kb_rerank.core.limits import Limits, RateLimiter

from tests.live_server import OPS_TOKEN, SECRET, URL, FakeReranker, bearer


class _MeasuredCost:
    """A calibrated forward cost of 100 ms a pair: a CPU cross-encoder, slower than the budget."""

    calibrated = True

    def ms_per_pair(self) -> float:
        return 100.0

    def pairs_within(self, budget_ms: float) -> int:
        return max(1, int(budget_ms // 100))

    def snapshot(self) -> dict:
        return {"ms_per_pair": 100.0}


class SlowModel(FakeReranker):
    model_name = "slow-model"

    def __init__(self) -> None:
        super().__init__(delay_s=0.05)
        self.cost = _MeasuredCost()


MODELS = {"fast": FakeReranker, "slow": SlowModel, "absent": lambda: None}


def test_a_tenant_alone_pays_a_token_a_request_and_the_full_prices_once_shared():
    lim = Limits(tenant_rate=RateLimiter(60, 300, clock=lambda: 0.0), cost_per_pair=0.5, cost_per_embedding=4.0,
                 shared_window_s=10.0)
    a, b = "a", "b"
    lim.charge(a)
    bill = Bill(lim, a)
    bill.reserve(Work(embeddings=1, pairs=40))
    bill.settle()
    assert lim.tenant_rate.level(a) == pytest.approx(299)  # alone: the request token only
    lim.charge(b)  # another tenant is served: the service is shared
    lim.charge(a)
    bill = Bill(lim, a)
    bill.reserve(Work(embeddings=1, pairs=40))
    assert lim.tenant_rate.level(a) == pytest.approx(299 - 1 - 4 - 20)
    # disabled (the unit tests' and KB_RATE_WORK_CONSERVING=false): the full prices alone too
    full = Limits(tenant_rate=RateLimiter(60, 300, clock=lambda: 0.0), cost_per_pair=0.5)
    full.charge(a)
    Bill(full, a).reserve(Work(pairs=40))
    assert full.tenant_rate.level(a) == pytest.approx(300 - 1 - 20)


@pytest.mark.parametrize("model", list(MODELS))
def test_five_searches_and_five_40_document_reranks_in_a_row_get_no_429(model, settings, embedder, sample_tenant):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN), reranker=MODELS[model](),
                     embedder=embedder)
    tag = uuid.uuid4().hex[:6]
    with TestClient(app) as client:
        for i in range(5):
            r = client.post(URL, json={"query": f"how do refunds work {tag} {i}"}, headers=bearer(sample_tenant))
            assert r.status_code == 200, (model, i, r.text)
            assert not r.json()["from_cache"]
        for i in range(5):
            docs = [f"document {j} of call {i} {tag}: refunds, credit notes and invoices" for j in range(40)]
            r = client.post("/v2/rerank", json={"query": f"refunds {i}", "documents": docs},
                            headers=bearer(sample_tenant))
            # no model: the documented 503 model_unavailable (KB_V2_FALLBACK=error), never a 429
            assert r.status_code == (503 if model == "absent" else 200), (model, i, r.text)


def test_the_slow_model_would_have_been_refused_at_the_full_prices(settings, embedder, sample_tenant):
    """The same searches with the service shared (the full prices): the measured price of a
    slow model empties the bucket, which is what a tenant alone no longer pays."""
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_work_conserving=False),
                     reranker=SlowModel(), embedder=embedder)
    tag = uuid.uuid4().hex[:6]
    with TestClient(app) as client:
        codes = [client.post(URL, json={"query": f"how do refunds work {tag} {i}"},
                             headers=bearer(sample_tenant)).status_code for i in range(5)]
    assert 429 in codes, codes
