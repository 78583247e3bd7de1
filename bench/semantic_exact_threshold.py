"""The semantic list's exact-scan threshold, by measurement: recall@k against the exact
filtered top k and latency of kb.search_semantic_ids (the kNN step) joined to each chunk's content and
document title (the rows kb.search_semantic returns) with the threshold as it was (4000 chunks) and as it is now
(kb_rerank.core.knn.SEMANTIC_EXACT_MAX_CHUNKS), interleaved query by query, unfiltered
and at 50 / 10 / 1 % selectivity.

Corpus: bench/anchors.py's (``kb_bench_<size>_1`` under ``--data-dir``, its tags "p50",
"p10", "p1" on each document): built by that script, reused here, never rebuilt. Its query
vectors too (search_bench's clustered vectors, seed 4848). Each threshold's functions are
this checkout's SQL rendered with that threshold into a schema of their own (kbx_<n>),
dropped at the end; the bench server's kb schema is left as it is.

    python bench/semantic_exact_threshold.py --out bench/results/semantic-exact-threshold
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import search_bench as sb  # noqa: E402
from kb_rerank.core import session  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.db import layer  # noqa: E402
from kb_rerank.core import knn  # noqa: E402

TAGS = {"50%": "p50", "10%": "p10", "1%": "p1"}
FILES = ("retrieval/sql/search_semantic_ids.sql",)


def install(owner: str, n: int) -> str:
    schema = f"kbx_{n}"
    sql = []
    saved = knn.SEMANTIC_EXACT_MAX_CHUNKS
    knn.SEMANTIC_EXACT_MAX_CHUNKS = n
    try:
        for rel in FILES:
            sql.append(layer.render(layer.package_dir().joinpath(*rel.split("/")), embedding_dim=384))
    finally:
        knn.SEMANTIC_EXACT_MAX_CHUNKS = saved
    for i, text in enumerate(sql):
        sql[i] = text.replace("kb.search_semantic", f"{schema}.search_semantic")
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {schema} cascade")
        conn.execute(f"create schema {schema}")
        for text in sql:
            conn.execute(text)
        conn.execute(f"grant usage on schema {schema} to kb_app, kb_search")
        conn.execute(f"grant execute on all functions in schema {schema} to kb_app")
    return schema


def pct(xs, p):
    return float(np.percentile(xs, p)) if xs else float("nan")


def run(args, size: int, out: list) -> None:
    settings = Settings(data_dir=Path(args.data_dir), database_name=f"kb_bench_{size}_1")
    owner, app = db.owner_url(settings), db.app_url(settings)
    tenant = uuid.UUID(int=(1 << 64) + 1)
    thresholds = [int(x) for x in args.thresholds.split(",")]
    schemas = {n: install(owner, n) for n in thresholds}
    vecs = sb.clustered(np.random.default_rng(4848), sb.make_centres(), args.warmup + args.queries)
    vtext = ["[" + ",".join(f"{x:.7g}" for x in v) + "]" for v in vecs]
    try:
        with psycopg.connect(owner) as own, psycopg.connect(app) as conn:
            session.configure_connection(conn)
            own.execute("set role kb_search")
            for sel in ("none", *TAGS):
                flt = None if sel == "none" else {"tags": TAGS[sel]}
                where = "" if flt is None else \
                    " and c.doc_id in (select d.doc_id from kb.documents d where d.tenant_id = %(t)s and d.metadata->'tags' ? %(tag)s)"
                n_chunks = own.execute("select count(*) from kb.chunks c where c.tenant_id = %(t)s" + where,
                                       {"t": tenant, "tag": flt and flt["tags"]}).fetchone()[0]
                for k in args.k:
                    exact = [[r[0] for r in own.execute(
                        "select chunk_id from kb.chunks c where c.tenant_id = %(t)s" + where +
                        " order by (c.embedding <=> %(v)s::vector) + 0, c.chunk_id limit %(k)s",
                        {"t": tenant, "tag": flt and flt["tags"], "v": v, "k": k})] for v in vtext]
                    own.commit()
                    times = {n: [] for n in thresholds}
                    recall = {n: [] for n in thresholds}
                    for i, v in enumerate(vtext):
                        order = thresholds if i % 2 == 0 else thresholds[::-1]
                        for n in order:
                            t0 = time.perf_counter()
                            with session.tenant_transaction(conn, tenant):
                                got = [r[0] for r in conn.execute(
                                    f"select s.chunk_id, c.content, d.title from {schemas[n]}.search_semantic_ids(%s::vector, %s, %s) s"
                                    " join kb.chunks c on c.chunk_id = s.chunk_id join kb.documents d on d.doc_id = s.doc_id"
                                    " order by s.rank",
                                    [v, k, None if flt is None else Jsonb(flt)])]
                            ms = (time.perf_counter() - t0) * 1000
                            if i >= args.warmup:
                                times[n].append(ms)
                                recall[n].append(len(set(got) & set(exact[i])) / max(1, len(exact[i])))
                    for n in thresholds:
                        row = {"size": size, "filter": sel, "chunks_in_filter": n_chunks, "k": k, "threshold": n,
                               "path": "HNSW" if flt is None or n_chunks > n else "exact",
                               "recall": statistics.mean(recall[n]), "p50": pct(times[n], 50),
                               "p95": pct(times[n], 95), "queries": len(times[n])}
                        out.append(row)
                        print(f"{size} chunks, filter {sel} ({n_chunks} chunks), k {k}, threshold {n} ({row['path']}):"
                              f" recall {row['recall']:.3f}, p50 {row['p50']:.2f} ms, p95 {row['p95']:.2f} ms",
                              flush=True)
    finally:
        with psycopg.connect(owner, autocommit=True) as conn:
            for s in schemas.values():
                conn.execute(f"drop schema if exists {s} cascade")


def markdown(rows, args, machine) -> str:
    out = [f"# The semantic list's exact-scan threshold ({machine['date']})", "",
           f"Command: `{machine['command']}`", "",
           f"Machine: {os.cpu_count()} CPUs (shared with other work), load average {machine['load']} at the start;"
           " the bench server of bench/anchors.py (shared_buffers 1GB, parallel query and JIT off), its corpora"
           " (one tenant, clustered 384-d vectors, tags drawn from the document id's hash) and its query vectors."
           " recall@k: against the exact filtered top k. Latency: client round trip of kb.search_semantic_ids joined to the texts in a"
           " tenant transaction, the thresholds interleaved query by query.", "",
           "| chunks | filter | chunks in filter | k | threshold | path | recall@k | p50 ms | p95 ms |",
           "|---:|---|---:|---:|---:|---|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['size']} | {r['filter']} | {r['chunks_in_filter']} | {r['k']} | {r['threshold']} | {r['path']}"
                   f" | {r['recall']:.3f} | {r['p50']:.2f} | {r['p95']:.2f} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/kb-anchors-bench")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--thresholds", default=f"4000,{knn.SEMANTIC_EXACT_MAX_CHUNKS}")
    ap.add_argument("--k", type=int, nargs="+", default=[60])
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    machine = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
               "command": "python bench/semantic_exact_threshold.py " + " ".join(argv or sys.argv[1:])}
    base = Settings(data_dir=Path(args.data_dir), database_name="postgres")
    db.start_embedded(base)
    rows: list = []
    try:
        for size in [int(x) for x in args.sizes.split(",") if x]:
            run(args, size, rows)
    finally:
        db.stop_embedded(base)
    if args.out:
        Path(args.out + ".md").write_text(markdown(rows, args, machine), encoding="utf-8")
        Path(args.out + ".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
