"""One default everywhere. kb.search_hybrid's own defaults are the service's
(convex 0.7 / 0.3 of lists 60 deep, rrf_k 10, BM25 1.2 / 0.75), so the same query gets the
same order from a psql caller writing `select * from kb.search_hybrid(q, embedding, language =>
l)` (as the app role; l the query's language, which the service detects), from `kb-rerank search` (the CLI's search path), from the eval's first stage and
from the API (a real HTTP server whose model is not ready: the fallback keeps the fused order)."""

from __future__ import annotations

import uuid

import httpx
import psycopg

from kb_rerank.cli.search import run_search
from kb_rerank.eval.runs import first_stage
from kb_rerank.app import create_app
from kb_rerank.core.language import detect_query_language
from kb_rerank.core.query import normalize_query
from kb_rerank.core import session
from kb_rerank.core.session import tenant_transaction

from tests.live_server import OPS_TOKEN, SECRET, FakeReranker, bearer, serve_in_thread

# the README's psql example (Vietnamese demo), an English one, an identifier
QUERIES = ["how do I emit hóa đơn", "đặt lại mật khẩu", "how do I reset my password", "ERR_402 payment required"]


class NotReady(FakeReranker):
    """A model that never becomes ready: every answer is the fallback, in fused order."""

    ready = False

    async def ensure_loaded_async(self):
        return False


def test_sql_cli_eval_and_api_give_the_same_order(settings, app_url, embedder, sample_tenant):
    tenant = sample_tenant
    keep = 2 * settings.candidates  # the rows the service's first stage keeps
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN), reranker=NotReady(), embedder=embedder)
    differs_from_old_defaults = 0
    with psycopg.connect(app_url) as conn, serve_in_thread(app) as base, \
            httpx.Client(base_url=base, timeout=60) as client:
        session.configure_connection(conn)
        for query in QUERIES:
            q = normalize_query(query)
            emb = embedder.embed_query(q)
            with tenant_transaction(conn, tenant):
                assert conn.execute("select current_user").fetchone()[0] == "kb_app"
                # the language the service detects, named as a psql caller names it
                sql = [r[0] for r in conn.execute("select chunk_id from kb.search_hybrid(%s, %s::vector, language => %s)",
                                                  [q, emb, detect_query_language(q)])]
                old = [r[0] for r in conn.execute(
                    "select chunk_id from kb.search_hybrid(%s, %s::vector, 20, 60, 'rrf', 1, 1, language => %s)",
                    [q, emb, detect_query_language(q)])]
                evald = session.run_awaited(first_stage(settings, "hybrid", 100, settings.candidates)
                                            .fetch(session.AwaitedConnection(conn), q, emb))
            assert len(sql) > 10, query
            differs_from_old_defaults += old[:keep] != sql[:keep]
            cli_rows = run_search(conn, settings, embedder, tenant, query, "hybrid", settings.candidates)
            assert [c.chunk_id for c in cli_rows] == sql[:keep], query
            assert [c.chunk_id for c in evald] == sql[:keep], query
            r = client.post("/v1/kb/search/rerank", json={"query": query}, headers=bearer(tenant))
            assert r.status_code == 200 and r.json()["fallback_reason"] == "model_not_ready", r.text
            assert [uuid.UUID(x["chunk_id"]) for x in r.json()["results"]] == sql[:settings.rerank_top_n], query
            assert r.json()["candidate_count"] == len(sql[:keep])
    # not vacuous: the SQL function's former defaults (rrf, 60, 1:1, 20 deep) rank differently
    assert differs_from_old_defaults >= 1
