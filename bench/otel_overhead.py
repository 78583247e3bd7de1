"""What OpenTelemetry costs a request (kb_rerank.http.tracing), measured on the cheapest path: result
cache hits of POST /v1/kb/search/rerank, in process (ASGI, no network), one request at a time.

Three arms, interleaved in rounds (each round runs every arm in a shuffled order, ``--per-round``
requests each, the same queries), so that drift of the machine falls on every arm alike:

* ``before`` -- tracing off, with ``kb_rerank.core.timing.stage`` swapped for the code of
  main before this change (325d84f: no span hook at all);
* ``off`` -- tracing off, today's code: the hook's off path (one context-variable read per stage);
* ``on`` -- tracing on as ``OTEL_EXPORTER_OTLP_ENDPOINT`` turns it on (server span, stage spans,
  SQL spans, BatchSpanProcessor, the OTLP/HTTP exporter) exporting to a sink on loopback that
  accepts and discards: informative (what a traced request costs), not a criterion.

``before`` and ``off`` are first compared alone (phase 1, before the process has instrumented
psycopg: instrumentation is process-wide, and the ``off`` app must not pay for it); then ``off``
and ``on`` (phase 2). The criterion: ``off / before`` of the median latencies within noise; the
noise is the spread of that ratio over the rounds (its 5th..95th percentile) and the ratio of
two halves of ``before`` itself. Also a micro-benchmark of the hook alone: ``with
timing.stage(...)`` in a loop, both versions, inside a request record.

Database: the embedded server under --data-dir (created and migrated on first use), the sample
KB ingested into one tenant. Cross-encoder: a fake (hits never call it). Writes
bench/results/otel-overhead.json and .md. Run:

    OPENBLAS_NUM_THREADS=1 HF_HUB_OFFLINE=1 python bench/otel_overhead.py [--rounds 40] [--per-round 25]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.server
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
import timeit
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for _k in [k for k in os.environ if k.startswith("OTEL_")]:
    del os.environ[_k]  # phase 1 runs without tracing, whatever the shell says

import psycopg  # noqa: E402

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.app import create_app  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.models.embedders import get_embedder  # noqa: E402
from kb_rerank.core import timing  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from pair_cache_bench import load_tenant  # noqa: E402  (bench/: the sample KB in a fresh tenant)

ROOT = Path(__file__).resolve().parents[1]
SECRET = "kb-rerank-bench-secret-0123456789abcdef"
URL = "/v1/kb/search/rerank"
QUERIES = ["how do I issue a refund", "API rate limits", "change the account owner", "create a credit note",
           "data retention", "ERR_402", "export reports to csv", "recurring invoices", "reset my password",
           "two-factor authentication", "webhooks guide", "configure VAT rates"]


# ----------------------------------------------------------------- the stage of main before the change
@contextlib.contextmanager
def stage_before(name: str) -> Iterator[None]:
    """kb_rerank.core.timing.stage at 325d84f, verbatim."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stages = timing._STAGES.get()
        if stages is not None:
            stages[name] = stages.get(name, 0.0) + (time.perf_counter() - t0) * 1000.0


STAGE_NOW = timing.stage


class FakeReranker:
    model_name = "fake-reranker"
    ready = True

    async def ascore(self, query, passages):
        return [int(hashlib.sha256(p.encode()).hexdigest()[:6], 16) / 0xFFFFFF for p in passages]

    async def ensure_loaded_async(self):
        return True


class Sink:
    """An OTLP/HTTP endpoint that reads each export and answers 200 (the spans are dropped)."""

    def __init__(self) -> None:
        self.posts = 0
        sink = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                sink.posts += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def micro(n: int = 200_000) -> dict:
    """ns per ``with stage(...)`` inside a request record, both versions, best of 5."""
    token, _ = timing.start()
    try:
        out = {}
        for label, fn in (("before", stage_before), ("off", STAGE_NOW)):
            def loop(fn=fn):
                with fn("cache"):
                    pass
            out[label] = min(timeit.repeat(loop, number=n, repeat=5)) / n * 1e9
        return {k: round(v, 1) for k, v in out.items()} | {"extra_ns": round(out["off"] - out["before"], 1)}
    finally:
        timing.stop(token)


def start(args) -> Settings:
    base = Settings(data_dir=Path(args.data_dir), database_name=args.db)
    owner = db.migrate(base)
    return base.with_(database_url=owner, jwt_secret=SECRET, rate_limit_per_minute=0,
                     address_rate_limit_per_minute=0, cache_ttl_s=3600)


async def timed_requests(client, headers, n: int, rng: random.Random) -> list[float]:
    out = []
    for _ in range(n):
        q = QUERIES[rng.randrange(len(QUERIES))]
        t0 = time.perf_counter()
        r = await client.post(URL, json={"query": q}, headers=headers)
        out.append((time.perf_counter() - t0) * 1000.0)
        assert r.status_code == 200 and r.json()["from_cache"] is True, r.text
    return out


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(p * (len(xs) - 1))))]


def summary(ms: list[float]) -> dict:
    return {"n": len(ms), "median_ms": round(statistics.median(ms), 4), "p90_ms": round(pct(ms, 0.9), 4),
            "mean_ms": round(statistics.fmean(ms), 4)}


async def interleave(arms: dict, headers, rounds: int, per_round: int, seed: int) -> dict:
    """{arm: [ms...]} and per-round medians, every arm in every round (shuffled order)."""
    rng = random.Random(seed)
    times = {a: [] for a in arms}
    rounds_med = {a: [] for a in arms}
    for _ in range(rounds):
        order = list(arms)
        rng.shuffle(order)
        for a in order:
            client, stage_fn = arms[a]
            timing.stage = stage_fn
            try:
                qrng = random.Random(len(times[a]))  # the same queries for every arm
                ms = await timed_requests(client, headers, per_round, qrng)
            finally:
                timing.stage = STAGE_NOW
            times[a] += ms
            rounds_med[a].append(statistics.median(ms))
    return {"times": times, "rounds": rounds_med}


def ratio_stats(num: list[float], den: list[float]) -> dict:
    per_round = [a / b for a, b in zip(num, den)]
    return {"median_ratio": round(statistics.median(per_round), 4), "p05": round(pct(per_round, 0.05), 4),
            "p95": round(pct(per_round, 0.95), 4)}


async def main_async(args) -> dict:
    from litestar.testing import AsyncTestClient

    settings = start(args)
    embedder = get_embedder(settings)
    tenant = load_tenant(settings, embedder)
    headers = {"Authorization": "Bearer " + mint_token(tenant, JwtConfig(secret=SECRET), ttl_s=7200)}
    pool = {"pool_min": 2, "pool_max": 4}
    off_app = create_app(settings.with_(**pool), reranker=FakeReranker(), embedder=embedder)
    assert off_app.state.tracing is None
    out: dict = {"micro_stage_ns": micro()}
    async with AsyncTestClient(off_app) as off:
        for q in QUERIES:  # the cache rows every timed request hits
            assert (await off.post(URL, json={"query": q}, headers=headers)).status_code == 200
        await timed_requests(off, headers, 50, random.Random(0))  # warm-up
        p1 = await interleave({"before": (off, stage_before), "off": (off, STAGE_NOW)}, headers,
                              args.rounds, args.per_round, args.seed)
        assert "opentelemetry.sdk" not in sys.modules  # phase 1 ran with nothing of the SDK loaded

        sink = Sink()
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = sink.url
        try:
            on_app = create_app(settings.with_(**pool), reranker=FakeReranker(), embedder=embedder)
        finally:
            del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert on_app.state.tracing is not None
        async with AsyncTestClient(on_app) as on:
            await timed_requests(on, headers, 50, random.Random(0))
            p2 = await interleave({"off": (off, STAGE_NOW), "on": (on, STAGE_NOW)}, headers,
                                  max(1, args.rounds // 2), args.per_round, args.seed + 1)
        posts = sink.posts  # the lifespan's shutdown flushed the batches
    t1, t2 = p1["times"], p2["times"]
    half = len(p1["rounds"]["before"]) // 2
    out |= {
        "phase1": {a: summary(v) for a, v in t1.items()},
        "phase2": {a: summary(v) for a, v in t2.items()},
        "off_over_before": round(statistics.median(t1["off"]) / statistics.median(t1["before"]), 4),
        "off_over_before_rounds": ratio_stats(p1["rounds"]["off"], p1["rounds"]["before"]),
        # noise floor: the same code against itself (the first half of the rounds against the second)
        "before_halves": round(statistics.median(p1["rounds"]["before"][:half])
                               / statistics.median(p1["rounds"]["before"][half:]), 4),
        "on_over_off": round(statistics.median(t2["on"]) / statistics.median(t2["off"]), 4),
        "on_over_off_rounds": ratio_stats(p2["rounds"]["on"], p2["rounds"]["off"]),
        "otlp_posts_received": posts,
        "rounds": args.rounds, "per_round": args.per_round, "seed": args.seed,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "OPENBLAS_NUM_THREADS=1 HF_HUB_OFFLINE=1 python bench/otel_overhead.py " + " ".join(
            sys.argv[1:] if args.argv is None else args.argv),
    }
    return out


def markdown(o: dict) -> str:
    p1, p2, r1, r2 = o["phase1"], o["phase2"], o["off_over_before_rounds"], o["on_over_off_rounds"]
    return "\n".join([
        "# OpenTelemetry overhead (cache hits, POST /v1/kb/search/rerank, in process)", "",
        f"{o['date']}, {o['machine']}. `{o['command']}`", "",
        "| arm | requests | median ms | p90 ms | mean ms |", "|---|---:|---:|---:|---:|",
        *[f"| phase 1: {a} | {s['n']} | {s['median_ms']:.3f} | {s['p90_ms']:.3f} | {s['mean_ms']:.3f} |"
          for a, s in p1.items()],
        *[f"| phase 2: {a} | {s['n']} | {s['median_ms']:.3f} | {s['p90_ms']:.3f} | {s['mean_ms']:.3f} |"
          for a, s in p2.items()], "",
        f"- **tracing off vs before the change** (`off / before`, median latency): **{o['off_over_before']:.4f}**;"
        f" per round {r1['median_ratio']:.4f} (5th..95th percentile {r1['p05']:.3f}..{r1['p95']:.3f}); the"
        f" same code against itself (first half of the rounds / second half) {o['before_halves']:.4f}.",
        f"- the hook alone: `with timing.stage(...)` {o['micro_stage_ns']['before']} ns before,"
        f" {o['micro_stage_ns']['off']} ns with tracing off ({o['micro_stage_ns']['extra_ns']:+} ns a stage;"
        " a cache hit runs one or two stages).",
        f"- informative, **tracing on** (server, stage and SQL spans, batched OTLP/HTTP export to a loopback sink:"
        f" {o['otlp_posts_received']} exports received): `on / off` {o['on_over_off']:.4f}, per round"
        f" {r2['median_ratio']:.4f} ({r2['p05']:.3f}..{r2['p95']:.3f}).", "",
        "`before` is tracing off with `kb_rerank.core.timing.stage` swapped for main's code before the"
        " change (325d84f); `off` is today's code with tracing off; the arms alternate in shuffled rounds"
        " on the same app, queries and cache rows. `on` is a second app in the same process, created with"
        " `OTEL_EXPORTER_OTLP_ENDPOINT` set, after phase 1 (psycopg's instrumentation is process-wide).", ""])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--per-round", type=int, default=25)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--data-dir", default="/tmp/kb-otel-bench")
    p.add_argument("--db", default="kb_otel_bench")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "otel-overhead"),
                   help="writes OUT.json and OUT.md")
    args = p.parse_args(argv)
    args.argv = argv
    o = asyncio.run(main_async(args))
    md = markdown(o)
    Path(args.out + ".json").write_text(json.dumps(o, indent=2) + "\n", encoding="utf-8")
    Path(args.out + ".md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
