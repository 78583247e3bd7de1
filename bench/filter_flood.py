"""Tenant B's lexical searches while tenant A floods ``/v1/kb/search/rerank`` with a 1 KB filter
of 16 date ranges over its documents (by default 20,000 documents of 64 metadata keys), against
real servers (uvicorn on loopback ports, each in a process of its own, one embedded PostgreSQL):
B alone and B during the flood, in interleaved rounds (alone, flood, alone, flood, ... on one
database), p50/p95 of each phase and their ratio (the target: p95 during within 2x of alone),
and A's answers by status (the target: 429s, and no 503 from a saturated database).

Several versions can be measured in one run, alternating in every round (the order flips from
one round to the next), each served by its own process with its own ``PYTHONPATH``; they share
the database, so they must share its schema and SQL layer (this script's setup migrates it with
the first version). The clients run in this process, apart from the servers.

Default limits and prices. A's documents are written by SQL (metadata only, no chunks: the
filter is the work measured); B's knowledge base is the shipped demo one, ingested. The
cross-encoder is a constant test double and the embedder a stub (both tenants search lexically).

    git archive main src | tar -x -C /tmp/flood-main
    .venv/bin/python bench/filter_flood.py --version branch=src --version main=/tmp/flood-main/src
    .venv/bin/python bench/filter_flood.py --quick ...   # 2 rounds of 10 searches a phase: under 5 minutes

Results: bench/results/filter-flood[-<label>].{json,md} (``--label``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import psycopg  # noqa: E402

HERE = Path(__file__).resolve().parent
SECRET = "kb-rerank-bench-secret-0123456789abcdef"
KEYS = 64
# 16 date ranges on 16 of the 64 keys: 1 KB of JSON
FILTER = {f"key_{i:02d}": {"$gte": f"20{10 + i % 10}-01-01T00:00:00Z", "$lt": f"20{11 + i % 10}-06-30T23:59:59Z"}
          for i in range(16)}
# (--filter wide) the same 16 keys, each range holding every document: nothing narrows the
# documents early, every range reads all of them (the most a 16-range filter costs)
WIDE = {k: {"$gte": "2000-01-01T00:00:00Z", "$lt": "2099-12-31T23:59:59Z"} for k in FILTER}

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
    """Both tenants search lexically: no vector is read, so ingestion and queries get zeros."""
    name = "bench-stub"

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def embed_query(self, text):
        return np.zeros(self.dim, dtype=np.float32)

    def embed_passages(self, texts):
        return np.zeros((len(texts), self.dim), dtype=np.float32)


class ConstantReranker:
    model_name, ready = "constant-bench-reranker", True

    async def ascore(self, query, passages, **kw):
        return [0.5] * len(passages)

    def score(self, query, passages, **kw):
        return [0.5] * len(passages)


def p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


def timings(header: str) -> dict[str, float]:
    """``Server-Timing``: ``cache;dur=1.2, retrieve;dur=3.4`` -> {stage: ms}."""
    out = {}
    for part in header.split(","):
        name, _, rest = part.strip().partition(";dur=")
        with contextlib.suppress(ValueError):
            out[name] = float(rest)
    return out


def stage_medians(runs: list[dict[str, float]]) -> dict[str, float]:
    names = sorted({k for r in runs for k in r})
    return {k: round(statistics.median(r.get(k, 0.0) for r in runs), 1) for k in names}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings_for(data: Path, **urls):
    from kb_rerank.core.settings import Settings

    return Settings(data_dir=data, jwt_secret=SECRET, **urls)


def serve(args) -> int:
    """One server process (``--serve``): the version on this process's PYTHONPATH."""
    import uvicorn

    from kb_rerank.app import create_app

    changes = {}
    for kv in args.set:
        k, _, v = kv.partition("=")
        changes[k] = type(getattr(settings_for(Path(args.data)), k))(v)
    settings = settings_for(Path(args.data), database_url=args.owner_url, app_database_url=args.app_url, **changes)
    app = create_app(settings, reranker=ConstantReranker(), embedder=StubEmbedder(settings.embedding_dim))
    uvicorn.run(app, host="127.0.0.1", port=args.serve, log_level="warning")
    return 0


def setup(args, data: Path) -> tuple[str, str, uuid.UUID, uuid.UUID, float]:
    import kb_rerank
    from kb_rerank.core.session import configure_connection, tenant_transaction
    from kb_rerank.db import database as db
    from kb_rerank.ingest.loader import ingest_paths

    settings = settings_for(data)
    db.migrate(settings)
    tenant_b, tenant_a = uuid.uuid4(), uuid.uuid4()
    t0 = time.perf_counter()
    with psycopg.connect(db.app_url(settings)) as conn:
        configure_connection(conn)
        ingest_paths(conn, tenant_b, [Path(kb_rerank.__file__).parent / "demo_kb"],
                     StubEmbedder(settings.embedding_dim), settings)
        with tenant_transaction(conn, tenant_a):
            conn.execute(INSERT_A, [tenant_a, args.docs])
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        conn.execute("analyze")
    return db.owner_url(settings), db.app_url(settings), tenant_a, tenant_b, time.perf_counter() - t0


def measure(args) -> int:
    from kb_rerank.db import database as db
    from kb_rerank.http.auth import JwtConfig, mint_token

    versions = [tuple(v.split("=", 1)) for v in args.version] or [("run", str(HERE.parent / "src"))]
    # LABEL=SRC[,SETTING=VALUE...]: settings of that version's server
    versions = [(label, spec.split(",")[0], spec.split(",")[1:]) for label, spec in versions]
    data = Path(tempfile.mkdtemp(prefix="kb-filter-flood-"))
    owner, app, tenant_a, tenant_b, setup_s = setup(args, data)
    print(f"setup {setup_s:.1f} s", flush=True)
    procs, bases = [], {}
    try:
        for label, path, sets in versions:
            port = free_port()
            env = {**os.environ, "PYTHONPATH": str(Path(path).resolve()) + os.pathsep + str(HERE),
                   "OPENBLAS_NUM_THREADS": "1"}
            procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--serve", str(port), "--data", str(data),
                 "--owner-url", owner, "--app-url", app, *[x for kv in sets for x in ("--set", kv)]], env=env))
            bases[label] = f"http://127.0.0.1:{port}"
        for base in bases.values():
            deadline = time.monotonic() + 180
            while True:
                try:
                    if httpx.get(base + "/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"{base} never ready")
                time.sleep(0.3)
        jwt = JwtConfig(secret=SECRET)
        hb = {"Authorization": "Bearer " + mint_token(tenant_b, jwt)}
        ha = {"Authorization": "Bearer " + mint_token(tenant_a, jwt)}
        got = asyncio.run(rounds(args, versions, bases, ha, hb, owner))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        db.stop_embedded(settings_for(data))
        shutil.rmtree(data, ignore_errors=True)
    res = {
        "label": args.label, "cores": os.cpu_count(), "a_documents": args.docs, "keys": KEYS,
        "filter": args.filter, "filter_bytes": len(json.dumps(FILTER)), "flooders": args.flooders, "rounds": args.rounds,
        "queries_per_phase": args.queries, "interval_s": args.interval, "setup_s": round(setup_s, 1),
        "versions": {},
    }
    for label, path, sets in versions:
        g = got[label]
        alone, during = g["alone_ms"], g["during_ms"]
        res["versions"][label] = {
            "path": path, "settings": sets,
            "b_alone": {"n": len(alone), "p50": p(alone, 50), "p95": p(alone, 95)},
            "b_during": {"n": len(during), "p50": p(during, 50), "p95": p(during, 95)},
            "p95_ratio": p(during, 95) / p(alone, 95), "p50_ratio": p(during, 50) / p(alone, 50),
            "rounds_p95_ratio": [round(p(d, 95) / p(a, 95), 2) for a, d in zip(g["alone_rounds"], g["during_rounds"])],
            "a_statuses": g["a_statuses"], "a_200_p50_ms": p(g["a_ms"], 50), "b_statuses": g["b_statuses"],
            "b_server_stages_p50_ms": {phase: stage_medians(runs) for phase, runs in g["stages"].items()},
            "active_statements": {"mean": statistics.fmean(g["active"]) if g["active"] else None,
                                  "max": max(g["active"], default=None)},
        }
    name = "filter-flood" + (f"-{args.label}" if args.label else "")
    (HERE / "results" / f"{name}.json").write_text(json.dumps(res, indent=2) + "\n")
    (HERE / "results" / f"{name}.md").write_text(markdown(res, args))
    print(json.dumps(res, indent=2))
    return 0


def markdown(res: dict, args) -> str:
    cmd = "python bench/filter_flood.py " + " ".join(sys.argv[1:])
    lines = [
        "# Another tenant's lexical searches during a filter flood",
        "",
        f"`{cmd}`",
        "",
        f"{res['cores']} cores; tenant A: {res['a_documents']} documents x {res['keys']} metadata keys, a "
        f"{res['filter_bytes']}-byte filter of 16 {res['filter']} date ranges, {res['flooders']} concurrent clients; tenant B: "
        f"lexical searches every {res['interval_s']} s, {res['queries_per_phase']} a phase; {res['rounds']} rounds "
        "of (B alone, B during the flood) per version, versions alternating, one database.",
        "",
        "| version | B alone p50 / p95 ms | B during p50 / p95 ms | p95 ratio | p95 ratio per round | "
        "A's answers | database backends active mean / max |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, v in res["versions"].items():
        st = ", ".join(f"{k}: {n}" for k, n in sorted(v["a_statuses"].items()))
        act = v["active_statements"]
        lines.append(
            f"| {label}{' (' + ', '.join(v['settings']) + ')' if v['settings'] else ''} | {v['b_alone']['p50']:.0f} / {v['b_alone']['p95']:.0f} | "
            f"{v['b_during']['p50']:.0f} / {v['b_during']['p95']:.0f} | {v['p95_ratio']:.2f} | "
            f"{', '.join(map(str, v['rounds_p95_ratio']))} | {st} | "
            f"{(act['mean'] or 0):.1f} / {act['max']} |")
    lines += ["", "B's server-side stages (`Server-Timing`), median ms: " + "; ".join(
        f"{label} {phase}: " + ", ".join(f"{k} {v:g}" for k, v in st.items())
        for label, v in res["versions"].items() for phase, st in v["b_server_stages_p50_ms"].items())]
    lines += ["", "Backends active: the database's active backends, sampled every 0.1 s during the flood "
              "phases (B's included).", ""]
    return "\n".join(lines)


async def rounds(args, versions, bases, ha, hb, owner) -> dict:
    got = {label: {"alone_ms": [], "during_ms": [], "alone_rounds": [], "during_rounds": [], "a_statuses": {},
                   "a_ms": [], "b_statuses": {}, "active": [], "stages": {}} for label, *_ in versions}

    async def b_phase(client, base, g, tag: str, n: int) -> list[float]:
        out = []
        for i in range(n):
            q = f"{tag} {i} {uuid.uuid4().hex[:6]} how do I export reports to csv"
            t0 = time.perf_counter()
            try:
                r = await client.post(base + "/v1/kb/search/rerank", json={"query": q, "source": "lexical_only"},
                                      headers=hb, timeout=args.timeout)
                status = str(r.status_code)
                stages = timings(r.headers.get("server-timing", ""))
            except httpx.TimeoutException:
                status, stages = "timeout", {}
            dt = time.perf_counter() - t0
            if stages:
                g["stages"].setdefault(tag.rstrip("0123456789"), []).append(stages)
            g["b_statuses"][status] = g["b_statuses"].get(status, 0) + 1
            if status in ("200", "timeout"):
                out.append(dt * 1000.0)
            await asyncio.sleep(max(0.0, args.interval - dt))
        return out

    a_filter = WIDE if args.filter == "wide" else FILTER

    async def flood(client, base, g, stop: asyncio.Event) -> None:
        while not stop.is_set():
            q = f"invoices {uuid.uuid4().hex[:8]}"  # a miss every time
            t0 = time.perf_counter()
            try:
                r = await client.post(base + "/v1/kb/search/rerank",
                                      json={"query": q, "source": "lexical_only", "filter": a_filter},
                                      headers=ha, timeout=120)
            except httpx.HTTPError as exc:
                g["a_statuses"][type(exc).__name__] = g["a_statuses"].get(type(exc).__name__, 0) + 1
                continue
            key = str(r.status_code)
            if r.status_code >= 400:
                with contextlib.suppress(ValueError):
                    key += " " + str(r.json().get("error"))
            g["a_statuses"][key] = g["a_statuses"].get(key, 0) + 1
            if r.status_code == 200:
                g["a_ms"].append((time.perf_counter() - t0) * 1000.0)
            if r.status_code == 429:
                await asyncio.sleep(0.5)  # as bench/embed_fairness.py's flooders

    async def sample(g, stop: asyncio.Event) -> None:
        async with await psycopg.AsyncConnection.connect(owner, autocommit=True) as conn:
            while not stop.is_set():
                (n,) = await (await conn.execute(
                    "select count(*) from pg_stat_activity where state = 'active' and pid <> pg_backend_pid()"
                    " and backend_type = 'client backend'")).fetchone()
                g["active"].append(n)
                await asyncio.sleep(0.1)

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=50)) as client:
        for label, *_ in versions:
            await b_phase(client, bases[label], {"b_statuses": {}, "stages": {}}, "warm", 5)
        for r in range(args.rounds):
            order = versions if r % 2 == 0 else versions[::-1]
            for label, *_ in order:
                base, g = bases[label], got[label]
                alone = await b_phase(client, base, g, f"alone{r}", args.queries)
                stop = asyncio.Event()
                flooders = [asyncio.ensure_future(flood(client, base, g, stop)) for _ in range(args.flooders)]
                sampler = asyncio.ensure_future(sample(g, stop))
                await asyncio.sleep(2.0)
                during = await b_phase(client, base, g, f"flood{r}", args.queries)
                stop.set()
                await asyncio.gather(*flooders, sampler, return_exceptions=True)
                g["alone_ms"] += alone
                g["during_ms"] += during
                g["alone_rounds"].append(alone)
                g["during_rounds"].append(during)
                print(f"round {r} {label}: alone p95 {p(alone, 95):.0f} ms, during p95 {p(during, 95):.0f} ms, "
                      f"A {g['a_statuses']}", flush=True)
                await asyncio.sleep(args.settle)  # A's last statements end before the next phase
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20_000, help="A's documents (64 metadata keys each)")
    ap.add_argument("--flooders", type=int, default=5, help="A's concurrent clients")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of (alone, flood) for each version")
    ap.add_argument("--queries", type=int, default=20, help="B's searches in each phase")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between B's searches")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of quiet after each flood")
    ap.add_argument("--quick", action="store_true", help="2 rounds of 10 searches a phase")
    ap.add_argument("--version", action="append", default=[],
                    help="LABEL=SRC[,SETTING=VALUE...]: a version to measure (its src folder, settings of its "
                         "server); repeat to alternate several; default: this tree's src")
    ap.add_argument("--label", default="", help="results: bench/results/filter-flood[-LABEL].{json,md}")
    ap.add_argument("--timeout", type=float, default=60.0, help="B's client timeout, seconds")
    ap.add_argument("--filter", choices=("narrow", "wide"), default="narrow",
                    help="A's 16 ranges: narrow (each holds ~7%% of the documents) or wide (all of them)")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--owner-url", help=argparse.SUPPRESS)
    ap.add_argument("--app-url", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args)
    if args.quick:
        args.rounds, args.queries = 2, 10
    return measure(args)


if __name__ == "__main__":
    raise SystemExit(main())
