"""Cross-encoder pairs saved by the pair-score cache (kb.kb_rerank_pair_scores) on a realistic
mix of POST /v1/kb/search/rerank requests against the sample knowledge base (kb_rerank/demo_kb).

The mix: users iterating on a question. A session starts with a question (hybrid), then,
at random, switches the source (lexical_only / semantic_only / back to hybrid), rephrases the
question (another wording of the same need), or repeats an earlier wording (a result-cache
hit within the TTL). Sessions are drawn with a fixed seed until --requests requests. The
same mix runs twice, in-process (ASGI, no network), against the same tenant with its result
cache and pair scores emptied before each run: once with ``pair_cache=True``
(KB_PAIR_CACHE, the default) and once with ``pair_cache=False``. The result cache is on in
both runs, so the saving reported is what the pair cache adds on top of it.

Cross-encoder: the tiny offline model (kb_rerank.testing.tiny_model); what the pair cache saves is
counted in pairs (``Reranker.pairs_scored``), which is what costs time with a real model
(bench/model_cost.py). Database: the embedded server under --data-dir (created and
migrated on first use), the sample KB ingested into one tenant.

    python bench/pair_cache_bench.py [--requests 300] [--seed 7] [--data-dir /tmp/kb-pair-bench]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import psycopg  # noqa: E402

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.app import create_app  # noqa: E402
from kb_rerank.http.auth import JwtConfig, mint_token  # noqa: E402
from kb_rerank.core.session import tenant_transaction  # noqa: E402
from kb_rerank.models.embedders import get_embedder  # noqa: E402
from kb_rerank.ingest.loader import ingest_paths  # noqa: E402
from kb_rerank.models.cross_encoder import Reranker  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder  # noqa: E402
from kb_rerank.core import session

SECRET = "kb-rerank-bench-secret-0123456789abcdef"
EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "kb_rerank" / "demo_kb"
URL = "/v1/kb/search/rerank"

# One need per entry, in the wordings a user tries while iterating.
NEEDS = [
    ["how do I issue a refund", "refund a paid invoice", "how to refund a customer"],
    ["API rate limits", "what does HTTP 429 mean", "api rate limit 429 too many requests"],
    ["change the account owner", "transfer account ownership to a colleague"],
    ["create a credit note", "credit note for a wrong invoice", "how do credit notes work"],
    ["how long do you keep my data", "data retention and deletion"],
    ["ERR_402", "error ERR_402 subscription expired", "renewal declined ERR_402"],
    ["export reports to csv", "download revenue report as CSV"],
    ["create my first invoice", "getting started with invoices"],
    ["invoice in euros and dollars", "multi currency invoices", "exchange rate on invoices"],
    ["automatic reminders for overdue invoices", "payment reminder emails"],
    ["set up recurring invoices", "monthly recurring invoice"],
    ["reset my password", "forgot password"],
    ["product SKU codes", "what is a SKU"],
    ["single sign-on SAML", "configure SSO with Okta"],
    ["enable two-factor authentication", "2FA setup"],
    ["update payment method", "change credit card for subscription"],
    ["user roles and permissions", "give an accountant read-only access"],
    ["configure VAT rates", "tax rates on invoices"],
    ["xuất hóa đơn điện tử", "cách xuất hóa đơn"],
    ["đặt lại mật khẩu", "quên mật khẩu"],
    ["webhooks guide", "webhook signature verification"],
    ["what changed in v2.3.1", "release notes v2.3.1"],
]
SOURCES = ("hybrid_lexical_semantic", "lexical_only", "semantic_only")


def build_mix(n: int, seed: int) -> list[tuple[str, str]]:
    """(query, source) requests: sessions of one user iterating on one need."""
    rng = random.Random(seed)
    out: list[tuple[str, str]] = []
    while len(out) < n:
        wordings = NEEDS[rng.randrange(len(NEEDS))]
        asked: list[tuple[str, str]] = []
        q, src = wordings[0], SOURCES[0]
        for _ in range(rng.randint(2, 6)):
            asked.append((q, src))
            out.append((q, src))
            r = rng.random()
            if r < 0.45:  # same query, another source
                src = rng.choice([s for s in SOURCES if s != src])
            elif r < 0.75:  # rephrase (source kept)
                q = rng.choice([w for w in wordings if w != q] or wordings)
            else:  # repeat something asked earlier in the session
                q, src = rng.choice(asked)
    return out[:n]


def start(args) -> tuple[Settings, str]:
    base = Settings(data_dir=Path(args.data_dir), database_name=args.db)
    owner = db.migrate(base)
    return base.with_(database_url=owner, jwt_secret=SECRET, rate_limit_per_minute=0, cache_ttl_s=3600), owner


def load_tenant(settings: Settings, embedder) -> uuid.UUID:
    tenant = uuid.uuid4()
    with psycopg.connect(db.app_url(settings)) as conn:
        report = ingest_paths(conn, tenant, [EXAMPLES], embedder, settings)
    print(f"ingested the sample KB into tenant {tenant}: {report.summary()}", file=sys.stderr)
    return tenant


def reset_tenant_caches(settings: Settings, tenant: uuid.UUID) -> None:
    with psycopg.connect(db.app_url(settings)) as conn:
        session.configure_connection(conn)
        with tenant_transaction(conn, tenant):
            conn.execute("delete from kb.kb_rerank_cache where tenant_id = kb.current_tenant()")
            conn.execute("delete from kb.kb_rerank_pair_scores where tenant_id = kb.current_tenant()")


async def run_mix(settings: Settings, reranker: Reranker, embedder, tenant: uuid.UUID,
                  mix: list[tuple[str, str]], *, pair_cache: bool) -> dict:
    from litestar.testing import AsyncTestClient

    reset_tenant_caches(settings, tenant)
    app = create_app(settings.with_(pair_cache=pair_cache), reranker=reranker, embedder=embedder)
    headers = {"Authorization": "Bearer " + mint_token(tenant, JwtConfig(secret=SECRET), ttl_s=3600)}
    pairs0, calls0 = reranker.pairs_scored, reranker.calls
    result_hits = candidates = fallbacks = 0
    model_ms = 0
    t0 = time.perf_counter()
    async with AsyncTestClient(app) as client:
        for q, src in mix:
            r = await client.post(URL, json={"query": q, "source": src}, headers=headers)
            assert r.status_code == 200, r.text
            body = r.json()
            result_hits += body["from_cache"]
            candidates += body["candidate_count"]
            fallbacks += body["fallback"]
            model_ms += body["rerank_duration_ms"]
        metrics = (await client.get("/metrics")).text
    wall = time.perf_counter() - t0

    def counter(name: str) -> float:
        for line in metrics.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    return {
        "pair_cache": pair_cache, "requests": len(mix), "result_cache_hits": result_hits,
        "candidates_retrieved": candidates, "fallbacks": fallbacks,
        "model_calls": reranker.calls - calls0, "model_pairs_scored": reranker.pairs_scored - pairs0,
        "pair_cache_hits": int(counter("kb_rerank_pair_cache_hits_total")),
        "pair_cache_misses": int(counter("kb_rerank_pair_cache_misses_total")),
        "model_ms_total": model_ms, "wall_s": round(wall, 2),
    }


async def main_async(args) -> dict:
    settings, _owner = start(args)
    embedder = get_embedder(settings)
    tenant = load_tenant(settings, embedder)
    model_dir = build_tiny_cross_encoder(Path(tempfile.mkdtemp()) / "ce", seed=0)
    reranker = Reranker(str(model_dir), device="cpu", max_length=256)
    reranker.load()
    mix = build_mix(args.requests, args.seed)
    try:
        without = await run_mix(settings, reranker, embedder, tenant, mix, pair_cache=False)
        with_pc = await run_mix(settings, reranker, embedder, tenant, mix, pair_cache=True)
    finally:
        reranker.close()
    saved = without["model_pairs_scored"] - with_pc["model_pairs_scored"]
    return {
        "requests": args.requests, "seed": args.seed,
        "distinct_query_source_pairs": len(set(mix)), "distinct_queries": len({q for q, _ in mix}),
        "without_pair_cache": without, "with_pair_cache": with_pc,
        "pairs_saved": saved,
        "ratio_saved": round(saved / without["model_pairs_scored"], 4) if without["model_pairs_scored"] else 0.0,
        "cross_encoder": "tiny offline model (kb_rerank.testing.tiny_model)", "embedder": settings.embedder,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--data-dir", default="/tmp/kb-pair-bench")
    p.add_argument("--db", default="kb_pair_bench")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    out = asyncio.run(main_async(args))
    w, p_ = out["without_pair_cache"], out["with_pair_cache"]
    print(f"{out['requests']} requests ({out['distinct_queries']} distinct queries, "
          f"{out['distinct_query_source_pairs']} distinct query+source), seed {out['seed']}")
    print(f"  result-cache hits:              {w['result_cache_hits']} (both runs: {p_['result_cache_hits']})")
    print(f"  model pairs scored, pair cache off: {w['model_pairs_scored']}  ({w['model_calls']} model calls)")
    print(f"  model pairs scored, pair cache on:  {p_['model_pairs_scored']}  ({p_['model_calls']} model calls;"
          f" pair-cache hits {p_['pair_cache_hits']}, misses {p_['pair_cache_misses']})")
    print(f"  saved: {out['pairs_saved']} pairs = {out['ratio_saved']:.1%} of the model's pairs")
    print(json.dumps(out, indent=2, ensure_ascii=False))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
