"""Through the app: one tenant's large /v2/rerank request does not hold the embedder while
another tenant's query waits, and a caller document is priced by the pieces the guard and MMR
embed, before the work."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app

from tests.live_server import OPS_TOKEN, SECRET, URL, FakeReranker, bearer


class LoggingEmbedder:
    """The test's embedder, slowed to ``per_text`` seconds a text, logging each call."""

    def __init__(self, inner, per_text: float = 0.02) -> None:
        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self.per_text = per_text
        self.log: list[tuple[str, int]] = []
        self.first_passages = threading.Event()
        self.lock = threading.Lock()

    def embed_query(self, text):
        time.sleep(self.per_text)
        with self.lock:
            self.log.append(("query", 1))
        return self.inner.embed_query(text)

    def embed_passages(self, texts):
        self.first_passages.set()
        time.sleep(self.per_text * len(texts))
        with self.lock:
            self.log.append(("passages", len(texts)))
        return np.asarray(self.inner.embed_passages(texts))


def test_a_tenants_query_is_embedded_between_another_tenants_passages(settings, embedder, sample_tenant):
    """Before: one embedder thread, first come first served: tenant B's query embedding waited
    behind tenant A's whole batch (the guard sends 32 texts a call). Now A's call is split into
    units and B's query runs after at most the unit in flight."""
    slow = LoggingEmbedder(embedder)
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0,
                                    embed_unit_chars=200, guard_embed_timeout_s=60),
                     reranker=FakeReranker(), embedder=slow)
    docs = [f"document {i} about refunds and credit notes for invoices paid twice" for i in range(30)]
    with TestClient(app) as client, ThreadPoolExecutor(2) as pool:
        a = pool.submit(client.post, "/v2/rerank", json={"query": "refunds", "documents": docs, "lambda": 0.7},
                        headers=bearer(uuid.uuid4()))
        assert slow.first_passages.wait(30)
        b = client.post(URL, json={"query": f"fair {uuid.uuid4().hex[:6]} export reports",
                                   "source": "semantic_only"}, headers=bearer(sample_tenant))
        assert b.status_code == 200, b.text
        assert a.result(120).status_code == 200
    kinds = [k for k, _ in slow.log]
    q = kinds.index("query")
    passages_after = sum(n for k, n in slow.log[q + 1:] if k == "passages")
    # A's texts were still being embedded after B's query: B did not wait for all of them
    assert passages_after >= 20, slow.log
    # and each of A's calls was one unit (at most 200 characters: two or three of these documents)
    calls = [n for k, n in slow.log if k == "passages"]
    assert max(calls) <= 3 and len(calls) >= 10


def test_a_long_caller_document_is_priced_by_its_pieces_before_the_work(settings, embedder):
    """Before: a document cost rate_cost_per_document and one embedding, whatever its length
    (19,000 characters were embedded for the price of one text). Now every piece the guard and
    MMR embed is charged at admission."""
    from kb_rerank.guard import verdict

    # no cap on the guard's embedding wait: on a loaded machine it would cut the work short and
    # refund what was not embedded
    s = settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=1, rate_limit_burst=1000,
                       guard_embed_timeout_s=3600,
                       rate_work_conserving=False)  # the full prices: this test measures them
    long_doc = " ".join(f"paragraph {i} on refunds, credit notes and invoices." for i in range(300))[:19_000]
    n_pieces = len(verdict.pieces(long_doc, s.chunk_max_chars, s.chunk_overlap))
    assert n_pieces > 10
    tenant = uuid.uuid4()
    levels: list[float] = []  # the tenant's bucket when each embedding call starts

    class Watching:
        name, dim = embedder.name, embedder.dim

        def embed_query(self, text):
            levels.append(bucket.level(tenant))
            return embedder.embed_query(text)

        def embed_passages(self, texts):
            levels.append(bucket.level(tenant))
            return embedder.embed_passages(texts)

    app = create_app(s, reranker=FakeReranker(), embedder=Watching())
    with TestClient(app) as client:
        bucket = app.state.limits.tenant_rate
        # the bucket's clock stopped for the request: its level is what was charged, not what
        # refilled while a loaded machine embedded the pieces
        now = bucket.clock()
        bucket.clock = lambda: now
        r = client.post("/v2/rerank", json={"query": "refunds", "documents": [long_doc, "short"], "lambda": 0.7},
                        headers=bearer(tenant))
        assert r.status_code == 200, r.text
        pieces = 1 + s.rate_cost_per_document * 2 + s.rate_cost_per_embedding * n_pieces
        # every piece was paid for before the first embedding ran
        assert levels and levels[0] == pytest.approx(1000 - pieces, abs=1e-9), levels[:3]
        # and in all one embedding more (the query's, for MMR); ordinary text: no span to debit
        # after the fact
        assert bucket.level(tenant) == pytest.approx(1000 - pieces - s.rate_cost_per_embedding, abs=1e-9)
