"""A request nobody waits for stops: a client that posts a large `/v2/rerank` body to a live
server (uvicorn on a loopback port) and disconnects has its work cancelled: the embedding units
not started are dropped (the embedder runs far fewer texts than the request submitted), the
abandonment is counted and logged in one line, and the tenant's next request is served at once
instead of queueing behind the abandoned one."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid

import httpx
import numpy as np
import pytest

from kb_rerank.app import create_app

from tests.live_server import OPS, OPS_TOKEN, SECRET, FakeReranker, bearer, metric_values, serve_in_thread, wait_until

UNIT_S = 0.1  # the slow embedder's time per call (one unit of at most embed_unit_chars characters)


class SlowEmbedder:
    """An embedder of no learned detector's dimension (the guard's classifier stays off; MMR
    embeds every document) that takes UNIT_S a call and counts the texts it embedded."""

    name, dim = "slow-test-embedder", 16

    def __init__(self) -> None:
        self.texts = 0
        self.lock = threading.Lock()

    def _vectors(self, n: int) -> np.ndarray:
        v = np.random.default_rng(n).standard_normal((n, self.dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def embed_query(self, text: str) -> np.ndarray:
        return self._vectors(1)[0]

    def embed_passages(self, texts) -> np.ndarray:
        time.sleep(UNIT_S)
        with self.lock:
            self.texts += len(texts)
        return self._vectors(len(texts))


def _post_and_leave(base: str, tenant, body: bytes, after_s: float) -> None:
    """POST ``body`` to /v2/rerank on a raw socket, wait ``after_s``, close without reading."""
    host, port = base.removeprefix("http://").split(":")
    head = (f"POST /v2/rerank HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Authorization: {bearer(tenant)['Authorization']}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head + body)
        time.sleep(after_s)
        s.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def server(settings):
    embedder = SlowEmbedder()
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0, ops_token=OPS_TOKEN),
                     reranker=FakeReranker(), embedder=embedder)
    with serve_in_thread(app) as base:
        yield base, embedder


def test_a_disconnected_client_stops_its_work(server, caplog):
    base, embedder = server
    tenant = uuid.uuid4()
    # every chunk a text of its own (a text repeated is embedded once per request)
    docs = [" ".join(f"refund{i}x{j}" for j in range(2_000))[:20_000] for i in range(50)]
    body = json.dumps({"query": "refunds", "documents": docs, "lambda": 0.5}).encode()  # MMR asked for: its embeddings
    # 50 documents of 20,000 characters: ~17 chunks each for the embeddings MMR needs (asked for), one a unit
    submitted = 50 * 17
    with caplog.at_level(logging.INFO, logger="kb_rerank.endpoints.serve"):
        _post_and_leave(base, tenant, body, after_s=1.5)
        with httpx.Client(base_url=base, timeout=30) as client:
            assert wait_until(lambda: metric_values(client.get("/metrics", headers=OPS).text)
                       .get("kb_rerank_abandoned_total{route=/v2/rerank}", 0) == 1, timeout=10)
            ran = embedder.texts
            time.sleep(10 * UNIT_S)
            assert embedder.texts <= ran + 2  # at most the units under way finish; nothing new starts
            assert embedder.texts < submitted / 5, (embedder.texts, submitted)
            # the tenant's next request is served now, not after the abandoned one's units
            small = client.post("/v2/rerank", json={"query": "refunds", "documents": ["refunds", "invoices"]},
                                headers=bearer(tenant))
            assert small.status_code == 200, small.text
    lines = [r.getMessage() for r in caplog.records if "client disconnected" in r.getMessage()]
    assert len(lines) == 1 and f"tenant={tenant}" in lines[0] and "/v2/rerank" in lines[0]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
