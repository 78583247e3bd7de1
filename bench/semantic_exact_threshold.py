"""The semantic list's filtered search, by measurement: recall@k against the exact filtered
top k and latency of kb.search_semantic (the kNN step kb.search_semantic_ids, then each chunk's
content and document title through kb.chunk_texts, as the service reads it), unfiltered and at 50 / 10 / 1 %
selectivity, these variants interleaved query by query (``--variants``; default
covering,after):

  before     --ref's SQL, exact search up to 4000 chunks in the filter, the vectors read from
             the table (heap and TOAST: index-only scans off, as without the covering index)
  toast      --ref's SQL, exact search up to SEMANTIC_EXACT_MAX_CHUNKS, vectors from the table
  covering   --ref's SQL, exact search up to SEMANTIC_EXACT_MAX_CHUNKS, the vectors read from
             the covering index of migration 0028 (chunks_tenant_doc_vectors_idx: an
             index-only scan)
  after      this checkout's SQL, as covering
  diskann    pgvectorscale's DiskANN on bench/anchors.py's anchor server, as anchors.py runs
             it (its defaults, diskann.query_rescore = max(50, k)); left out with
             ``--no-diskann`` or when the anchors cannot be obtained (said so)
  diskann-tuned  DiskANN at equal recall: in each cell, the smallest setting of the ladder
             DISKANN_LADDER (diskann.query_search_list_size L, diskann.query_rescore min(L, 1000))
             whose recall@k reaches --target (0.95) on a separate set of queries (as many as
             the measured ones, drawn after them from the same generator: the calibration
             half), then timed on the measured half with the others; when no setting reaches
             it, the last one, said so (its recall is in the row either way)

--ref (a git revision, default main) is the baseline: its kb.search_semantic_ids and
kb.search_filter_docs. Every variant of ours is checked against "after" query by query: the
same chunk ids in the same order, or the differing queries are counted and printed.

Corpus: bench/anchors.py's (``kb_bench_<size>_1`` under ``--data-dir``, its tags "p50",
"p10", "p1" on each document; the anchor server's ``anchors_<size>`` copy with its DiskANN
index): built by that script, reused here, never rebuilt. Its query vectors too
(search_bench's clustered vectors, seed 4848). Each variant's functions (kb.search_semantic,
kb.search_semantic_ids, kb.search_filter_docs: --ref's or this checkout's) are rendered with
its threshold into a schema of its own (kbx_<variant>), dropped at the end. The
covering index is made from migration 0028's file when the bench database lacks it, and
removed again at the end (the database left as it was found).

    python bench/semantic_exact_threshold.py --out bench/results/semantic-filter-speed
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import anchors  # noqa: E402
import search_bench as sb  # noqa: E402
from kb_rerank.core import knn, session  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.db import layer  # noqa: E402

FILES = ("filters/sql/search_filter_docs.sql", "retrieval/sql/search_semantic_ids.sql", "retrieval/sql/search_semantic.sql")
COVERING = "0028_vector_storage.sql"
# variant -> (SQL source: "ref" or "tree", exact-search threshold, index-only scans allowed)
VARIANTS = {"before": ("ref", 4000, False), "toast": ("ref", knn.SEMANTIC_EXACT_MAX_CHUNKS, False),
            "covering": ("ref", knn.SEMANTIC_EXACT_MAX_CHUNKS, True),
            "after": ("tree", knn.SEMANTIC_EXACT_MAX_CHUNKS, True)}


def sources(ref: str, into: Path) -> dict[str, Path]:
    """The variants' SQL directories: this checkout's package and --ref's files under ``into``."""
    for rel in FILES:
        text = subprocess.run(["git", "-C", str(ROOT), "show", f"{ref}:src/kb_rerank/{rel}"],
                              check=True, capture_output=True, text=True).stdout
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        (into / rel).write_text(text, encoding="utf-8")
    return {"ref": into, "tree": Path(str(layer.package_dir()))}


def install(owner: str, name: str, base: Path) -> str:
    schema = f"kbx_{name}"
    saved = knn.SEMANTIC_EXACT_MAX_CHUNKS
    knn.SEMANTIC_EXACT_MAX_CHUNKS = VARIANTS[name][1]
    try:
        sql = [layer.render(base / rel, embedding_dim=384) for rel in FILES]
    finally:
        knn.SEMANTIC_EXACT_MAX_CHUNKS = saved
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(f"drop schema if exists {schema} cascade")
        conn.execute(f"create schema {schema}")
        for text in sql:
            conn.execute(text.replace("kb.search_semantic", f"{schema}.search_semantic")
                         .replace("kb.search_filter_docs", f"{schema}.search_filter_docs"))
        conn.execute(f"grant usage on schema {schema} to kb_app, kb_search")
        conn.execute(f"grant execute on all functions in schema {schema} to kb_app, kb_search")
    return schema


def ensure_covering(owner: str) -> bool:
    """Migration 0028's index on the bench database; True when made here (to be removed)."""
    with psycopg.connect(owner, autocommit=True) as conn:
        if conn.execute("select to_regclass('kb.chunks_tenant_doc_vectors_idx')").fetchone()[0]:
            return False
        conn.execute("set maintenance_work_mem = '512MB'")
        conn.execute(layer.render(layer.versioned_file(COVERING), embedding_dim=384))
        conn.execute("vacuum analyze kb.chunks")
    return True


def remove_covering(owner: str) -> None:
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("drop index if exists kb.chunks_tenant_doc_vectors_idx")
        conn.execute("create index if not exists chunks_tenant_idx on kb.chunks (tenant_id, doc_id)")


# query_search_list_size in the order tried, each with query_rescore = min(L, 1000) (rescoring
# fewer than the list left recall where the defaults had it): pgvectorscale 0.9.0's defaults are
# 100 and 50, its limits 1-10000 and 0-1000
DISKANN_LADDER = (100, 150, 200, 300, 400, 600, 800, 1000, 1200, 1600, 2400, 3200, 5000, 10000)


def diskann_tune(anc, vecs, exact, awhere: str, k: int, target: float):
    """The first list size of DISKANN_LADDER whose mean recall@k over ``vecs`` (exact: their
    exact top k) reaches ``target``: (L, rescore, recall, reached)."""
    for n in DISKANN_LADDER:
        rescore = max(min(n, 1000), k)
        with anc.transaction():
            anc.execute(f"set local diskann.query_search_list_size = {n}")
            anc.execute(f"set local diskann.query_rescore = {rescore}")
            got = [[row[0] for row in anc.execute(anchors.SEM_ANCHOR.format(where=awhere), {"v": v, "k": k})]
                   for v in vecs]
        rec = statistics.mean(len(set(g) & set(e)) / max(1, len(e)) for g, e in zip(got, exact))
        print(f"  DiskANN calibration, list {n}, rescore {rescore}: recall@{k} {rec:.3f}", flush=True)
        if rec >= target:
            return n, rescore, rec, True
    return n, rescore, rec, False


def run(args, size: int, anchor, out: list, src: dict) -> None:
    settings = Settings(data_dir=Path(args.data_dir), database_name=f"kb_bench_{size}_1")
    owner, app = db.owner_url(settings), db.app_url(settings)
    tenant = uuid.UUID(int=(1 << 64) + 1)
    made = ensure_covering(owner)
    names = args.variants
    schemas = {name: install(owner, name, src[VARIANTS[name][0]]) for name in names}
    allv = sb.clustered(np.random.default_rng(4848), sb.make_centres(), args.warmup + 2 * args.queries)
    vecs, cvecs = allv[:args.warmup + args.queries], allv[args.warmup + args.queries:]
    vtext = ["[" + ",".join(f"{x:.7g}" for x in v) + "]" for v in vecs]
    ctext = ["[" + ",".join(f"{x:.7g}" for x in v) + "]" for v in cvecs]
    anc = None
    if anchor is not None:
        from pgvector.psycopg import register_vector

        anc = psycopg.connect(anchor.url(f"anchors_{size}"))
        register_vector(anc)
        tuned = psycopg.connect(anchor.url(f"anchors_{size}"))
        register_vector(tuned)
    try:
        with psycopg.connect(owner) as own, psycopg.connect(app) as conn:
            session.configure_connection(conn)
            own.execute("set role kb_search")
            for sel in ("none", *anchors.TAGS):
                tag, label = (None, None) if sel == "none" else anchors.TAGS[sel]
                where = "" if tag is None else \
                    " and c.doc_id in (select d.doc_id from kb.documents d where d.tenant_id = %(t)s and d.metadata->'tags' ? %(tag)s)"
                awhere = "" if label is None else f"where labels && array[{label}]::smallint[]"
                n_chunks = own.execute("select count(*) from kb.chunks c where c.tenant_id = %(t)s" + where,
                                       {"t": tenant, "tag": tag}).fetchone()[0]
                for k in args.k:
                    exact = [[r[0] for r in own.execute(
                        "select chunk_id from kb.chunks c where c.tenant_id = %(t)s" + where +
                        " order by (c.embedding <=> %(v)s::vector) + 0, c.chunk_id limit %(k)s",
                        {"t": tenant, "tag": tag, "v": v, "k": k})] for v in vtext]
                    cexact = [] if anc is None else [[r[0] for r in own.execute(
                        "select chunk_id from kb.chunks c where c.tenant_id = %(t)s" + where +
                        " order by (c.embedding <=> %(v)s::vector) + 0, c.chunk_id limit %(k)s",
                        {"t": tenant, "tag": tag, "v": v, "k": k})] for v in ctext]
                    own.commit()
                    setting = None
                    if anc is not None:
                        anc.execute(f"set diskann.query_rescore = {max(50, k)}")
                        anc.commit()
                        setting = diskann_tune(tuned, cvecs, cexact, awhere, k, args.target)
                        tuned.execute(f"set diskann.query_search_list_size = {setting[0]}")
                        tuned.execute(f"set diskann.query_rescore = {setting[1]}")
                        tuned.commit()
                        print(f"{size} chunks, filter {sel}, k {k}: DiskANN tuned to list {setting[0]}, rescore"
                              f" {setting[1]} (calibration recall {setting[2]:.3f}"
                              + ("" if setting[3] else f", short of {args.target}: the ladder's last") + ")", flush=True)

                    def ours(i, name, k=k, tag=tag):
                        ios = VARIANTS[name][2]

                        def q():
                            if not ios:
                                conn.execute("set local enable_indexonlyscan = off")
                            return [r[0] for r in conn.execute(
                                f"select s.chunk_id, s.content, s.doc_title from {schemas[name]}.search_semantic(%s::vector, %s, %s) s"
                                " order by s.rank", [vtext[i], k, None if tag is None else Jsonb({"tags": tag})])]
                        return anchors.timed_rows(conn, tenant, q)

                    fns = {name: (lambda i, name=name: ours(i, name)) for name in names}
                    if anc is not None:
                        fns["diskann"] = lambda i, k=k, awhere=awhere: anchors.timed_rows(anc, None, lambda: [
                            r[0] for r in anc.execute(anchors.SEM_ANCHOR.format(where=awhere),
                                                      {"v": vecs[i], "k": k}).fetchall()])
                        fns["diskann-tuned"] = lambda i, k=k, awhere=awhere: anchors.timed_rows(tuned, None, lambda: [
                            r[0] for r in tuned.execute(anchors.SEM_ANCHOR.format(where=awhere),
                                                        {"v": vecs[i], "k": k}).fetchall()])
                    res = anchors.interleave(range(len(vtext)), fns, args.warmup)
                    ex = exact[args.warmup:]
                    for name, (times, got) in res.items():
                        n = VARIANTS.get(name, (None, None))[1]
                        path = ("DiskANN" if name == "diskann" else
                                f"DiskANN list {setting[0]}, rescore {setting[1]}") if n is None else (
                            "HNSW" if tag is None or n_chunks > n else "exact" + (" (index)" if VARIANTS[name][2] else " (table)"))
                        same = None
                        if n is not None and "after" in res:
                            same = sum(g == a for g, a in zip(got, res["after"][1]))
                        row = {"size": size, "filter": sel, "chunks_in_filter": n_chunks, "k": k, "variant": name,
                               "threshold": n, "path": path, "same_rows_as_after": same,
                               "diskann_setting": None if name != "diskann-tuned" else
                               {"query_search_list_size": setting[0], "query_rescore": setting[1],
                                "calibration_recall": setting[2], "reached": setting[3]},
                               "recall": statistics.mean(len(set(g) & set(e)) / max(1, len(e)) for g, e in zip(got, ex)),
                               "p50": anchors.pct(times, 50), "p95": anchors.pct(times, 95), "queries": len(times)}
                        out.append(row)
                        print(f"{size} chunks, filter {sel} ({n_chunks} chunks), k {k}, {name} ({path}):"
                              f" recall {row['recall']:.3f}, p50 {row['p50']:.2f} ms, p95 {row['p95']:.2f} ms"
                              + ("" if same is None else f", same rows as after {same}/{len(got)}"), flush=True)
                    for base in ("diskann", "diskann-tuned", "covering"):
                        if base in res and "after" in res:
                            a = next(r for r in out[::-1] if r["variant"] == base)
                            b = next(r for r in out[::-1] if r["variant"] == "after")
                            print(f"{size} chunks, filter {sel}, k {k}: after / {base} p50 ratio {b['p50'] / a['p50']:.2f}x,"
                                  f" p95 ratio {b['p95'] / a['p95']:.2f}x", flush=True)
    finally:
        if anc is not None:
            anc.close()
            tuned.close()
        with psycopg.connect(owner, autocommit=True) as conn:
            for s in schemas.values():
                conn.execute(f"drop schema if exists {s} cascade")
        if made:
            remove_covering(owner)


def markdown(rows, machine) -> str:
    out = [f"# The semantic list's filtered search: paths, SQL versions and DiskANN ({machine['date']})", "",
           f"Command: `{machine['command']}`", "",
           f"Machine: {os.cpu_count()} CPUs (shared with other work), load average {machine['load']} at the start;"
           " the bench server of bench/anchors.py (shared_buffers 1GB, parallel query and JIT off), its corpora"
           " (one tenant, clustered 384-d vectors, tags drawn from the document id's hash) and its query vectors;"
           " DiskANN on its anchor server (pgvectorscale 0.9.0): diskann = its defaults (query_search_list_size 100,"
           " query_rescore max(50, k)); diskann-tuned = DiskANN at equal recall, the smallest query_search_list_size"
           f" L of {', '.join(map(str, DISKANN_LADDER))} (query_rescore min(L, 1000)) whose recall@k reached"
           f" {machine['target']} on a separate set of {machine['queries']} queries of the same generator, then timed"
           " with the others on the measured queries (its setting in the path column)."
           " recall@k: against the exact filtered top k. Latency: client round trip of kb.search_semantic (ids and"
           " texts) in a tenant transaction (DiskANN: its query returning the texts), the variants interleaved"
           f" query by query. Variants: before = {machine['ref']}'s SQL, exact search up to 4000 chunks, vectors from"
           f" the table; toast = {machine['ref']}'s SQL, exact up to {knn.SEMANTIC_EXACT_MAX_CHUNKS}, vectors from the"
           f" table; covering = {machine['ref']}'s SQL, exact up to {knn.SEMANTIC_EXACT_MAX_CHUNKS}, vectors from the"
           " covering index (index-only scan); after = this checkout's SQL, as covering. same rows: queries whose"
           " chunk ids and order equal after's.", "",
           "| chunks | filter | chunks in filter | k | variant | path | recall@k | p50 ms | p95 ms | same rows |",
           "|---:|---|---:|---:|---|---|---:|---:|---:|---:|"]
    for r in rows:
        same = "" if r.get("same_rows_as_after") is None else f"{r['same_rows_as_after']}/{r['queries']}"
        out.append(f"| {r['size']} | {r['filter']} | {r['chunks_in_filter']} | {r['k']} | {r['variant']} | {r['path']}"
                   f" | {r['recall']:.3f} | {r['p50']:.2f} | {r['p95']:.2f} | {same} |")
    cells = list(dict.fromkeys((r["size"], r["filter"], r["k"]) for r in rows))
    ratios = []
    for size, flt, k in cells:
        got = {r["variant"]: r for r in rows if (r["size"], r["filter"], r["k"]) == (size, flt, k)}
        if "after" in got and "diskann" in got and "diskann-tuned" in got:
            a, d, t = got["after"], got["diskann"], got["diskann-tuned"]
            ratios.append(f"| {size} | {flt} | {k} | {a['recall']:.3f} | {d['recall']:.3f} | {t['recall']:.3f} |"
                          f" {a['p95'] / d['p95']:.2f}x | {a['p95'] / t['p95']:.2f}x |")
    if ratios:
        out += ["", "p95 ratios, after / DiskANN (above 1: ours slower):", "",
                "| chunks | filter | k | recall after | recall DiskANN defaults | recall DiskANN tuned |"
                " after / defaults p95 | after / tuned p95 |", "|---:|---|---:|---:|---:|---:|---:|---:|", *ratios]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/kb-anchors-bench")
    ap.add_argument("--anchor-dir", default="/tmp/kb-anchors")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "kb-rerank" / "anchors"))
    ap.add_argument("--wheel", default="")
    ap.add_argument("--port", type=int, default=55441)
    ap.add_argument("--shared-buffers", default="1GB")
    ap.add_argument("--no-diskann", action="store_true")
    ap.add_argument("--sizes", default="10000,100000")
    ap.add_argument("--k", type=int, nargs="+", default=[60])
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--target", type=float, default=0.95, help="recall@k DiskANN is tuned to reach (diskann-tuned)")
    ap.add_argument("--ref", default="main", help="git revision of the baseline SQL (before, toast, covering)")
    ap.add_argument("--variants", default="covering,after",
                    help="comma-separated, of: " + ", ".join(VARIANTS) + " (diskann runs unless --no-diskann)")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        ap.error(f"--variants: unknown {', '.join(unknown)}; known: {', '.join(VARIANTS)}")
    machine = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "target": args.target,
               "queries": args.queries,
               "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
               "command": "python bench/semantic_exact_threshold.py " + " ".join(argv or sys.argv[1:])}
    machine["ref"] = args.ref + " (" + subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.ref], capture_output=True, text=True).stdout.strip() + ")"
    anchor, own_anchor = None, True
    if not args.no_diskann:
        try:
            install = anchors.obtain_install(Path(args.anchor_dir), wheel=args.wheel or None, cache=Path(args.cache))
            anchor = anchors.AnchorServer(install, Path(args.anchor_dir), args.port,
                                          args.shared_buffers)
            try:
                anchor.start()
            except anchors.AnchorsUnavailable:
                psycopg.connect(anchor.url(), connect_timeout=5).close()  # already running (another run's): used, left running
                print("DiskANN: the anchor server was already running; used as it is and left running", file=sys.stderr)
                own_anchor = False
        except (anchors.AnchorsUnavailable, OSError, psycopg.OperationalError) as e:
            print(f"DiskANN left out: the anchor server cannot run: {e}", file=sys.stderr)
            anchor = None
    base = Settings(data_dir=Path(args.data_dir), database_name="postgres")
    rows: list = []
    tmp = tempfile.TemporaryDirectory()
    try:
        db.start_embedded(base)
        src = sources(args.ref, Path(tmp.name))
        for size in [int(x) for x in args.sizes.split(",") if x]:
            run(args, size, anchor, rows, src)
    finally:
        tmp.cleanup()
        db.stop_embedded(base)
        if anchor is not None and own_anchor:
            anchor.stop()
    if args.out:
        Path(args.out + ".md").write_text(markdown(rows, machine), encoding="utf-8")
        Path(args.out + ".json").write_text(json.dumps({"machine": machine, "rows": rows}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
