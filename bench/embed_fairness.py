"""Tenant B's semantic-search misses while tenant A floods ``/v2/rerank`` with 50 maximum-size
documents a request, against a real server (uvicorn on a loopback port, the embedded
PostgreSQL, the app's own embedders): B's latency alone, then during the flood, and their
ratio (the target: p95 within 2x of B alone), A's answers by status, and no 5xx.

The default limits stay on (a tenant's bucket, its slots); ``--no-limits`` turns the rate
buckets off, so that only the embedder's scheduling stands between A and B. The cross-encoder
is a constant test double (the embedder is what is measured). Run it on the version to
measure; for the version before, put its ``src`` first on ``PYTHONPATH``:

    .venv/bin/python bench/embed_fairness.py [--queries 30] [--flooders 2] [--doc-chars 20000]
    git archive <commit> src | tar -x -C /tmp/base && PYTHONPATH=/tmp/base/src .venv/bin/python bench/embed_fairness.py

Results: bench/results/embed-fairness-<label>.json (``--label``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import tempfile
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import httpx  # noqa: E402
import psycopg  # noqa: E402
import uvicorn  # noqa: E402

import kb_rerank  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.app import create_app  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

SECRET = "kb-rerank-bench-secret-0123456789abcdef"
WORDS = ("invoice customer payment subscription report export settings account owner webhook signature tax "
         "rate currency refund credit note password security role admin member reminder schedule").split()


class ConstantReranker:
    model_name, ready = "constant-bench-reranker", True

    async def ascore(self, query, passages, **kw):
        return [0.5 for _ in passages]

    async def ensure_loaded_async(self):
        return True


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def text(n_chars: int, seed: int) -> str:
    """Ordinary-looking text, different in every piece (no two pieces embed the same)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < n_chars:
        w = rng.choice(WORDS) + (str(rng.randrange(1000)) if rng.random() < 0.2 else "")
        out.append(w)
        size += len(w) + 1
    return " ".join(out)[:n_chars]


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queries", type=int, default=30, help="B's misses in each phase")
    ap.add_argument("--flooders", type=int, default=2, help="A's concurrent clients")
    ap.add_argument("--doc-chars", type=int, default=20_000,
                    help="characters of each of A's 50 documents (KB_V2_MAX_DOCUMENT_CHARS: the largest allowed)")
    ap.add_argument("--no-limits", action="store_true", help="rate buckets off")
    ap.add_argument("--interval", type=float, default=0.5,
                    help="seconds between B's queries (within its own bucket at the default prices)")
    ap.add_argument("--label", default="run")
    ap.add_argument("--timeout", type=float, default=120.0, help="B's client timeout, seconds")
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="kb-fair-"))
    settings = Settings(data_dir=data, jwt_secret=SECRET, **({"rate_limit_per_minute": 0} if args.no_limits else {}))
    db.migrate(settings)
    owner = db.owner_url(settings)
    tenant_b, tenant_a = uuid.uuid4(), uuid.uuid4()
    from kb_rerank.ingest.loader import ingest_paths
    from kb_rerank.models.embedders import get_embedder
    from kb_rerank.core.session import configure_connection

    kb = Path(kb_rerank.__file__).parent / "demo_kb"
    with psycopg.connect(db.app_url(settings), autocommit=True) as conn:
        configure_connection(conn)
        ingest_paths(conn, tenant_b, [kb], get_embedder(settings), settings)

    app = create_app(settings, reranker=ConstantReranker())  # the app builds its own embedders
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
    docs = [text(args.doc_chars, i) for i in range(50)]
    statuses: dict[str, int] = {}
    a_started = [0]
    b_statuses: dict[str, int] = {}

    async def b_phase(client: httpx.AsyncClient, tag: str) -> list[float]:
        out = []
        for i in range(args.queries):
            q = f"{tag} {i} {uuid.uuid4().hex[:6]} how do I export reports to csv"
            t0 = time.perf_counter()
            try:
                r = await client.post(base + "/v1/kb/search/rerank", json={"query": q, "source": "semantic_only"},
                                      headers=hb, timeout=args.timeout)
                status = str(r.status_code)
            except httpx.TimeoutException:
                status = "timeout"  # counted at the client's limit: the answer took at least that
            dt = time.perf_counter() - t0
            b_statuses[status] = b_statuses.get(status, 0) + 1
            if status in ("200", "timeout"):
                out.append(dt * 1000.0)
            await asyncio.sleep(max(0.0, args.interval - dt))
        return out

    async def flood(client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            a_started[0] += 1
            try:
                r = await client.post(base + "/v2/rerank", json={"query": "summarise the invoices", "documents": docs},
                                      headers=ha, timeout=600)
                statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
                if r.status_code == 429:
                    await asyncio.sleep(0.5)
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] = statuses.get(type(exc).__name__, 0) + 1

    async def run() -> dict:
        async with httpx.AsyncClient(timeout=120) as client:
            await b_phase(client, "warm")
            alone = await b_phase(client, "alone")
            stop = asyncio.Event()
            flooders = [asyncio.ensure_future(flood(client, stop)) for _ in range(args.flooders)]
            await asyncio.sleep(3.0)  # A's requests are in their embeddings
            during = await b_phase(client, "flood")
            stop.set()
            for f in flooders:
                f.cancel()
            await asyncio.gather(*flooders, return_exceptions=True)
        return {"alone_ms": alone, "during_ms": during}

    got = asyncio.run(run())
    server.should_exit = True
    thread.join(30)
    res = {
        "label": args.label, "version": kb_rerank.__file__, "cores": os.cpu_count(),
        "flooders": args.flooders, "doc_chars": args.doc_chars, "limits": not args.no_limits,
        "b_alone": {"p50": p(got["alone_ms"], 50), "p95": p(got["alone_ms"], 95)},
        "b_during": {"p50": p(got["during_ms"], 50), "p95": p(got["during_ms"], 95)},
        "a_requests_started": a_started[0], "a_statuses": statuses, "b_statuses": b_statuses,
        "b_interval_s": args.interval,
    }
    res["p95_ratio"] = res["b_during"]["p95"] / res["b_alone"]["p95"]
    out = Path(__file__).parent / "results" / f"embed-fairness-{args.label}.json"
    out.write_text(json.dumps(res, indent=2) + "\n")
    print(json.dumps(res, indent=2))
    db.stop_embedded(settings)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
