"""Rerank your own candidates with the official Cohere SDK pointed at kb-rerank's /v2/rerank.

    pip install cohere
    TOKEN=$(.venv/bin/kb-rerank token --tenant 00000000-0000-4000-8000-000000000001)
    python examples/cohere_client.py --base-url http://127.0.0.1:8000 --token "$TOKEN"

`cohere.ClientV2(api_key=<our bearer token>, base_url=<the service>)`: the SDK's
`rerank(model=..., query=..., documents=[...], top_n=...)` posts to `<base_url>/v2/rerank` with
`Authorization: Bearer <api_key>`. The model name is echoed (`meta.requested_model`), the
service's own cross-encoder does the scoring. Base URL and token may come from KB_BASE_URL and
KB_TOKEN. Prints one line per result: rank, index into the documents, relevance score, text.
"""

from __future__ import annotations

import argparse
import os
import sys

import cohere
from cohere.core.api_error import ApiError

QUERY = "What is the capital of the United States?"
DOCUMENTS = [
    "Carson City is the capital city of the American state of Nevada.",
    "The Commonwealth of the Northern Mariana Islands is a group of islands in the Pacific Ocean. "
    "Its capital is Saipan.",
    "Washington, D.C. is the capital of the United States.",
    "Capital punishment has existed in the United States since before it was a country.",
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", default=os.environ.get("KB_BASE_URL", "http://127.0.0.1:8000"))
    p.add_argument("--token", default=os.environ.get("KB_TOKEN"), help="bearer token (default: $KB_TOKEN)")
    p.add_argument("--model", default="rerank-v3.5", help="echoed back; the service's own model scores")
    p.add_argument("--query", default=QUERY)
    p.add_argument("--top-n", type=int, default=3)
    p.add_argument("documents", nargs="*", help="candidates (default: four sentences about capitals)")
    args = p.parse_args(argv)
    if not args.token:
        p.error("no token: pass --token or set KB_TOKEN (kb-rerank token --tenant <uuid>)")
    documents = args.documents or DOCUMENTS

    co = cohere.ClientV2(api_key=args.token, base_url=args.base_url, timeout=60)
    try:
        response = co.rerank(model=args.model, query=args.query, documents=documents, top_n=args.top_n)
    except ApiError as exc:
        print(f"error: {exc.status_code} {exc.body}", file=sys.stderr)
        return 1
    print(f"== /v2/rerank id={response.id} results={len(response.results)}")
    for warning in (response.meta.warnings or []) if response.meta else []:
        print(f"warning: {warning}")  # a degraded answer (KB_V2_FALLBACK=fused, or the rerank budget)
    for rank, r in enumerate(response.results, 1):
        relevance = "unscored" if r.relevance_score is None else f"{r.relevance_score:.4f}"
        print(f"{rank}. index={r.index} relevance={relevance}  {documents[r.index]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
