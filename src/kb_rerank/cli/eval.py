"""`kb-rerank eval`: ranking quality of one retrieval mode on a BEIR-layout folder, and what
the prompt-injection guard policy takes from it (``kb_rerank.eval.runs``, "Guard policy")."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kb_rerank.cli.common import command
from kb_rerank.core.settings import Settings


def register(sub) -> None:
    text = "evaluate ranking quality (nDCG@10, MRR@10, Recall@40, Recall@100) on a BEIR folder"
    e = command(sub, "eval", help=text)
    e.add_argument("dataset", type=Path, help="BEIR folder: corpus.jsonl, queries.jsonl, qrels/test.tsv")
    e.add_argument("--mode", choices=["lexical", "semantic", "hybrid", "rerank"], default="hybrid",
                   help="the ranking evaluated: BM25, embeddings, both fused (default), or fused then reranked by "
                        "the cross-encoder")
    e.add_argument("--k", type=int, default=10, help="cut-off of nDCG and MRR (default 10)")
    e.add_argument("--candidates", type=int, default=None,
                   help="hybrid/rerank: top-k of each list before fusion (default KB_CANDIDATES)")
    e.add_argument("--limit-queries", type=int, default=None, help="evaluate only the first N queries")
    e.add_argument("--json", type=Path, default=None, help="write the full result (per query) here")
    e.add_argument("--no-cache", action="store_true", help="do not use the on-disk embedding cache")
    e.add_argument("--quiet", action="store_true", help="no progress bars (ingestion, query embedding, search)")
    e.add_argument("--guard-policy", choices=["exclude", "demote", "allow"], default=None,
                   help="injection policy of the guarded figures (default: the tenant's kb.tenant_policy, "
                        "else the service default, exclude)")
    e.add_argument("--rescan-guard", action="store_true",
                   help="re-score the collection's stored guard verdicts with the current detectors and "
                        "weights first (as `kb-rerank guard scan`; a reused tenant keeps the verdicts of "
                        "the detector that ingested it)")
    e.set_defaults(func=cmd_eval)


def format_guard(res: dict) -> list[str]:
    """The guarded figures (res["guard"]): nDCG under the policy, the judged-relevant flagged."""
    g, k = res["guard"], res["k"]
    rel, ranked = g["relevant"], g["ranked"]
    source = "--guard-policy" if g["policy_source"] == "override" else "the tenant's policy"
    n = rel["judged_relevant"]
    scan = res.get("load", {}).get("guard_scan")
    return [
        *([f"  guard scan: {scan}"] if scan else []),
        f"  guard policy {g['policy']} ({source}; demote factor {g['demote_factor']:g})",
        f"  nDCG@{k} guarded {g[f'ndcg@{k}']:.4f} (Δ {g[f'delta_ndcg@{k}']:+.4f}; "
        f"nDCG changed on {g['queries_changed']} queries; in the lists {ranked['excluded']} excluded, "
        f"{ranked['demoted']} demoted)",
        f"  judged-relevant flagged {rel['flagged']}/{n} ({100 * rel['flagged_share']:.1f}%): "
        f"excluded {rel['excluded']}, demoted {rel['demoted']} (keyword-stuffed {rel['spam_flagged']})",
    ]


def format_result(res: dict) -> str:
    k, rk = res["k"], res["recall_k"]
    t = res["timing"]
    lines = [
        f"{res['dataset']} · {res['mode']} · {res['num_queries']} queries · tenant {res['tenant']}",
        f"  nDCG@{k}   {res[f'ndcg@{k}']:.4f}",
        f"  MRR@{k}    {res[f'mrr@{k}']:.4f}",
        *([f"  Recall@40  {res['recall@40']:.4f}"] if "recall@40" in res else []),
        f"  Recall@{rk} {res[f'recall@{rk}']:.4f}",
        *(format_guard(res) if "guard" in res else []),
        f"  load {t['load_s']:.1f}s ({res['load']['ingest']}), query embeddings {t['embed_queries_s']:.1f}s, "
        f"search {t['search_s']:.1f}s" + (f", rerank {t['rerank_s']:.1f}s" if "rerank_s" in t else "")
        + f", {t['per_query_ms']:.1f} ms/query, total {t['total_s']:.1f}s",
    ]
    return "\n".join(lines)


def cmd_eval(args, settings: Settings) -> int:
    from kb_rerank.db.database import migrate
    from kb_rerank.eval.runs import RerankUnavailable, evaluate_collection

    migrate(settings)  # idempotent: a fresh server gets the schema and roles first
    try:
        res = evaluate_collection(
            settings, args.dataset, args.mode, args.k, candidates=args.candidates,
            limit_queries=args.limit_queries, cache=not args.no_cache, progress=not args.quiet,
            guard_policy=args.guard_policy, rescan_guard=args.rescan_guard,
        )
    except RerankUnavailable as exc:
        print(f"kb-rerank eval: skipped: {exc}", file=sys.stderr)
        return 2
    print(format_result(res))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        print(f"  written to {args.json}")
    return 0
