"""Call kb-rerank over HTTP with httpx: hybrid search + rerank, then context for a language model.

    pip install httpx
    TOKEN=$(.venv/bin/kb-rerank token --tenant 00000000-0000-4000-8000-000000000001)
    python examples/python_client.py --base-url http://127.0.0.1:8000 --token "$TOKEN" "what does ERR_402 mean"

The base URL and token may come from KB_BASE_URL and KB_TOKEN instead. Prints the reranked
results of POST /v1/kb/search/rerank (rank, score, title) and the passages of POST
/v1/kb/context (citation number, tier, score, title), then the context block unless --no-context.
Exits 1 with the API's message on an error answer.
"""

from __future__ import annotations

import argparse
import os
import sys

import httpx


def search(client: httpx.Client, query: str, source: str) -> dict:
    r = client.post("/v1/kb/search/rerank", json={"query": query, "source": source})
    r.raise_for_status()
    return r.json()


def context(client: httpx.Client, query: str, top_n: int) -> dict:
    r = client.post("/v1/kb/context", json={"query": query, "top_n": top_n})
    r.raise_for_status()
    return r.json()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("query")
    p.add_argument("--base-url", default=os.environ.get("KB_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--token", default=os.environ.get("KB_TOKEN"), help="bearer token (default: $KB_TOKEN)")
    p.add_argument("--source", default="hybrid_lexical_semantic",
                   help="hybrid_lexical_semantic | lexical_only | semantic_only | manual_curation")
    p.add_argument("--top-n", type=int, default=3, help="passages asked of /v1/kb/context")
    p.add_argument("--no-context", action="store_true", help="do not print the context block")
    args = p.parse_args(argv)
    if not args.token:
        p.error("no token: pass --token or set KB_TOKEN (kb-rerank token --tenant <uuid>)")

    headers = {"Authorization": f"Bearer {args.token}"}
    with httpx.Client(base_url=args.base_url, headers=headers, timeout=60) as client:
        try:
            found = search(client, args.query, args.source)
            ctx = context(client, args.query, args.top_n)
        except httpx.HTTPStatusError as exc:
            print(f"error: {exc.response.status_code} {exc.response.text}", file=sys.stderr)
            return 1

    print(f"== POST /v1/kb/search/rerank source={args.source} results={len(found['results'])}"
          f" from_cache={found['from_cache']} fallback={found['fallback']} trace_id={found['trace_id']}")
    for i, r in enumerate(found["results"], 1):
        # a result the model did not score (a fallback, or past the rerank budget) has no relevance
        score = f"{r['rerank_score']:.4f}" if r["rerank_score"] is not None else f"fused {r['fused_score']:.4f}"
        print(f"{i:2d}. {score}  {r['doc_title']}")

    print(f"== POST /v1/kb/context answerable={ctx['answerable']} results={len(ctx['results'])}"
          f" filtered={len(ctx['filtered'])}")
    for r in ctx["results"]:
        print(f"[{r['citation']}] {r['tier'] or 'unscored':<6} {r['final_score']:.4f}  {r['doc_title']}")
    if not args.no_context:
        print("== context")
        print(ctx["context"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
