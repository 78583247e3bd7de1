"""Sweep the hybrid fusion parameters of kb.search_hybrid over BEIR collections.

For every collection (loaded into its scratch tenant by ``kb_rerank.eval.runs.load_collection``,
so nothing is re-embedded when ``bench/quality.py`` / ``kb-rerank eval`` ran before), each query's
two lists are fetched **once** (``kb.search_lexical`` at depth 100: documents, best chunk each;
``kb.search_semantic`` at each chunk depth ``kb.search_hybrid`` reads for the swept candidate
counts: 2k, and deeper where 2k chunks hold fewer than k documents; HNSW is approximate, so the
prefix of a deeper read is not always the shallower read), the functions ``kb.search_hybrid``
calls, and fused in Python exactly as
``retrieval/sql/search_hybrid.sql`` does (per document):

    lexical documents = the top-k of the lexical list (rank = position);
    semantic documents = first-seen documents of the first n chunks, n = 2k, then x4 (up to
        1000) while they hold fewer than k documents and the tenant has more chunks; top k;
    full outer join on doc_id; carried chunk = that of the list ranking the document higher
        (semantic on a tie);
    rrf:    score = lexical_weight / (rrf_k + lexical_rank) + semantic_weight / (rrf_k + semantic_rank)
            (a missing rank contributes 0)
    convex: score = (lexical_weight * lexn + semantic_weight * semn) / (lexical_weight + semantic_weight),
            lexn / semn = min-max normalised score within the list's top k (1 if max = min; missing 0)
    dbsf:   (Python only, not in the SQL) distribution-based score fusion as in Qdrant: the convex
            formula with lexn / semn = (s - (mean - 3 std)) / (6 std) over the list's top k
            (population std), clipped to [0, 1] (1 if std = 0; missing 0)
    order by score desc, chunk_id (uuid byte order),

then scored with ``kb_rerank.eval.measures.evaluate_run`` (nDCG@10). The lexical list's prefix is the
shallower list (exact top-k, same tie-break). This is checked: ``--verify N`` queries per collection (default 8) are also sent through
``kb.search_hybrid`` for several configurations and the chunk order must be identical (scores
equal to 1e-12); the script exits non-zero otherwise.

``chunk rrf`` is the earlier chunk-id fusion (full outer join on chunk_id of the top-k lexical
documents and the top-k semantic *chunks*; a document reached through two chunks counts twice),
computed in Python only, for the before/after comparison on the same lists.

Grid: candidates k in {20, 40, 60, 100} x
  rrf (and chunk rrf): rrf_k in {10, 30, 60} x (lexical_weight, semantic_weight) in
      {(1,1), (1,1.5), (1,2), (1.5,1), (0.7,1.3), (2,1), (3,1)};
  convex and dbsf: (lexical_weight, semantic_weight) in {(0.8,0.2), (0.7,0.3), (0.6,0.4), (0.5,0.5), (0.4,0.6), (0.3,0.7)}.
``--fusions`` picks which families are swept (default: rrf convex chunk; dbsf only when named).

Selection criterion (never on one collection): margin(c, config) = hybrid nDCG@10 - max(lexical,
semantic nDCG@10) on collection c; choose the configuration with the largest *minimum* margin over
the collections (ties: larger mean nDCG@10, then fewer candidates, then the grid order), among the
per-document fusions (rrf, convex, and dbsf when swept; dbsf is not checked by ``--verify``, it has
no SQL twin); chunk rrf is reported, never chosen. Also leave-one-collection-out: choose on all but
one, report the held-out one. The best configurations of the swept families (rrf, convex, dbsf)
are compared the same way (a score-aware fusion is kept only if it wins).

``--k1`` / ``--b`` read the lexical list with other BM25 parameters than the service's (1.2 / 0.75),
for the parameter comparison in ``bench/results/bm25-params-2026-12-01.md``; the verification
then calls ``kb.search_hybrid`` with the same ones.

Writes ``bench/results/fusion-sweep.json`` and prints Markdown tables on stdout.

    KB_DATA_DIR=/tmp/kb-eval OPENBLAS_NUM_THREADS=1 python bench/fusion_sweep.py \\
        --datasets ../shared/datasets/{xquad-vi,cranfield,cisi,cacm}
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.retrieval import store as search  # noqa: E402
from kb_rerank.eval.runs import CachedEmbedder, _default_conn_factory, _doc_map, embed_cache_dir, load_collection
from kb_rerank.eval.measures import evaluate_run, load_beir  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core import session

RESULTS = ROOT / "bench" / "results"
DEPTH = 100
SEM_DEPTH = 2 * DEPTH  # chunks: kb.search_hybrid reads 2k chunks first
SEM_MAX = 1000  # its cap
CANDIDATES = (20, 40, 60, 100)
RRF_KS = (10, 30, 60)
WEIGHTS = ((1.0, 1.0), (1.0, 1.5), (1.0, 2.0), (1.5, 1.0), (0.7, 1.3), (2.0, 1.0), (3.0, 1.0))
CONVEX_WEIGHTS = ((0.8, 0.2), (0.7, 0.3), (0.6, 0.4), (0.5, 0.5), (0.4, 0.6), (0.3, 0.7))
FUSIONS = ("rrf", "convex", "chunk", "dbsf")
DEFAULT_FUSIONS = ("rrf", "convex", "chunk")
SCORE_FUSIONS = ("convex", "dbsf")  # score-aware: no rrf_k, CONVEX_WEIGHTS


def make_grid(fusions) -> list[tuple]:
    """(fusion, candidates, rrf_k, lexical_weight, semantic_weight); rrf_k is 0 for convex / dbsf."""
    grid = []
    for f in fusions:
        if f in SCORE_FUSIONS:
            grid += [(f, c, 0, lw, sw) for c in CANDIDATES for (lw, sw) in CONVEX_WEIGHTS]
        else:
            grid += [(f, c, r, lw, sw) for c in CANDIDATES for r in RRF_KS for (lw, sw) in WEIGHTS]
    return grid


GRID = make_grid(DEFAULT_FUSIONS)
_S = Settings()
PRODUCTION = (_S.fusion_method, _S.fusion_depth, _S.rrf_k, _S.lexical_weight, _S.semantic_weight)  # the defaults
# SQL defaults of kb.search_lexical, which kb.search_hybrid calls without k1/b
SQL_K1, SQL_B = 1.2, 0.75


def sem_depths(k: int, sem_at):
    """Yield the chunk depths kb.search_hybrid reads for k: 2k, then x4 up to SEM_MAX."""
    n = min(2 * k, SEM_MAX)
    while True:
        yield n
        if n >= SEM_MAX:
            return
        n = min(4 * n, SEM_MAX)


def semantic_docs(sems: dict, k: int):
    """The semantic document list kb.search_hybrid builds: [(chunk_id, doc_id, doc_rank, score)].

    ``sems``: chunk depth -> [(chunk_id, doc_id, chunk_rank, score)] as kb.search_semantic
    returned it at that depth (HNSW is approximate: a prefix of a deeper read is not always the
    shallower read, so each depth the SQL reads is fetched as such; see _read_lists)."""
    n = min(2 * k, SEM_MAX)
    while True:
        part = sems[n]
        docs, seen = [], set()
        for cid, did, _rank, score in part:
            if did not in seen:
                seen.add(did)
                docs.append((cid, did, len(docs) + 1, score))
        if len(docs) >= k or len(part) < n or n >= SEM_MAX:
            return docs[:k], n
        n = min(4 * n, SEM_MAX)


def _minmax(scores: dict) -> dict:
    if not scores:
        return {}
    lo, hi = min(scores.values()), max(scores.values())
    return {d: (1.0 if hi == lo else (s - lo) / (hi - lo)) for d, s in scores.items()}


def _dbsf(scores: dict) -> dict:
    """Qdrant's distribution-based normalisation: (s - (mean - 3 std)) / (6 std), population std,
    clipped to [0, 1]; 1 for every score if std = 0."""
    if not scores:
        return {}
    vals = list(scores.values())
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    if std == 0:
        return {d: 1.0 for d in scores}
    lo = mean - 3 * std
    return {d: min(1.0, max(0.0, (s - lo) / (6 * std))) for d, s in scores.items()}


def fuse(lex, sems, fusion: str, k: int, rrf_k: int, lw: float, sw: float):
    """Python twin of kb.search_hybrid: [(chunk_id, doc_id, score)] in SQL order.

    ``lex``: [(chunk_id, doc_id, rank, score)] documents at depth >= k; ``sems``: the chunk
    lists by depth. fusion ``chunk`` is the earlier chunk-id fusion (RRF; its semantic
    top-k chunks are the prefix of the 2k-deep read).
    """
    if fusion == "chunk":
        sem = sems[min(2 * k, SEM_MAX)]
        joined: dict = {}
        for cid, did, rank, _s in lex[:k]:
            joined[cid] = [did, rank, None]
        for cid, did, rank, _s in sem[:k]:
            if cid in joined:
                joined[cid][2] = rank
            else:
                joined[cid] = [did, None, rank]
        out = [(cid, did, (lw / (rrf_k + lr) if lr is not None else 0.0) + (sw / (rrf_k + sr) if sr is not None else 0.0))
               for cid, (did, lr, sr) in joined.items()]
        out.sort(key=lambda t: (-t[2], t[0]))
        return out
    ldocs = {did: (cid, rank, score) for cid, did, rank, score in lex[:k]}
    sdocs = {did: (cid, rank, score) for cid, did, rank, score in semantic_docs(sems, k)[0]}
    norm = _dbsf if fusion == "dbsf" else _minmax
    lnorm = norm({d: v[2] for d, v in ldocs.items()})
    snorm = norm({d: v[2] for d, v in sdocs.items()})
    out = []
    for did in ldocs.keys() | sdocs.keys():
        l, s_ = ldocs.get(did), sdocs.get(did)
        lr, sr = (l[1] if l else None), (s_[1] if s_ else None)
        cid = s_[0] if sr is not None and (lr is None or sr <= lr) else l[0]
        if fusion == "rrf":
            # same float8 arithmetic as SQL: weight / (integer rrf_k + integer rank), coalesce(.., 0)
            score = (lw / (rrf_k + lr) if lr is not None else 0.0) + (sw / (rrf_k + sr) if sr is not None else 0.0)
        else:
            score = (lw * lnorm.get(did, 0.0) + sw * snorm.get(did, 0.0)) / (lw + sw)
        out.append((cid, did, score))
    out.sort(key=lambda t: (-t[2], t[0]))  # uuid: Python int order == PostgreSQL byte order
    return out


def dedup_docs(rows, docmap) -> list[str]:
    seen, out = set(), []
    for _cid, did, *_ in rows:
        d = docmap[did]
        if d not in seen:
            seen.add(d)
            out.append(d)
    return out


def _read_lists(conn, query: str, qemb, ks=CANDIDATES):
    """Lexical documents at DEPTH, and the semantic chunk list at every depth kb.search_hybrid
    reads for the candidate counts ``ks`` (2k, and 4x deeper while those hold fewer than k
    documents): ([(chunk_id, doc_id, rank, score)], {depth: [...]})."""
    lex = [(x.chunk_id, x.doc_id, x.lexical_rank, x.score)
           for x in session.run(conn, search.alexical, query, DEPTH, k1=SQL_K1, b=SQL_B)]
    sems: dict[int, list] = {}
    for k in ks:
        for n in sem_depths(k, None):
            if n not in sems:
                sems[n] = [(x.chunk_id, x.doc_id, x.semantic_rank, x.score) for x in session.run(conn, search.asemantic, qemb, n)]
            part = sems[n]
            if len({d for _c, d, _r, _s in part}) >= k or len(part) < n:
                break
    return lex, sems


def fetch_lists(settings: Settings, path: Path, embedder, conn_factory, verify: int, verify_configs):
    """Load (idempotent) and fetch both lists per query at DEPTH; check fusion against the SQL."""
    from kb_rerank.core.session import tenant_transaction

    coll = load_beir(path)
    qids = sorted(q for q in coll.queries if q in coll.qrels)
    info: dict = {"dataset": coll.name, "path": str(path.resolve()), "num_queries": len(qids)}
    lists: dict[str, tuple[list, list]] = {}
    mismatches: list[dict] = []
    checked = 0
    lists_moved = 0
    with conn_factory() as conn:
        t0 = time.perf_counter()
        load = load_collection(conn, path, settings, embedder, coll=coll)
        info["load"] = {k: v for k, v in load.items() if k != "ingest_s"} | {"ingest_s": round(load["ingest_s"], 1)}
        tenant = load["tenant"]
        docmap = _doc_map(conn, tenant)
        t0 = time.perf_counter()
        qembs = {q: embedder.embed_query(coll.queries[q]) for q in qids}
        info["embed_queries_s"] = round(time.perf_counter() - t0, 1)
        t0 = time.perf_counter()
        for qid in qids:
            with tenant_transaction(conn, tenant):
                lex, sem = _read_lists(conn, coll.queries[qid], qembs[qid])
            lists[qid] = (lex, sem)
            for L in (lex, *sem.values()):
                assert [t[2] for t in L] == list(range(1, len(L) + 1)), "rank != position"
        info["fetch_s"] = round(time.perf_counter() - t0, 1)
        info["fetch_ms_per_query"] = round(1000 * (time.perf_counter() - t0) / len(qids), 1)
        # verification: evenly spaced queries, every verify config, against kb.search_hybrid
        step = max(1, len(qids) // max(verify, 1))
        for qid in qids[::step][:verify]:
            for (f, c, r, lw, sw) in verify_configs:
                # the lists are re-read in the same transaction as the kb.search_hybrid call: the
                # HNSW graph is shared by all tenants, so concurrent ingestion elsewhere can move
                # the approximate semantic list between two transactions
                with tenant_transaction(conn, tenant):
                    lex, sem = _read_lists(conn, coll.queries[qid], qembs[qid])
                    rows = session.run(conn, search.ahybrid, coll.queries[qid], qembs[qid], c, rrf_k=r, fusion=f,
                                         lexical_weight=lw, semantic_weight=sw, k1=SQL_K1, b=SQL_B)
                if (lex, sem) != lists[qid]:
                    lists_moved += 1
                sql = [(x.chunk_id, x.score) for x in rows]
                py = [(cid, s) for cid, _d, s in fuse(lex, sem, f, c, r, lw, sw)]
                checked += 1
                same = [a for a, _ in sql] == [a for a, _ in py] and all(
                    abs(a - b) <= 1e-12 for (_, a), (_, b) in zip(sql, py))
                if not same:
                    mismatches.append({"qid": qid, "config": [f, c, r, lw, sw], "sql_len": len(sql),
                                       "py_len": len(py)})
    info["verify"] = {"queries": min(verify, len(qids)), "configs": [list(v) for v in verify_configs],
                      "checked": checked, "mismatches": mismatches,
                      "lists_changed_since_fetch": lists_moved}
    return coll, qids, lists, docmap, info


def ndcg(run, qrels) -> tuple[float, dict[str, float]]:
    res = evaluate_run(run, qrels, k=10, recall_k=100)
    return res["ndcg@10"], {q: v["ndcg@10"] for q, v in res["per_query"].items()}


def choose(configs: dict, names: list[str], fusions=("rrf", "convex", "dbsf")):
    """Max over configs of the given fusions of min margin over `names`; ties: mean nDCG, fewer
    candidates, grid order."""
    def key(cfg):
        m = configs[cfg]
        return (min(m[n]["margin"] for n in names), sum(m[n]["ndcg"] for n in names) / len(names),
                -cfg[1], -GRID.index(cfg))
    return max((c for c in configs if c[0] in fusions), key=key)


def fmt_cfg(cfg) -> str:
    f, c, r, lw, sw = cfg
    if f in SCORE_FUSIONS:
        return f"{f} c={c} w={lw:g}/{sw:g}"
    return f"{'chunk rrf' if f == 'chunk' else 'rrf'} c={c} rrf_k={r} w={lw:g}/{sw:g}"


def main(argv=None) -> int:
    global GRID, SQL_K1, SQL_B
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", type=Path, required=True)
    ap.add_argument("--verify", type=int, default=8, help="queries per collection checked against kb.search_hybrid")
    ap.add_argument("--json", type=Path, default=RESULTS / "fusion-sweep.json")
    ap.add_argument("--fusions", nargs="+", choices=FUSIONS, default=list(DEFAULT_FUSIONS),
                    help="fusion families to sweep (chunk: the chunk-id RRF before issue 15, never chosen; "
                         "dbsf: Python only, not verified against SQL)")
    ap.add_argument("--k1", type=float, default=SQL_K1, help="BM25 k1 of the lexical list (default: the service's)")
    ap.add_argument("--b", type=float, default=SQL_B, help="BM25 b of the lexical list (default: the service's)")
    args = ap.parse_args(argv)
    SQL_K1, SQL_B = args.k1, args.b
    GRID = make_grid(args.fusions)
    if PRODUCTION not in GRID:
        GRID.append(PRODUCTION)
    settings = Settings.from_env()
    from kb_rerank.models.embedders import get_embedder

    embedder = CachedEmbedder(get_embedder(settings), embed_cache_dir(settings))
    conn_factory = _default_conn_factory(settings)
    verify_configs = [PRODUCTION, ("rrf", 100, 10, 1.0, 2.0), ("rrf", 40, 30, 0.7, 1.3), ("rrf", 60, 10, 1.5, 1.0),
                      ("convex", 40, 0, 0.5, 0.5), ("convex", 100, 0, 0.3, 0.7)]

    per: dict[str, dict] = {}
    infos: dict[str, dict] = {}
    configs: dict[tuple, dict] = {cfg: {} for cfg in GRID}
    failed = False
    for path in args.datasets:
        print(f"{path}: fetching lists", file=sys.stderr, flush=True)
        coll, qids, lists, docmap, info = fetch_lists(settings, path, embedder, conn_factory, args.verify,
                                                      verify_configs)
        name = coll.name
        infos[name] = info
        v = info["verify"]
        print(f"  {info['fetch_ms_per_query']} ms/query; verified {v['checked']} (query, config) pairs against "
              f"kb.search_hybrid: {len(v['mismatches'])} mismatches "
              f"({v['lists_changed_since_fetch']} with lists changed since the sweep fetch)", file=sys.stderr, flush=True)
        failed |= bool(v["mismatches"])
        qrels = {q: coll.qrels[q] for q in qids}
        lex_ndcg, lex_pq = ndcg({q: dedup_docs(lists[q][0], docmap) for q in qids}, qrels)
        sem_ndcg, sem_pq = ndcg({q: dedup_docs(lists[q][1][SEM_DEPTH], docmap) for q in qids}, qrels)
        best_single = max(lex_ndcg, sem_ndcg)
        best_pq = lex_pq if lex_ndcg >= sem_ndcg else sem_pq
        per[name] = {"lexical": lex_ndcg, "semantic": sem_ndcg, "best_single": best_single,
                     "best_single_method": "lexical" if lex_ndcg >= sem_ndcg else "semantic",
                     "num_queries": len(qrels)}
        for cfg in GRID:
            run = {q: dedup_docs(fuse(*lists[q], *cfg), docmap) for q in qids}
            h, pq = ndcg(run, qrels)
            diffs = [pq[q] - best_pq[q] for q in pq]
            n = len(diffs)
            mean = sum(diffs) / n
            se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else float("nan")
            configs[cfg][name] = {"ndcg": h, "margin": h - best_single, "margin_se": se}
    names = list(per)

    out = sys.stdout
    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"# Fusion sweep ({date}, {machine}, embedder {embedder.name}, BM25 k1 {SQL_K1:g} b {SQL_B:g})\n", file=out)
    for n in names:
        p = per[n]
        print(f"### {n} ({p['num_queries']} queries): lexical {p['lexical']:.4f}, semantic {p['semantic']:.4f}\n",
              file=out)
        print("| fusion | candidates | rrf_k | w_lex / w_sem | hybrid nDCG@10 | margin vs best single |", file=out)
        print("|---|---:|---:|---|---:|---:|", file=out)
        for cfg in GRID:
            m = configs[cfg][n]
            print(f"| {cfg[0]} | {cfg[1]} | {cfg[2] if cfg[0] not in SCORE_FUSIONS else '-'} | {cfg[3]:g} / {cfg[4]:g} "
                  f"| {m['ndcg']:.4f} | {m['margin']:+.4f} |", file=out)
        print(file=out)

    def summary_row(cfg, cols):
        m = configs[cfg]
        mins = min(m[n]["margin"] for n in cols)
        mean = sum(m[n]["ndcg"] for n in cols) / len(cols)
        return mins, mean

    print("### All collections: hybrid nDCG@10 (margin) per configuration, sorted by minimum margin\n", file=out)
    print("| configuration | " + " | ".join(names) + " | min margin | mean nDCG@10 |", file=out)
    print("|---|" + "---:|" * (len(names) + 2), file=out)
    ranked = sorted(GRID, key=lambda c: (-summary_row(c, names)[0], -summary_row(c, names)[1], c[1]))
    for cfg in ranked:
        mins, mean = summary_row(cfg, names)
        cells = " | ".join(f"{configs[cfg][n]['ndcg']:.4f} ({configs[cfg][n]['margin']:+.4f})" for n in names)
        print(f"| {fmt_cfg(cfg)} | {cells} | {mins:+.4f} | {mean:.4f} |", file=out)
    print(file=out)

    chosen = choose(configs, names)
    print(f"**Chosen on all {len(names)} collections: {fmt_cfg(chosen)}** "
          f"(current defaults: {fmt_cfg(PRODUCTION)})\n", file=out)
    print("| collection | lexical | semantic | hybrid (chosen) | margin ± SE | hybrid (production) | margin |",
          file=out)
    print("|---|---:|---:|---:|---:|---:|---:|", file=out)
    for n in names:
        c, p = configs[chosen][n], configs[PRODUCTION][n]
        print(f"| {n} | {per[n]['lexical']:.4f} | {per[n]['semantic']:.4f} | {c['ndcg']:.4f} | "
              f"{c['margin']:+.4f} ± {c['margin_se']:.4f} | {p['ndcg']:.4f} | {p['margin']:+.4f} |", file=out)
    print(file=out)

    loo = {}
    if len(names) > 2:
        print("### Leave one collection out (choose on the others, report the held-out one)\n", file=out)
        print("| held out | chosen on the others | held-out hybrid nDCG@10 | held-out margin | "
              "margin of the all-collection choice |", file=out)
        print("|---|---|---:|---:|---:|", file=out)
        for n in names:
            rest = [x for x in names if x != n]
            cfg = choose(configs, rest)
            m = configs[cfg][n]
            loo[n] = {"chosen": list(cfg), "ndcg": m["ndcg"], "margin": m["margin"]}
            print(f"| {n} | {fmt_cfg(cfg)} | {m['ndcg']:.4f} | {m['margin']:+.4f} | "
                  f"{configs[chosen][n]['margin']:+.4f} |", file=out)
        print(file=out)

    # per fusion family: its best configuration on all collections, and leave-one-out within the
    # family (the score-aware fusion is kept only if it wins across collections)
    best_per_fusion = {}
    print("### Best configuration per fusion (all collections; held-out nDCG@10 when chosen on the others)\n",
          file=out)
    print("| fusion | best on all | " + " | ".join(names) + " | min margin | held-out nDCG@10 (LOO) |", file=out)
    print("|---|---|" + "---:|" * (len(names) + 2), file=out)
    for fam in args.fusions:
        cfg = choose(configs, names, (fam,))
        fam_loo = {n: configs[choose(configs, [x for x in names if x != n], (fam,))][n]["ndcg"]
                   for n in names} if len(names) > 2 else {}
        best_per_fusion[fam] = {"config": list(cfg), "per_collection": configs[cfg], "leave_one_out_ndcg": fam_loo}
        cells = " | ".join(f"{configs[cfg][n]['ndcg']:.4f}" for n in names)
        held = ", ".join(f"{n} {v:.4f}" for n, v in fam_loo.items())
        print(f"| {fam} | {fmt_cfg(cfg)} | {cells} | {summary_row(cfg, names)[0]:+.4f} | {held} |", file=out)
    print(file=out)

    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "date": date, "machine": machine, "embedder": embedder.name, "depth": DEPTH, "bm25": {"k1": SQL_K1, "b": SQL_B},
        "grid": {"fusions": args.fusions, "candidates": CANDIDATES, "rrf_k": RRF_KS, "weights": WEIGHTS,
                 "convex_weights": CONVEX_WEIGHTS},
        "criterion": "max over configs of min over collections of (hybrid nDCG@10 - max(lexical, semantic)); "
                     "ties: mean nDCG@10, fewer candidates",
        "collections": {n: per[n] | {"info": infos[n]} for n in names},
        "configs": [{"fusion": f, "candidates": c, "rrf_k": r, "lexical_weight": lw, "semantic_weight": sw,
                     "per_collection": configs[(f, c, r, lw, sw)]} for (f, c, r, lw, sw) in GRID],
        "chosen": {"fusion": chosen[0], "candidates": chosen[1], "rrf_k": chosen[2], "lexical_weight": chosen[3],
                   "semantic_weight": chosen[4], "per_collection": configs[chosen]},
        "best_per_fusion": best_per_fusion,
        "production": {"config": list(PRODUCTION), "per_collection": configs[PRODUCTION]},
        "leave_one_out": loo,
    }, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"(written {args.json})", file=sys.stderr)
    if failed:
        print("ERROR: Python fusion differs from kb.search_hybrid on some queries (see verify in the JSON)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
