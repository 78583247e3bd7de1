"""Cost of the BM25 term blocks (kb.term_blocks; kb.term_tops before migration 0019; migration 0014): storage, rebuild
time, and the write path with and without their trigger.

On a database loaded by bench/search_bench.py (its largest tenant), in one run:
  * storage: pg_total_relation_size of kb.term_blocks against kb.chunks (table, TOAST and
    indexes), and the rows, levels and listed chunk ids;
  * ingestion: chunks/s of INSERT statements of 5 chunks (one document's worth) copied from
    the tenant's own chunks, with the blocks' trigger on and off (ALTER TABLE ... DISABLE
    TRIGGER inside the measuring transaction), alternated in rounds, each round rolled
    back so that the data stay as loaded; with --base-db the same on an older version's
    database (the 0008 champion lists' trigger), in the same rounds.
The rebuild time is that of bench/search_bench.py's setup or of kb-rerank lists (printed
by --rebuild, which rebuilds the tenant's blocks first).

    python bench/term_blocks_cost.py --host %2Fwork%2Fwt%2Fbmax-bench%2Fpg --db kb_bench_100000_1 \\
        --base-host %2Fwork%2Fwt%2Fbmax-base%2Fpg --base-db kb_bench_100000_1 --out bench/results/term-blocks-100k
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import psycopg

TRIGGERS = ("chunks_term_blocks_insert",)
# a database before migration 0019 (a base of another release) has the old names
OLD_NAMES = {"kb.term_blocks": "kb.term_tops", "chunks_term_blocks_insert": "chunks_term_tops_insert"}


def _name(conn, name: str) -> str:
    """``name`` as the database at hand calls it (the term blocks were kb.term_tops before 0019)."""
    renamed = conn.execute("select to_regclass('kb.term_blocks') is null").fetchone()[0]
    conn.rollback()
    return OLD_NAMES.get(name, name) if renamed else name


def _owner(db: str, host: str):
    conn = psycopg.connect(f"postgresql://postgres@/{db}?host={host}")
    tenant = conn.execute("select tenant_id from kb.corpus_stats order by n_chunks desc limit 1").fetchone()[0]
    conn.rollback()
    return conn, tenant


def _storage(conn) -> dict:
    blocks = _name(conn, "kb.term_blocks")
    row = conn.execute(
        f"select pg_total_relation_size('{blocks}'), pg_total_relation_size('kb.chunks'),"
        f" (select count(*) from {blocks}), (select coalesce(sum(cardinality(chunk_ids)), 0) from {blocks}),"
        f" (select count(distinct (tenant_id, term)) from {blocks})").fetchone()
    conn.rollback()
    return {"term_blocks_bytes": row[0], "chunks_bytes": row[1], "ratio": round(row[0] / row[1], 3),
            "rows": row[2], "listed_ids": int(row[3]), "terms": row[4]}


def _insert_round(conn, tenant, n_chunks: int, trigger_on: bool, offset: int) -> float:
    """chunks/s of n_chunks inserted 5 per statement as the tenant (the owner is subject to
    RLS: forced), rolled back."""
    triggers = [_name(conn, t) for t in TRIGGERS]
    conn.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
    if not trigger_on:
        for t in triggers:
            conn.execute(f"alter table kb.chunks disable trigger {t}")
    src = conn.execute(
        "select doc_id, content, embedding::text from kb.chunks where tenant_id = %s order by chunk_id"
        " offset %s limit %s", [tenant, offset, n_chunks]).fetchall()
    t0 = time.perf_counter()
    for i in range(0, len(src), 5):
        part = src[i:i + 5]
        conn.execute(
            "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
            " select %s, d, 100000 + p, c, repeat('0', 64), e::vector"
            " from unnest(%s::uuid[], %s::int[], %s::text[], %s::text[]) as x(d, p, c, e)",
            [tenant, [r[0] for r in part], [offset + i + j for j in range(len(part))],
             [r[1] for r in part], [r[2] for r in part]])
    dt = time.perf_counter() - t0
    conn.rollback()
    return len(src) / dt


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", required=True)
    ap.add_argument("--host", required=True, help="socket folder, URL-encoded")
    ap.add_argument("--base-db")
    ap.add_argument("--base-host")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--chunks", type=int, default=300, help="chunks inserted per round and version")
    ap.add_argument("--out", help="path prefix for .json and .md")
    args = ap.parse_args(argv)
    conn, tenant = _owner(args.db, args.host)
    versions = {"blocks, trigger on": (conn, tenant, True), "blocks, trigger off": (conn, tenant, False)}
    result = {"db": args.db, "tenant": str(tenant), "storage": _storage(conn)}
    if args.base_db:
        base, base_tenant = _owner(args.base_db, args.base_host or args.host)
        versions["base (champion lists)"] = (base, base_tenant, True)
        result["base_storage"] = _storage(base)
    rates: dict[str, list[float]] = {k: [] for k in versions}
    for r in range(args.rounds):
        for label, (c, t, on) in versions.items():
            rates[label].append(_insert_round(c, t, args.chunks, on, r * args.chunks))
    result["insert_chunks_per_s"] = {k: round(statistics.median(v), 1) for k, v in rates.items()}
    result["rounds"] = args.rounds
    result["chunks_per_round"] = args.chunks
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
        s = result["storage"]
        md = [f"# BM25 term blocks: cost ({args.db}, largest tenant)", "",
              f"kb.term_blocks {s['term_blocks_bytes'] / 2**20:.0f} MiB against kb.chunks {s['chunks_bytes'] / 2**20:.0f} MiB"
              f" (ratio {s['ratio']}); {s['terms']} terms, {s['rows']} rows, {s['listed_ids']} listed chunk ids.", ""]
        if "base_storage" in result:
            b = result["base_storage"]
            md += [f"Base: {b['term_blocks_bytes'] / 2**20:.0f} MiB (ratio {b['ratio']}).", ""]
        md += [f"Inserts, 5 chunks per statement, median of {args.rounds} interleaved rounds of {args.chunks} chunks"
               " (rolled back):", "", "| version | chunks/s |", "|---|---|"]
        md += [f"| {k} | {v} |" for k, v in result["insert_chunks_per_s"].items()]
        Path(args.out + ".md").write_text("\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
