"""The "nothing relevant" gate of /v1/context (KB_GATE_MIN_SIMILARITY), measured on BEIR collections.

The gate (``kb_rerank.endpoints.context.flow.ContextFlow.compute``): over the fused candidates the service reranks
(``kb.search_hybrid`` with the production fusion, lists ``KB_FUSION_DEPTH`` deep, the best
``2 x KB_CANDIDATES`` kept), if no candidate has a lexical rank and the best semantic similarity
is below the threshold, the answer is ``answerable: false`` with no results.

For every collection (its scratch tenant, loaded by ``kb_rerank.eval.runs.load_collection``) this
script asks
  * its own judged queries (each has a relevant document): gating one is an error, the
    *false-gate rate* (target: under 2 %);
  * off-topic queries: the judged queries of every *other* given collection, asked of this one
    (another collection's questions have, by construction, no judged answer here); gating one
    is right, the *off-topic gate rate*;
records each query's best similarity and lexical hit count once, and sweeps the threshold
offline. Two rules are reported:
  * ``gate``: the service's rule (closed only when there is no lexical hit and the best
    similarity is below the threshold);
  * ``sim only``: the best similarity alone (what the gate would do if a lexical hit did not
    keep it open), for the trade-off.

Writes ``bench/results/gate-eval.json`` and ``bench/results/gate-eval.md``.

    KB_DATA_DIR=/tmp/kb-eval OPENBLAS_NUM_THREADS=1 python bench/gate_eval.py \\
        --datasets ../shared/datasets/{xquad-vi,cranfield,cisi,cacm} [--offtopic-limit 300]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.retrieval import store as search  # noqa: E402
from kb_rerank.eval.runs import CachedEmbedder, _default_conn_factory, embed_cache_dir, load_collection
from kb_rerank.eval.measures import load_beir  # noqa: E402
from kb_rerank.core.query import normalize_query  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core.session import run

RESULTS = ROOT / "bench" / "results"
THRESHOLDS = [round(0.70 + 0.01 * i, 2) for i in range(21)]  # 0.70 .. 0.90
TARGET_FALSE_GATE = 0.02


def judged_queries(coll) -> dict[str, str]:
    return {q: coll.queries[q] for q in sorted(coll.queries)
            if q in coll.qrels and any(g > 0 for g in coll.qrels[q].values())}


def spaced(items: list, limit: int | None) -> list:
    """At most ``limit`` items, evenly spaced (deterministic)."""
    if not limit or len(items) <= limit:
        return items
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


def signals(conn, tenant, settings: Settings, embedder, texts: list[str]) -> list[tuple[float | None, int]]:
    """(best similarity, lexical hits) over the service's fused candidates, per query text."""
    from kb_rerank.core.session import tenant_transaction

    out = []
    for text in texts:
        q = normalize_query(text)
        emb = embedder.embed_query(q)
        with tenant_transaction(conn, tenant):
            rows = run(conn, search.ahybrid, q, emb, settings.fusion_depth, **settings.fusion)[: 2 * settings.candidates]
        best = max((r.semantic_score for r in rows if r.semantic_score is not None), default=None)
        out.append((best, sum(1 for r in rows if r.lexical_rank is not None)))
    return out


def closed(sig, threshold: float, rule: str) -> bool:
    best, hits = sig
    below = best is None or best < threshold
    return below if rule == "sim only" else (hits == 0 and below)


def rate(sigs, threshold: float, rule: str) -> float:
    return sum(closed(s, threshold, rule) for s in sigs) / len(sigs) if sigs else float("nan")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", type=Path, required=True)
    ap.add_argument("--offtopic-limit", type=int, default=None,
                    help="at most N judged queries of each other collection (evenly spaced); default all")
    ap.add_argument("--out", type=Path, default=RESULTS / "gate-eval")
    args = ap.parse_args(argv)
    settings = Settings.from_env()
    from kb_rerank.models.embedders import get_embedder

    embedder = CachedEmbedder(get_embedder(settings), embed_cache_dir(settings))
    conn_factory = _default_conn_factory(settings)
    colls = {p: load_beir(p) for p in args.datasets}
    queries = {colls[p].name: judged_queries(colls[p]) for p in args.datasets}

    per: dict[str, dict] = {}
    t_all = time.perf_counter()
    with conn_factory() as conn:
        for path in args.datasets:
            name = colls[path].name
            t0 = time.perf_counter()
            load = load_collection(conn, path, settings, embedder, coll=colls[path])
            tenant = load["tenant"]
            own = list(queries[name].values())
            off: dict[str, list[str]] = {o: spaced(list(qs.values()), args.offtopic_limit)
                                         for o, qs in queries.items() if o != name}
            own_sig = signals(conn, tenant, settings, embedder, own)
            off_sig = {o: signals(conn, tenant, settings, embedder, texts) for o, texts in off.items()}
            all_off = [s for v in off_sig.values() for s in v]
            per[name] = {
                "own": own_sig, "off": off_sig, "seconds": round(time.perf_counter() - t0, 1),
                "num_own": len(own_sig), "num_off": {o: len(v) for o, v in off_sig.items()},
                "own_lexical_hit_share": sum(h > 0 for _, h in own_sig) / len(own_sig),
                "off_lexical_hit_share": {o: sum(h > 0 for _, h in v) / len(v) for o, v in off_sig.items()},
                "sweep": {rule: [{"threshold": t, "false_gate": rate(own_sig, t, rule),
                                  "offtopic_gated": rate(all_off, t, rule),
                                  "offtopic_gated_by_source": {o: rate(v, t, rule) for o, v in off_sig.items()}}
                                 for t in THRESHOLDS] for rule in ("gate", "sim only")},
            }
            sims_own = np.array([b for b, _ in own_sig if b is not None])
            sims_off = np.array([b for b, _ in all_off if b is not None])
            per[name]["best_similarity_quantiles"] = {
                "own": {q: float(np.quantile(sims_own, q)) for q in (0.01, 0.02, 0.05, 0.5)},
                "off": {q: float(np.quantile(sims_off, q)) for q in (0.5, 0.95, 0.98, 0.99)},
            }
            print(f"{name}: {len(own_sig)} own + {len(all_off)} off-topic queries in {per[name]['seconds']}s",
                  file=sys.stderr, flush=True)

    names = list(per)
    # per threshold, over the collections: the worst false-gate rate and the mean off-topic rate
    summary = {}
    for rule in ("gate", "sim only"):
        rows = []
        for i, t in enumerate(THRESHOLDS):
            fg = {n: per[n]["sweep"][rule][i]["false_gate"] for n in names}
            og = {n: per[n]["sweep"][rule][i]["offtopic_gated"] for n in names}
            rows.append({"threshold": t, "false_gate": fg, "offtopic_gated": og,
                         "max_false_gate": max(fg.values()), "mean_offtopic_gated": sum(og.values()) / len(og)})
        ok = [r for r in rows if r["max_false_gate"] < TARGET_FALSE_GATE]
        summary[rule] = {"rows": rows, "highest_threshold_under_target": max((r["threshold"] for r in ok), default=None)}

    date = datetime.now(timezone.utc).isoformat(timespec="seconds")
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    md = [(f"# Relevance gate sweep ({date}, {machine}, embedder {embedder.name}, "
           f"fusion {settings.fusion}, depth {settings.fusion_depth}, current KB_GATE_MIN_SIMILARITY "
           f"{settings.gate_min_similarity})\n"),
          ("Rates per collection: false gate = share of its judged queries gated (target < 2 %); "
           "off-topic gated = share of the other collections' judged queries gated when asked of it.\n")]
    for n in names:
        p = per[n]
        md.append(f"- {n}: {p['num_own']} judged queries (lexical hit in the candidates: "
                  f"{p['own_lexical_hit_share']:.1%}); off-topic {p['num_off']} (lexical hit: "
                  + ", ".join(f"{o} {v:.1%}" for o, v in p["off_lexical_hit_share"].items())
                  + "); best similarity 1%/2%/5% quantile of judged "
                  + "/".join(f"{v:.3f}" for v in list(p["best_similarity_quantiles"]["own"].values())[:3])
                  + ", 50%/95%/99% of off-topic "
                  + "/".join(f"{p['best_similarity_quantiles']['off'][q]:.3f}" for q in (0.5, 0.95, 0.99)))
    md.append("")
    for rule in ("gate", "sim only"):
        title = ("the service's rule (no lexical hit and similarity below)" if rule == "gate"
                 else "similarity alone (for comparison)")
        md.append(f"## {title}\n")
        md.append("| threshold | " + " | ".join(f"{n} false gate | {n} off-topic gated" for n in names)
                  + " | max false gate |")
        md.append("|---:|" + "---:|---:|" * len(names) + "---:|")
        for r in summary[rule]["rows"]:
            cells = " | ".join(f"{r['false_gate'][n]:.1%} | {r['offtopic_gated'][n]:.1%}" for n in names)
            md.append(f"| {r['threshold']:.2f} | {cells} | {r['max_false_gate']:.1%} |")
        md.append(f"\nHighest threshold with every collection's false-gate rate under "
                  f"{TARGET_FALSE_GATE:.0%}: {summary[rule]['highest_threshold_under_target']}\n")
    out_md = args.out.with_suffix(".md")
    out_md.parent.mkdir(parents=True, exist_ok=True)
    out_md.write_text("\n".join(md) + "\n", encoding="utf-8")
    args.out.with_suffix(".json").write_text(json.dumps({
        "date": date, "machine": machine, "embedder": embedder.name, "fusion": settings.fusion,
        "fusion_depth": settings.fusion_depth, "candidates": settings.candidates,
        "current_threshold": settings.gate_min_similarity, "thresholds": THRESHOLDS,
        "offtopic_limit": args.offtopic_limit, "total_s": round(time.perf_counter() - t_all, 1),
        "collections": {n: {k: v for k, v in per[n].items() if k not in ("own", "off")} for n in names},
        "signals": {n: {"own": per[n]["own"], "off": per[n]["off"]} for n in names},
        "summary": summary,
    }, indent=1) + "\n", encoding="utf-8")
    print("\n".join(md))
    print(f"(written {out_md} and .json)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
