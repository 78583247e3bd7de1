"""SQL side of the rerank service: the hash-chained audit log, curation, cache eviction,
the operational views, and migration 0002 down and up."""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from datetime import timezone

import psycopg
import pytest

from kb_rerank.audit import store as audit
from kb_rerank.db import database as db
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.settings import Settings

from tests.helpers import basis, insert_doc

ZERO = "0" * 64
SOURCES = ("lexical_only", "semantic_only", "hybrid_lexical_semantic", "manual_curation")

# kb.audit_append(kind, severity smallint, source, query_hash, trace_id, model,
#                 candidate_count, returned_count, duration_ms real, detail, mac, nonce, key_id)
# psycopg sends a Python float as double precision: callers cast to real (and smallint).
APPEND = (
    "select * from kb.audit_append(%s, %s::smallint, %s, %s, %s, %s, %s::int, %s::int, %s::real, %s, %s, %s, %s)"
)
KEY = audit.AuditKey(b"t" * 32)
OWNER_URL: list[str] = []


@pytest.fixture(autouse=True)
def _owner_url(owner_url):
    OWNER_URL[:] = [owner_url]


def qhash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def append(conn, kind="served", severity=0, source="hybrid_lexical_semantic", query="q",
           trace_id=None, model="bge-reranker", candidates=20, returned=5, duration_ms=12.5, detail=None):
    """Append as the service does (with the row's MAC; kb_rerank.audit.store), any values allowed."""
    fields = [kind, severity, source, qhash(query), trace_id or uuid.uuid4().hex,
              model, candidates, returned, duration_ms, detail]
    tenant = conn.execute("select kb.current_tenant()").fetchone()[0]
    nonce = uuid.uuid4().hex
    cur = conn.execute(APPEND, fields + [audit.mac(KEY.key, audit.canonical(tenant, nonce, *fields)), nonce,
                                         KEY.key_id])
    names = [d.name for d in cur.description]
    return dict(zip(names, cur.fetchone()))


def py_row_hash(r: dict) -> str:
    """The canonical form of kb.audit_row_hash, written independently."""
    ts = r["created_at"].astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")
    parts = [r["prev_hash"], r["seq"], r["kind"], r["severity"], r["source"], r["query_hash"],
             r["trace_id"], r["model"] or "", r["candidate_count"], r["returned_count"], r["detail"] or "", ts]
    if r["mac"] is not None:
        parts += [r["mac"], r["nonce"], r["key_id"]]
    return hashlib.sha256("|".join(str(p) for p in parts).encode("utf-8")).hexdigest()


def verify(conn, tenant):
    """kb.audit_verify() for one tenant, as the owner (the app role may not run it since 0010)."""
    with psycopg.connect(OWNER_URL[0]) as owner:
        with tenant_transaction(owner, tenant):
            return [r for r in owner.execute("select * from kb.audit_verify()").fetchall() if r[0] == tenant]


def put_cache(conn, tenant, *, source="hybrid_lexical_semantic", expired=False, query=None):
    with tenant_transaction(conn, tenant):
        conn.execute(
            "insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb, expires_at,"
            " trace_id, model) values (%s, kb.current_tenant(), %s, %s, %s::jsonb, now() + %s::interval, %s, %s)",
            [uuid.uuid4(), qhash(query or uuid.uuid4().hex), source, json.dumps([{"chunk_id": "x"}]),
             "-1 minute" if expired else "1 hour", "trace-1", "bge-reranker"],
        )


# --------------------------------------------------------------------------- audit chain


def test_audit_chain_appends_seq_and_hashes(app_conn, tenant):
    rows = []
    with tenant_transaction(app_conn, tenant):
        for i in range(5):
            rows.append(append(app_conn, kind=("served", "cache_hit", "fallback", "rejected", "served")[i],
                               severity=(0, 0, 2, 3, 0)[i], detail=(None, None, "timeout", "bad_input", None)[i],
                               model=None if i == 1 else "bge-reranker"))
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(r["tenant_id"] == tenant for r in rows)
    assert rows[0]["prev_hash"] == ZERO
    for prev, cur in zip(rows, rows[1:]):
        assert cur["prev_hash"] == prev["row_hash"]
    for r in rows:
        assert r["row_hash"] == py_row_hash(r), r["seq"]
    # the returned rows are the stored rows
    with tenant_transaction(app_conn, tenant):
        stored = app_conn.execute("select seq, row_hash from kb.kb_rerank_audit order by seq").fetchall()
        assert stored == [(r["seq"], r["row_hash"]) for r in rows]
    # the one canonical form, used by the function, agrees with Python
    with psycopg.connect(OWNER_URL[0]) as owner:
        assert owner.execute(
            "select bool_and(row_hash = kb.audit_row_hash(a)) from kb.kb_rerank_audit a where tenant_id = %s", [tenant]
        ).fetchone()[0] is True
    # appends in later transactions continue the chain
    with tenant_transaction(app_conn, tenant):
        r6 = append(app_conn)
    assert r6["seq"] == 6 and r6["prev_hash"] == rows[-1]["row_hash"]


def test_audit_verify_ok_then_names_the_tampered_row(app_conn, owner_conn, tenant):
    other = uuid.uuid4()
    with tenant_transaction(app_conn, tenant):
        ids = [append(app_conn)["audit_id"] for _ in range(6)]
    with tenant_transaction(app_conn, other):
        append(app_conn)
    assert verify(app_conn, tenant) == [(tenant, 6, None, None, None)]

    # a field changed (owner is superuser in tests: no RLS, no grant needed)
    owner_conn.execute("update kb.kb_rerank_audit set returned_count = 0 where audit_id = %s", [ids[2]])
    assert verify(app_conn, tenant) == [(tenant, 6, 3, ids[2], "row_hash mismatch")]
    assert verify(app_conn, other) == [(other, 1, None, None, None)]  # other tenant unaffected


def test_audit_verify_detects_rehashed_row_and_deleted_row(app_conn, owner_conn, tenant):
    with tenant_transaction(app_conn, tenant):
        ids = [append(app_conn)["audit_id"] for _ in range(5)]
    # a forger who recomputes row_hash breaks the next row's prev_hash link
    owner_conn.execute(
        "update kb.kb_rerank_audit a set detail = 'forged', row_hash = kb.audit_row_hash("
        " row(a.audit_id, a.tenant_id, a.seq, a.kind, a.severity, a.source, a.query_hash, a.trace_id, a.model,"
        " a.candidate_count, a.returned_count, a.duration_ms, 'forged', a.created_at, a.prev_hash, a.row_hash,"
        " a.mac, a.nonce, a.key_id)"
        "::kb.kb_rerank_audit) where audit_id = %s",
        [ids[1]],
    )
    assert verify(app_conn, tenant) == [(tenant, 5, 3, ids[2], "prev_hash mismatch")]
    # a deleted row leaves a gap
    owner_conn.execute("delete from kb.kb_rerank_audit where audit_id = any(%s)", [ids[1:2]])
    assert verify(app_conn, tenant) == [(tenant, 4, 3, ids[2], "seq gap")]


def test_audit_verify_as_owner_reports_every_tenant(app_conn, owner_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    for t in (a, b):
        with tenant_transaction(app_conn, t):
            append(app_conn)
            append(app_conn)
    rows = {r[0]: r[1:] for r in owner_conn.execute("select * from kb.audit_verify()")}
    assert rows[a] == rows[b] == (2, None, None, None)
    assert len(rows) == len(set(rows))


def test_audit_verify_of_a_tenant_without_entries(app_conn, tenant):
    assert verify(app_conn, tenant) == [(tenant, 0, None, None, None)]


def test_concurrent_appends_serialise_per_tenant(app_url, app_conn, tenant):
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def worker():
        try:
            with psycopg.connect(app_url) as conn:
                barrier.wait()
                for _ in range(25):
                    with tenant_transaction(conn, tenant):
                        append(conn)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    with tenant_transaction(app_conn, tenant):
        seqs = [r[0] for r in app_conn.execute("select seq from kb.kb_rerank_audit order by seq")]
    assert seqs == list(range(1, 201))
    assert verify(app_conn, tenant) == [(tenant, 200, None, None, None)]


def test_audit_append_without_tenant_raises(app_conn):
    for setting in (None, ""):
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="no tenant"):
            with app_conn.transaction():
                if setting is not None:
                    app_conn.execute("select set_config('auth.tenant_id', %s, true)", [setting])
                append(app_conn)


def test_audit_rejects_bad_values(app_conn, tenant):
    for kwargs in ({"kind": "hacked"}, {"severity": 4}, {"source": "nope"}):
        with pytest.raises(psycopg.errors.CheckViolation):
            with tenant_transaction(app_conn, tenant):
                append(app_conn, **kwargs)


def test_app_privileges_on_new_tables(app_conn):
    def privs(table):
        return {
            p for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
            if app_conn.execute("select has_table_privilege(%s, %s)", [table, p]).fetchone()[0]
        }

    assert privs("kb.kb_rerank_audit") == {"SELECT"}  # rows only through kb.audit_append
    assert privs("kb.kb_rerank_curation") == {"SELECT", "INSERT", "UPDATE", "DELETE"}
    assert privs("kb.kb_rerank_cache") == {"SELECT", "INSERT", "DELETE"}
    for view in ("kb.cache_stats", "kb.audit_summary", "kb.cache_hit_ratio"):
        assert privs(view) == {"SELECT"}, view


def test_app_cannot_rewrite_the_audit_log(app_conn, tenant):
    with tenant_transaction(app_conn, tenant):
        append(app_conn)
    for stmt in ("update kb.kb_rerank_audit set detail = 'x'", "delete from kb.kb_rerank_audit",
                 "truncate kb.kb_rerank_audit"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, tenant):
                app_conn.execute(stmt)


def test_new_tables_have_rls_enabled_and_forced(owner_conn):
    rows = owner_conn.execute(
        "select relname, relrowsecurity, relforcerowsecurity from pg_class"
        " where oid in ('kb.kb_rerank_audit'::regclass, 'kb.kb_rerank_curation'::regclass)"
    ).fetchall()
    assert sorted(rows) == [("kb_rerank_audit", True, True), ("kb_rerank_curation", True, True)]


def test_evict_function_is_definer_owned_by_kb_maint(owner_conn):
    row = owner_conn.execute(
        "select p.prosecdef, pg_get_userbyid(p.proowner), p.proconfig, r.rolbypassrls, r.rolcanlogin"
        " from pg_proc p join pg_roles r on r.oid = p.proowner"
        " where p.oid = 'kb.evict_expired_cache(integer)'::regprocedure"
    ).fetchone()
    assert row[0] is True and row[1] == "kb_maint"
    assert any(c.startswith("search_path=") for c in row[2])
    assert row[3] is True and row[4] is False
    # the hash and the check are SECURITY INVOKER; the append is a definer owned by kb_audit
    for fn in ("kb.audit_row_hash(kb.kb_rerank_audit)", "kb.audit_verify()"):
        assert owner_conn.execute("select prosecdef from pg_proc where oid = %s::regprocedure", [fn]).fetchone()[0] is False
    assert owner_conn.execute(
        "select prosecdef, pg_get_userbyid(proowner) from pg_proc where oid = 'kb.audit_append(text, smallint, text,"
        " text, text, text, integer, integer, real, text, text, text, text)'::regprocedure").fetchone() == (True, "kb_audit")


# --------------------------------------------------------------------------- RLS


def _curate(conn, tenant, chunk_id, position=0, query="pinned"):
    with tenant_transaction(conn, tenant):
        conn.execute(
            "insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id, note)"
            " values (kb.current_tenant(), %s, %s, %s, 'pinned by support')",
            [qhash(query), position, chunk_id],
        )


def _chunk_of(conn, tenant, doc_id):
    with tenant_transaction(conn, tenant):
        return conn.execute("select chunk_id from kb.chunks where doc_id = %s", [doc_id]).fetchone()[0]


def test_audit_and_curation_isolation_both_ways(app_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    chunks = {}
    for t, name in ((a, "alpha"), (b, "beta")):
        doc = insert_doc(app_conn, t, f"{name} doc", [f"{name} curated chunk"], [basis(1)])
        chunks[t] = _chunk_of(app_conn, t, doc)
        _curate(app_conn, t, chunks[t])
        with tenant_transaction(app_conn, t):
            append(app_conn, trace_id=f"trace-{name}")
    for t, other in ((a, b), (b, a)):
        with tenant_transaction(app_conn, t):
            assert app_conn.execute("select tenant_id, trace_id from kb.kb_rerank_audit").fetchall() == [
                (t, f"trace-{'alpha' if t == a else 'beta'}")
            ]
            assert app_conn.execute("select chunk_id from kb.kb_rerank_curation").fetchall() == [(chunks[t],)]
            # the other tenant's rows are invisible to update and delete
            assert app_conn.execute(
                "update kb.kb_rerank_curation set note = 'pwned' where tenant_id = %s", [other]).rowcount == 0
            assert app_conn.execute("delete from kb.kb_rerank_curation where tenant_id = %s", [other]).rowcount == 0
        # writing into the other tenant is refused by the policies
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, t):
                app_conn.execute(
                    "insert into kb.kb_rerank_audit (tenant_id, seq, kind, severity, source, query_hash, trace_id,"
                    " prev_hash, row_hash) values (%s, 99, 'served', 0, 'lexical_only', %s, 't', %s, %s)",
                    [other, ZERO, ZERO, ZERO],
                )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, t):
                app_conn.execute(
                    "insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id)"
                    " values (%s, %s, 5, %s)", [other, ZERO, chunks[other]])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, t):
                app_conn.execute("update kb.kb_rerank_curation set tenant_id = %s", [other])
        # a tenant cannot pin another tenant's chunk (foreign key on tenant_id, chunk_id)
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            _curate(app_conn, t, chunks[other], position=1)


def test_curation_follows_chunk_deletion(app_conn, tenant):
    doc = insert_doc(app_conn, tenant, "doomed", ["doomed chunk"], [basis(2)])
    _curate(app_conn, tenant, _chunk_of(app_conn, tenant, doc))
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("delete from kb.documents where doc_id = %s", [doc])
        assert app_conn.execute("select count(*) from kb.kb_rerank_curation").fetchone()[0] == 0


@pytest.mark.parametrize("setting", [None, ""])
def test_fail_closed_without_tenant(app_conn, tenant, setting):
    doc = insert_doc(app_conn, tenant, "fc doc", ["fc chunk"], [basis(3)])
    _curate(app_conn, tenant, _chunk_of(app_conn, tenant, doc))
    put_cache(app_conn, tenant)
    with tenant_transaction(app_conn, tenant):
        append(app_conn)
    with app_conn.transaction():
        if setting is not None:
            app_conn.execute("select set_config('auth.tenant_id', %s, true)", [setting])
        for q in ("select count(*) from kb.kb_rerank_audit", "select count(*) from kb.kb_rerank_curation",
                  "select count(*) from kb.kb_rerank_cache", "select count(*) from kb.cache_stats",
                  "select count(*) from kb.audit_summary", "select count(*) from kb.cache_hit_ratio"):
            assert app_conn.execute(q).fetchone()[0] == 0, q
        assert app_conn.execute("delete from kb.kb_rerank_curation").rowcount == 0
        assert app_conn.execute("update kb.kb_rerank_curation set note = 'x'").rowcount == 0


# --------------------------------------------------------------------------- cache eviction


def test_evict_deletes_only_expired_rows_of_all_tenants(app_conn, owner_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    for t in (a, b):
        put_cache(app_conn, t, expired=True)
        put_cache(app_conn, t, expired=True, source="lexical_only")
        put_cache(app_conn, t, expired=False)
    expired_before = owner_conn.execute(
        "select count(*) from kb.kb_rerank_cache where expires_at <= now()").fetchone()[0]
    assert expired_before >= 4
    # the function also evicts expired pair scores (kb.kb_rerank_pair_scores), after the cache rows
    expired_before += owner_conn.execute(
        "select count(*) from kb.kb_rerank_pair_scores where expires_at <= now()").fetchone()[0]
    # called by the maintenance side (the owner; the app role may not: test_sql_security)
    assert owner_conn.execute("select kb.evict_expired_cache(1)").fetchone()[0] == 1
    n = owner_conn.execute("select kb.evict_expired_cache()").fetchone()[0]
    assert n == expired_before - 1
    assert owner_conn.execute("select kb.evict_expired_cache()").fetchone()[0] == 0
    assert owner_conn.execute("select count(*) from kb.kb_rerank_cache where expires_at <= now()").fetchone()[0] == 0
    live = owner_conn.execute(
        "select tenant_id, count(*) from kb.kb_rerank_cache where tenant_id = any(%s) group by 1", [[a, b]]
    ).fetchall()
    assert sorted(live) == sorted([(a, 1), (b, 1)])
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        owner_conn.execute("select kb.evict_expired_cache(0)")


def test_app_cannot_delete_other_tenants_cache_rows(app_conn, owner_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    put_cache(app_conn, b, expired=True)
    with tenant_transaction(app_conn, a):
        assert app_conn.execute("delete from kb.kb_rerank_cache where tenant_id = %s", [b]).rowcount == 0
        assert app_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s", [b]).fetchone()[0] == 0
    assert owner_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s", [b]).fetchone()[0] == 1


def test_cache_has_trace_and_model_columns(app_conn, tenant):
    put_cache(app_conn, tenant)
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select trace_id, model from kb.kb_rerank_cache").fetchall() == [
            ("trace-1", "bge-reranker")]


# --------------------------------------------------------------------------- views


def test_views_show_only_the_callers_tenant(app_conn, owner_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    put_cache(app_conn, a)
    put_cache(app_conn, a)
    put_cache(app_conn, a, expired=True)
    put_cache(app_conn, a, source="manual_curation")
    put_cache(app_conn, b)
    with tenant_transaction(app_conn, a):
        for kind, sev in (("cache_hit", 0), ("cache_hit", 0), ("cache_hit", 0), ("served", 0),
                          ("fallback", 2), ("rejected", 3)):
            append(app_conn, kind=kind, severity=sev)
    with tenant_transaction(app_conn, b):
        append(app_conn, kind="served")

    with tenant_transaction(app_conn, a):
        stats = app_conn.execute(
            "select tenant_id, source, total_rows, live_rows, expired_rows, table_bytes > 0, table_size,"
            " oldest_cached_at <= newest_cached_at from kb.cache_stats order by source").fetchall()
        assert [(r[0], r[1], r[2], r[3], r[4], r[5], r[7]) for r in stats] == [
            (a, "hybrid_lexical_semantic", 3, 2, 1, True, True),
            (a, "manual_curation", 1, 1, 0, True, True),
        ]
        assert stats[0][6] == stats[1][6]  # the table's size, once per row
        summary = app_conn.execute(
            "select tenant_id, kind, severity, entries from kb.audit_summary order by kind").fetchall()
        assert summary == [(a, "cache_hit", 0, 3), (a, "fallback", 2, 1), (a, "rejected", 3, 1), (a, "served", 0, 1)]
        assert app_conn.execute("select tenant_id, hits, misses, ratio from kb.cache_hit_ratio").fetchall() == [
            (a, 3, 2, 0.6)]
    with tenant_transaction(app_conn, b):
        assert app_conn.execute("select tenant_id, hits, misses, ratio from kb.cache_hit_ratio").fetchall() == [
            (b, 0, 1, 0.0)]
        assert {r[0] for r in app_conn.execute("select tenant_id from kb.cache_stats")} == {b}
    # the owner (superuser in tests) sees every tenant
    seen = {r[0] for r in owner_conn.execute("select tenant_id from kb.cache_hit_ratio")}
    assert {a, b} <= seen


def test_views_are_security_invoker(owner_conn):
    for view in ("cache_stats", "audit_summary", "cache_hit_ratio"):
        opts = owner_conn.execute(
            "select reloptions from pg_class where oid = %s::regclass", [f"kb.{view}"]).fetchone()[0]
        assert "security_invoker=true" in opts, view


# --------------------------------------------------------------------------- migrations


def _has(url, name):
    with psycopg.connect(url) as conn:
        return conn.execute("select to_regclass(%s)", [name]).fetchone()[0] is not None


def test_upgrade_from_0001_to_head(server_url):
    name = f"kb_mig2_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = db.replace_url(server_url, dbname=name)
    s = Settings(database_url=url)
    # upgrade only to 0001 from base works (the idempotent layer is applied on reaching head)
    db.migrate(s, revision="0001_foundation")
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == "0001_foundation"
    assert not _has(url, "kb.kb_rerank_audit")
    db.migrate(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision()
    assert _has(url, "kb.kb_rerank_audit") and _has(url, "kb.kb_rerank_curation")
    assert _has(url, "kb.cache_hit_ratio")
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'drop database "{name}"')
