"""The remote cross-encoder (``KB_RERANKER_BACKEND=remote``): its contract
with a test inference server that implements the published APIs (text-embeddings-inference
``POST /rerank`` and the Cohere-compatible ``POST /v2/rerank``) with the tiny cross-encoder,
its budget, retries and fallbacks, and the app's use of it."""

from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest
from litestar import Litestar, Request, Response, post
from litestar.testing import TestClient

from kb_rerank.app import build_reranker, create_app
from kb_rerank.models.cross_encoder import Reranker, RerankerError, RerankerTimeout
from kb_rerank.models.remote import COHERE, TEI, RemoteReranker, protocol_of

from tests.live_server import OPS
from tests.endpoints.test_rerank_route import OPS_TOKEN, SECRET, bearer, tiny_model_dir  # noqa: F401 - module fixture

PASSAGES = ["Refunds go back to the original card within five days.",
            "ERR_402 means the card was declined at checkout.",
            "Two-factor authentication protects the account."]
QUERY = "what does ERR_402 mean"


class InferenceServer:
    """A test server speaking TEI's and Cohere's rerank APIs with the tiny model. ``fail``:
    status codes to answer, one per call, before answering normally; ``delay`` seconds per
    call; ``key``: the bearer token it requires."""

    def __init__(self, model: Reranker, *, fail=(), delay: float = 0.0, key: str | None = None) -> None:
        self.model, self.fail, self.delay, self.key = model, list(fail), delay, key
        self.calls = 0

        async def answer(request: Request, body: dict, cohere: bool) -> Response:
            self.calls += 1
            if self.key and request.headers.get("authorization") != f"Bearer {self.key}":
                return Response({"error": "unauthorized"}, status_code=401)
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail:
                return Response({"error": "busy"}, status_code=self.fail.pop(0))
            texts = body["documents"] if cohere else body["texts"]
            scores = self.model.score(body["query"], texts)
            order = sorted(range(len(texts)), key=lambda i: -scores[i])  # both APIs answer in score order
            if cohere:
                return Response({"id": "x", "results": [{"index": i, "relevance_score": scores[i]} for i in order],
                                 "meta": {}})
            return Response([{"index": i, "score": scores[i]} for i in order])

        @post("/rerank", status_code=200)
        async def tei(request: Request, data: dict) -> Response:
            return await answer(request, data, False)

        @post("/v2/rerank", status_code=200)
        async def cohere(request: Request, data: dict) -> Response:
            return await answer(request, data, True)

        self.app = Litestar(route_handlers=[tei, cohere])

    def transport(self) -> httpx.AsyncBaseTransport:
        return httpx.ASGITransport(app=self.app)


@pytest.fixture(scope="module")
def local(tiny_model_dir):
    r = Reranker(str(tiny_model_dir), device="cpu", batch_size=32, max_length=256)
    r.load()
    yield r
    r.close()


def remote(server: InferenceServer, url: str = "http://inference/rerank", **kw) -> RemoteReranker:
    return RemoteReranker(url, model_name="tiny", transport=server.transport(), **kw)


def test_url_path_chooses_the_protocol():
    assert protocol_of("http://tei:8080") == (TEI, "http://tei:8080/rerank")
    assert protocol_of("http://tei:8080/rerank") == (TEI, "http://tei:8080/rerank")
    assert protocol_of("https://api.example/v2/rerank") == (COHERE, "https://api.example/v2/rerank")


@pytest.mark.parametrize("url", ["http://inference", "http://inference/v2/rerank"])
def test_remote_scores_are_the_models_in_passage_order(local, url):
    server = InferenceServer(local)
    got = asyncio.run(remote(server, url).ascore(QUERY, PASSAGES))
    want = local.score(QUERY, PASSAGES)
    # the server answers in score order; for these passages that is not their order, so the
    # client's mapping back by index is what this checks
    assert sorted(range(len(want)), key=lambda i: -want[i]) != list(range(len(want)))
    assert got == pytest.approx(want, abs=1e-6)


def test_a_busy_server_is_retried_within_the_budget(local):
    server = InferenceServer(local, fail=[503, 429])
    r = remote(server, timeout_s=10)
    assert asyncio.run(r.ascore(QUERY, PASSAGES)) == pytest.approx(local.score(QUERY, PASSAGES), abs=1e-6)
    assert server.calls == 3


@pytest.mark.parametrize("fail,calls", [([400], 1), ([500, 500, 500, 500], 3)])
def test_a_refusal_or_a_broken_server_is_a_model_error(local, fail, calls):
    server = InferenceServer(local, fail=fail)
    with pytest.raises(RerankerError) as ei:
        asyncio.run(remote(server, timeout_s=10, retries=2).ascore(QUERY, PASSAGES))
    assert not isinstance(ei.value, RerankerTimeout)
    assert server.calls == calls


def test_a_slow_server_is_a_timeout_within_the_budget(local):
    server = InferenceServer(local, delay=2.0)

    async def call():
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(RerankerTimeout):
            await remote(server, timeout_s=0.3).ascore(QUERY, PASSAGES)
        return loop.time() - t0

    assert asyncio.run(call()) < 1.5


def test_the_api_key_is_sent_as_a_bearer_token(local):
    server = InferenceServer(local, key="s3cret-key")
    assert len(asyncio.run(remote(server, api_key="s3cret-key").ascore(QUERY, PASSAGES))) == 3
    with pytest.raises(RerankerError):
        asyncio.run(remote(InferenceServer(local, key="s3cret-key"), api_key="wrong").ascore(QUERY, PASSAGES))


def test_backend_setting_builds_the_remote_client_or_refuses(settings):
    r = build_reranker(settings.with_(reranker_backend="remote", reranker_url="http://tei:8080"))
    assert isinstance(r, RemoteReranker) and r.url == "http://tei:8080/rerank"
    with pytest.raises(ValueError, match="KB_RERANKER_URL"):
        build_reranker(settings.with_(reranker_backend="remote", reranker_url=""))
    with pytest.raises(ValueError, match="KB_RERANKER_BACKEND"):
        build_reranker(settings.with_(reranker_backend="tensorrt"))


@pytest.mark.parametrize("fail,reason", [([], None), ([500] * 9, "model_error")])
def test_the_service_serves_through_the_remote_backend_and_falls_back(local, settings, embedder, sample_tenant,
                                                                      fail, reason):
    server = InferenceServer(local, fail=fail)
    rr = remote(server, timeout_s=5)
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN), reranker=rr, embedder=embedder)
    with TestClient(app) as client:
        r = client.post("/v1/kb/search/rerank", json={"query": f"ERR_402 at checkout {uuid.uuid4().hex[:6]}"},
                        headers=bearer(sample_tenant))
        ready = client.get("/readyz", headers=OPS).json()
    assert r.status_code == 200, r.text
    assert r.json()["fallback_reason"] == reason
    assert server.calls >= 1
    # the probe of /readyz: a server answering 500 cannot score
    assert ready["model"]["backend"] == "remote"
    assert ready["model"]["state"] == ("remote" if reason is None else "unreachable")
    assert ready["status"] == ("ready" if reason is None else "degraded")
