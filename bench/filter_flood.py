"""Tenant B's lexical searches while tenant A floods ``/v1/kb/search/rerank`` with a 1 KB filter
of 16 date ranges over its documents (by default 20,000 documents of 64 metadata keys),
against a real server (uvicorn on a loopback port, the embedded PostgreSQL): B's latency
alone, then during the flood, and their ratio (the target: p95 within 2x of B alone), A's
answers by status (the target: 429s, and no 503 from a saturated database).

Default limits and prices. A's documents are written by SQL (metadata only, no chunks: the
filter is the work measured; B's knowledge base is the shipped demo one, ingested). The
cross-encoder is a constant test double. Run it on the version to measure; for the version
before, put its ``src`` first on ``PYTHONPATH``:

    .venv/bin/python bench/filter_flood.py [--docs 20000] [--flooders 5] [--queries 30]
    git archive main src | tar -x -C /tmp/base && PYTHONPATH=/tmp/base/src .venv/bin/python bench/filter_flood.py --label main

Results: bench/results/filter-flood-<label>.json (``--label``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psycopg  # noqa: E402
import uvicorn  # noqa: E402

import kb_rerank  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.app import create_app  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

from embed_fairness import SECRET, ConstantReranker, free_port, p  # noqa: E402

KEYS = 64
# 16 date ranges on 16 of the 64 keys: 1 KB of JSON
FILTER = {f"key_{i:02d}": {"$gte": f"20{10 + i % 10}-01-01T00:00:00Z", "$lt": f"20{11 + i % 10}-06-30T23:59:59Z"}
          for i in range(16)}

# A's documents: 64 keys each, dates spread over 2010-2029 (every key a date: the worst case
# for the ranges), in one statement
INSERT_A = f"""
insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)
select %s, 'a/' || g || '.md', 'doc ' || g, md5(g::text),
       (select jsonb_object_agg('key_' || lpad(k::text, 2, '0'),
                                to_char(date '2010-01-01' + ((g * 7919 + k * 104729) %% 7300), 'YYYY-MM-DD'))
        from generate_series(0, {KEYS - 1}) as k)
from generate_series(1, %s) as g
"""


class StubEmbedder:
    """B searches lexically: its chunks' vectors are not read, so ingestion writes zeros."""
    name = "bench-stub"

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def embed_query(self, text):
        return np.zeros(self.dim, dtype=np.float32)

    def embed_passages(self, texts):
        return np.zeros((len(texts), self.dim), dtype=np.float32)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000, help="A's documents (64 metadata keys each)")
    ap.add_argument("--flooders", type=int, default=5, help="A's concurrent clients")
    ap.add_argument("--queries", type=int, default=30, help="B's searches in each phase")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between B's searches")
    ap.add_argument("--label", default="run")
    ap.add_argument("--timeout", type=float, default=60.0, help="B's client timeout, seconds")
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="kb-filter-flood-"))
    settings = Settings(data_dir=data, jwt_secret=SECRET)
    db.migrate(settings)
    tenant_b, tenant_a = uuid.uuid4(), uuid.uuid4()
    from kb_rerank.ingest.loader import ingest_paths
    from kb_rerank.core.session import configure_connection, tenant_transaction

    kb = Path(kb_rerank.__file__).parent / "demo_kb"
    t0 = time.perf_counter()
    with psycopg.connect(db.app_url(settings)) as conn:
        configure_connection(conn)
        ingest_paths(conn, tenant_b, [kb], StubEmbedder(settings.embedding_dim), settings)
        with tenant_transaction(conn, tenant_a):
            conn.execute(INSERT_A, [tenant_a, args.docs])
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        conn.execute("analyze")
    setup_s = time.perf_counter() - t0

    app = create_app(settings, reranker=ConstantReranker())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    jwt = JwtConfig(secret=SECRET)
    hb = {"Authorization": "Bearer " + mint_token(tenant_b, jwt)}
    ha = {"Authorization": "Bearer " + mint_token(tenant_a, jwt)}
    a_statuses: dict[str, int] = {}
    a_ms: list[float] = []
    b_statuses: dict[str, int] = {}

    async def b_phase(client: httpx.AsyncClient, tag: str) -> list[float]:
        out = []
        for i in range(args.queries):
            q = f"{tag} {i} {uuid.uuid4().hex[:6]} how do I export reports to csv"
            t0 = time.perf_counter()
            try:
                r = await client.post(base + "/v1/kb/search/rerank", json={"query": q, "source": "lexical_only"},
                                      headers=hb, timeout=args.timeout)
                status = str(r.status_code)
            except httpx.TimeoutException:
                status = "timeout"
            dt = time.perf_counter() - t0
            b_statuses[status] = b_statuses.get(status, 0) + 1
            if status in ("200", "timeout"):
                out.append(dt * 1000.0)
            await asyncio.sleep(max(0.0, args.interval - dt))
        return out

    async def flood(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            q = f"invoices {uuid.uuid4().hex[:8]}"  # a miss every time
            t0 = time.perf_counter()
            try:
                r = await client.post(base + "/v1/kb/search/rerank",
                                      json={"query": q, "source": "lexical_only", "filter": FILTER},
                                      headers=ha, timeout=120)
            except httpx.HTTPError as exc:
                a_statuses[type(exc).__name__] = a_statuses.get(type(exc).__name__, 0) + 1
                continue
            a_statuses[str(r.status_code)] = a_statuses.get(str(r.status_code), 0) + 1
            if r.status_code == 200:
                a_ms.append((time.perf_counter() - t0) * 1000.0)
            if r.status_code == 429:
                await asyncio.sleep(0.5)  # as bench/embed_fairness.py's flooders

    async def run() -> dict:
        async with httpx.AsyncClient(timeout=120) as client:
            await b_phase(client, "warm")
            alone = await b_phase(client, "alone")
            stop = asyncio.Event()
            flooders = [asyncio.ensure_future(flood(client, stop)) for _ in range(args.flooders)]
            await asyncio.sleep(2.0)
            during = await b_phase(client, "flood")
            stop.set()
            await asyncio.gather(*flooders, return_exceptions=True)
        return {"alone_ms": alone, "during_ms": during}

    got = asyncio.run(run())
    server.should_exit = True
    thread.join(30)
    res = {
        "label": args.label, "version": kb_rerank.__file__, "cores": os.cpu_count(),
        "a_documents": args.docs, "keys": KEYS, "filter_bytes": len(json.dumps(FILTER)),
        "flooders": args.flooders, "setup_s": round(setup_s, 1),
        "b_alone": {"p50": p(got["alone_ms"], 50), "p95": p(got["alone_ms"], 95)},
        "b_during": {"p50": p(got["during_ms"], 50), "p95": p(got["during_ms"], 95)},
        "a_statuses": a_statuses, "a_200_p50_ms": p(a_ms, 50) if a_ms else None, "b_statuses": b_statuses,
    }
    res["p95_ratio"] = res["b_during"]["p95"] / res["b_alone"]["p95"]
    out = Path(__file__).parent / "results" / f"filter-flood-{args.label}.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    db.stop_embedded(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
