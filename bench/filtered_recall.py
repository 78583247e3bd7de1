"""Filtered search: recall of the filtered semantic list against the exact filtered
search, at several filter selectivities, and the lexical list's exactness within a filter.

Corpus (synthetic, one tenant, loaded once into ``--data-dir``, reused on later runs):
``--chunks`` chunks (default 40000), 2 per document; vectors of dimension 384, random but
clustered (unit(centre + noise) around 256 random unit centres: random unit vectors, no
embedder, which is fine for the recall of the index, as search_bench.py does); texts of
8-20 words from a 400-word vocabulary. Each document's metadata holds ``tags``, a list
drawn independently of its vectors and words: "p50" with probability 0.5, "p10" 0.1, "p1"
0.01, "p01" 0.001. A filter {"tags": "p10"} keeps about 10 % of the documents.

Measured per selectivity, over ``--queries`` query vectors (a centre + noise), k = 20 and
k = 120 (kb.retrieve_hybrid's semantic list at the service's 60 documents):
  exact      the top k by cosine distance among the filter's chunks (ORDER BY distance + 0)
  function   kb.search_semantic_ids(q, k, filter), as shipped: the exact scan when the
             filter's documents hold at most 4000 chunks, else the HNSW index scan with
             hnsw.iterative_scan = relaxed_order, ef_search 100, max_scan_tuples 20000 (default)
  hnsw       the HNSW path forced at every selectivity (the same statement), iterative
             relaxed_order and strict_order, and with iterative scan off (the pre-0.8
             behaviour: the index returns ef_search rows, the filter drops most)
recall@k = |list ∩ exact| / |exact|; p50 latency in ms per call (each statement in its own
transaction, the variants interleaved query by query).
Lexical: kb.search_lexical_ids(q, 20, filter) equals the unfiltered ranking restricted to the
filter (kb.search_lexical_ids(q, 1000) keeping the filter's documents), for every query
where that deep list holds at least 20 of them.

    python bench/filtered_recall.py --out bench/results/filtered-recall.json
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core import session  # noqa: E402

DIM = 384
CHUNKS_PER_DOC = 2
TENANT = uuid.UUID(int=33)
SELECTIVITY = {"50%": "p50", "10%": "p10", "1%": "p1", "0.1%": "p01"}
PROB = {"p50": 0.5, "p10": 0.1, "p1": 0.01, "p01": 0.001}
WORDS = [f"w{i:03d}" for i in range(400)]

# kb.search_semantic_ids' two statements, the filter's documents bound as one array value (as
# the function binds them: EXECUTE ... USING): the HNSW scan with the hashed membership test,
# the exact scan through the (tenant_id, doc_id) index
HNSW_SQL = """
with nn as materialized (
  select c.chunk_id, c.embedding <=> %(q)s as distance
  from kb.chunks c
  where c.tenant_id = kb.current_tenant() and (c.doc_id in (select unnest(%(docs)s::uuid[]))) is true
  order by c.embedding <=> %(q)s
  limit %(k)s
)
select chunk_id from nn order by distance, chunk_id
"""
EXACT_SQL = HNSW_SQL.replace("order by c.embedding <=> %(q)s\n", "order by (c.embedding <=> %(q)s) + 0, c.chunk_id\n").replace(
    "(c.doc_id in (select unnest(%(docs)s::uuid[]))) is true", "c.doc_id = any (%(docs)s::uuid[])")


def unit_rows(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def load(owner: str, app: str, n_chunks: int) -> dict:
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("set role kb_search")
        have = conn.execute("select count(*) from kb.chunks where tenant_id = %s", [TENANT]).fetchone()[0]
    if have == n_chunks:
        return {"load": "reused"}
    if have:
        raise SystemExit(f"the database holds {have} chunks, expected {n_chunks}: drop it (--data-dir)")
    rng = random.Random(7)
    nrng = np.random.default_rng(7)
    centres = unit_rows(nrng.normal(size=(256, DIM)))
    t0 = time.perf_counter()
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("drop index if exists kb.chunks_embedding_hnsw_idx")
    n_docs = n_chunks // CHUNKS_PER_DOC
    with psycopg.connect(app) as conn:
        session.configure_connection(conn)
        for start in range(0, n_docs, 1000):
            docs = [uuid.uuid4() for _ in range(min(1000, n_docs - start))]
            tags = [[t for t, p in PROB.items() if rng.random() < p] for _ in docs]
            nb = len(docs) * CHUNKS_PER_DOC
            vecs = unit_rows(centres[nrng.integers(0, 256, nb)] + nrng.normal(size=(nb, DIM)) * 0.06)
            texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))) for _ in range(nb)]
            with session.tenant_transaction(conn, TENANT), conn.cursor() as cur:
                cur.executemany("insert into kb.documents (doc_id, tenant_id, source_uri, title, content_hash, metadata)"
                                " values (%s, kb.current_tenant(), %s, '', repeat('0', 64), %s)",
                                [(d, f"bench:{d}", Jsonb({"tags": t})) for d, t in zip(docs, tags)])
                cur.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                            " select kb.current_tenant(), u.d, u.p, u.c, repeat('0', 64), u.e"
                            " from unnest(%s::uuid[], %s::int[], %s::text[], %s::vector[]) as u(d, p, c, e)",
                            [[docs[i // CHUNKS_PER_DOC] for i in range(nb)], [i % CHUNKS_PER_DOC for i in range(nb)],
                             texts, list(vecs)])
    load_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute("set maintenance_work_mem = '512MB'")
        conn.execute("create index chunks_embedding_hnsw_idx on kb.chunks using hnsw (embedding vector_cosine_ops)")
        hnsw_s = time.perf_counter() - t1
        conn.execute("analyze kb.chunks")
        conn.execute("analyze kb.documents")
    with psycopg.connect(app) as conn:
        session.configure_connection(conn)
        with session.tenant_transaction(conn, TENANT):
            conn.execute("select kb.refresh_term_blocks()")
    return {"load": "loaded", "load_s": round(load_s, 1), "hnsw_build_s": round(hnsw_s, 1)}


def timed(conn, sql: str, params, settings_sql: str | None = None):
    with session.tenant_transaction(conn, TENANT):
        if settings_sql:
            conn.execute(settings_sql)
        t0 = time.perf_counter()
        rows = [r[0] for r in conn.execute(sql, params)]
        return rows, (time.perf_counter() - t0) * 1000.0


HNSW_VARIANTS = {
    "hnsw relaxed_order": "set local hnsw.iterative_scan = relaxed_order; set local hnsw.ef_search = 100",
    "hnsw strict_order": "set local hnsw.iterative_scan = strict_order; set local hnsw.ef_search = 100",
    "hnsw no iterative scan": "set local hnsw.iterative_scan = off; set local hnsw.ef_search = 100",
}


def measure(app: str, n_queries: int, ks=(20, 120)) -> list[dict]:
    nrng = np.random.default_rng(11)
    rng = random.Random(11)
    out = []
    with psycopg.connect(app) as conn:
        session.configure_connection(conn)
        with session.tenant_transaction(conn, TENANT):
            # query vectors: near stored chunks' directions (a random stored chunk + noise)
            base = [np.asarray(r[0].to_numpy() if hasattr(r[0], "to_numpy") else r[0], dtype=np.float32)
                    for r in conn.execute("select embedding from kb.chunks tablesample bernoulli (1) limit %s",
                                          [n_queries])]
        qs = [q / np.linalg.norm(q) for q in (b + nrng.normal(size=DIM).astype(np.float32) * 0.04 for b in base)]
        words = [" ".join(rng.sample(WORDS, rng.randint(1, 3))) for _ in qs]
        for label, tag in [("none", None), *SELECTIVITY.items()]:
            f = None if tag is None else {"tags": tag}
            with session.tenant_transaction(conn, TENANT):
                doc_ids = conn.execute("select kb.search_filter_docs(%s)", [Jsonb(f) if f else None]).fetchone()[0]
                docs = len(doc_ids) if doc_ids is not None else None
                chunks = conn.execute("select count(*) from kb.chunks c where c.doc_id = any (kb.search_filter_docs(%s))",
                                      [Jsonb(f)]).fetchone()[0] if f else conn.execute(
                                          "select count(*) from kb.chunks").fetchone()[0]
            for k in ks:
                recall = {"function": [], **{v: [] for v in HNSW_VARIANTS}}
                ms = {"exact": [], **{v: [] for v in recall}}
                for q in qs:
                    params = {"q": q, "k": k, "docs": doc_ids}
                    exact, t = timed(conn, EXACT_SQL if f else EXACT_SQL.replace(" and c.doc_id = any (%(docs)s::uuid[])", ""),
                                     params)
                    ms["exact"].append(t)
                    got, t = timed(conn, "select chunk_id from kb.search_semantic_ids(%s, %s, %s)",
                                   [q, k, Jsonb(f) if f else None])
                    ms["function"].append(t)
                    recall["function"].append(len(set(got) & set(exact)) / max(1, len(exact)))
                    for v, set_sql in HNSW_VARIANTS.items():
                        sql = HNSW_SQL if f else HNSW_SQL.replace(
                            " and (c.doc_id in (select unnest(%(docs)s::uuid[]))) is true", "")
                        got, t = timed(conn, sql, params, set_sql)
                        ms[v].append(t)
                        recall[v].append(len(set(got) & set(exact)) / max(1, len(exact)))
                row = {"filter": label, "matching_docs": docs, "matching_chunks": chunks, "k": k,
                       "function_path": "unfiltered HNSW" if f is None else ("exact" if chunks <= 4000 else "HNSW iterative"),
                       "recall": {n: round(statistics.mean(v), 4) for n, v in recall.items()},
                       "recall_min": {n: round(min(v), 4) for n, v in recall.items()},
                       "p50_ms": {n: round(statistics.median(v), 2) for n, v in ms.items()}}
                out.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
            if f is not None:
                same = compared = 0
                lex_ms = {"filtered": [], "unfiltered": []}
                for i, w in enumerate(words):
                    with session.tenant_transaction(conn, TENANT):
                        keep = {r[0] for r in conn.execute("select unnest(kb.search_filter_docs(%s))", [Jsonb(f)])}
                        deep = [r[0] for r in conn.execute("select doc_id from kb.search_lexical_ids(%s, 1000)", [w])
                                if r[0] in keep]
                    # the service's lexical list (60 deep), filtered and not, alternately
                    for side in (("filtered", "unfiltered") if i % 2 == 0 else ("unfiltered", "filtered")):
                        got, t = timed(conn, "select doc_id from kb.search_lexical_ids(%s, 60, 1.2, 0.75, %s)",
                                       [w, Jsonb(f) if side == "filtered" else None])
                        lex_ms[side].append(t)
                        if side == "filtered":
                            got20 = got[:20]
                    if len(deep) >= 20 or len(deep) == len(keep):
                        compared += 1
                        same += got20 == deep[:20]
                out.append({"filter": label, "lexical_equal_restricted": same, "lexical_compared": compared,
                            "lexical_p50_ms": {n: round(statistics.median(v), 2) for n, v in lex_ms.items()}})
    return out


def markdown(result: dict) -> str:
    lines = [f"# Filtered search recall ({result['date']})", "",
             f"Command: `{result['command']}`", "",
             f"Corpus: {result['chunks']} synthetic chunks (2 per document), one tenant, 384-dimensional clustered"
             " random unit vectors (no embedder: the index's recall does not depend on where vectors come from);"
             " a filter {\"tags\": \"pX\"} keeps a random X of the documents, independent of their vectors.",
             f"Machine: {result['machine']}. {result['queries']} queries per row; recall@k against the exact filtered"
             " top k; p50 latency per call in ms.", "",
             "| filter | chunks in filter | k | kb.search_semantic_ids path | recall (function) | recall HNSW relaxed |"
             " recall HNSW strict | recall HNSW no iterative | p50 exact | p50 function | p50 HNSW relaxed |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "k" not in r:
            continue
        rc, ms = r["recall"], r["p50_ms"]
        lines.append(f"| {r['filter']} | {r['matching_chunks']} | {r['k']} | {r['function_path']} | {rc['function']:.3f}"
                     f" | {rc['hnsw relaxed_order']:.3f} | {rc['hnsw strict_order']:.3f} | {rc['hnsw no iterative scan']:.3f}"
                     f" | {ms['exact']:.1f} | {ms['function']:.1f} | {ms['hnsw relaxed_order']:.1f} |")
    lines += ["", "Lexical (BM25) within the filter equals the unfiltered ranking restricted to the filter"
              " (block-max search, exact by construction):", ""]
    for r in result["rows"]:
        if "lexical_compared" in r:
            ms = r["lexical_p50_ms"]
            lines.append(f"- {r['filter']}: {r['lexical_equal_restricted']} / {r['lexical_compared']} queries equal"
                         f" (where the 1000-deep unfiltered list holds 20 of the filter's documents); p50 of"
                         f" kb.search_lexical_ids 60 deep: {ms['filtered']} ms filtered, {ms['unfiltered']} ms"
                         " unfiltered (interleaved)")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default="/tmp/kb-filtered-recall")
    ap.add_argument("--chunks", type=int, default=40000)
    ap.add_argument("--queries", type=int, default=50)
    ap.add_argument("--out", default=str(ROOT / "bench/results/filtered-recall.json"))
    args = ap.parse_args(argv)
    settings = Settings(data_dir=Path(args.data_dir), database_name="kb_filtered_recall")
    owner = db.migrate(settings)
    app = db.app_url(settings)
    info = load(owner, app, args.chunks)
    with psycopg.connect(owner) as conn:
        versions = conn.execute("select version(), (select extversion from pg_extension where extname = 'vector')").fetchone()
    result = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
              "command": "python bench/filtered_recall.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "chunks": args.chunks, "queries": args.queries, **info,
              "machine": f"{platform.machine()}, {platform.python_version()}, {versions[0].split(',')[0]},"
                         f" pgvector {versions[1]}",
              "rows": measure(app, args.queries)}
    out = Path(args.out)
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    out.with_suffix(".md").write_text(markdown(result), encoding="utf-8")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
