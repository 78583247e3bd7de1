"""Hostile tenants: tenant B (as kb_app) against tenant A's rows, for EVERY table, view
and function in schema kb, enumerated from the catalog: a new object without a rule here
fails the suite (test_catalog_is_fully_covered)."""

from __future__ import annotations

import re
import uuid

import psycopg
from psycopg.types.json import Jsonb
import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.core.session import tenant_transaction

from tests.helpers import basis, insert_doc
from tests.live_server import SECRET, URL, FakeReranker, bearer
from kb_rerank.core import session
from kb_rerank.core.session import run

# table -> insert statement for a row of tenant %(t)s (the app role's point of view), or
# None where the app has no INSERT privilege at all.
TABLES = {
    "documents": "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                 " values (%(t)s, 'hostile:x', 'x', repeat('0', 64))",
    "chunks": "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " values (%(t)s, %(doc)s, 99, 'x', repeat('0', 64),"
              " (select array_fill(0.1::real, array[dim])::vector from kb.embedding_config))",
    "term_stats": None,
    "corpus_stats": None,
    "term_language_stats": None,
    "corpus_language_stats": None,
    "term_blocks": None,
    "audit_heads": None,  # no privilege at all: only kb.audit_append (owner kb_audit) reaches it
    "kb_generation": None,  # written only by the trigger function kb.bump_generation
    "embedding_config": None,  # no tenant_id: global configuration, read-only for the app
    "kb_rerank_cache": "insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb,"
                       " expires_at) values (gen_random_uuid(), %(t)s, repeat('a', 64), 'lexical_only', '[]',"
                       " now() + interval '1 hour')",
    "kb_rerank_audit": None,  # no INSERT: rows only through kb.audit_append (test_sql_security)
    "kb_rerank_audit_default": None,  # a partition (0015): no privilege at all, reached through the parent
    "audit_checkpoints": None,  # no privilege at all: written by `kb-rerank audit archive` (the owner)
    "sql_access": None,  # no privilege at all: written by `kb-rerank sql-access` (the owner), read by kb_access
    "kb_rerank_curation": "insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id)"
                          " values (%(t)s, repeat('a', 64), 0, %(chunk)s)",
    "tenant_policy": "insert into kb.tenant_policy (tenant_id, injection_policy) values (%(t)s, 'allow')",
    "guard_reviews": "insert into kb.guard_reviews (tenant_id, content_hash, decision, chunk_id)"
                     " values (%(t)s, repeat('e', 64), 'allow', %(chunk)s)",
    "kb_rerank_inflight": "insert into kb.kb_rerank_inflight (tenant_id, query_hash, source, generation, claimant,"
                          " expires_at) values (%(t)s, repeat('a', 64), 'lexical_only', 0, gen_random_uuid(),"
                          " now() + interval '1 minute')",
    "document_values": "insert into kb.document_values (tenant_id, doc_id, key, num)"
                       " values (%(t)s, %(doc)s, 'hostile', 1)",
    "kb_rerank_pair_scores": "insert into kb.kb_rerank_pair_scores (tenant_id, model, query_hash, chunk_id,"
                             " content_hash, score, expires_at) values (%(t)s, 'hostile', repeat('a', 64),"
                             " %(chunk)s, repeat('0', 64), 0.5, now() + interval '1 hour')",
}
VIEWS = {"cache_stats", "audit_summary", "cache_hit_ratio", "guard_flagged_share"}
# tables the app role cannot read at all (test_table_b_cannot_see_count_change_or_forge_a: refused)
NO_PRIVILEGE = {"audit_heads", "kb_rerank_audit_default", "audit_checkpoints", "sql_access"}
# function name -> how it is kept inside the tenant (checked by test_functions_as_b_return_nothing_of_a)
FUNCTIONS = {
    "current_tenant": "returns the transaction's tenant",
    "sql_access_tenant": "returns the session's own login role's mapped tenant (kb.sql_access): NULL for the app",
    "code_tokens": "pure text function", "to_tsv": "pure text function",
    "stop_words_en": "pure text function", "vi_syllable_shape": "pure text function", "query_is_english": "pure text function",
    "code_token_counts": "pure text function", "query_term_counts": "pure text function",
    "stem_config": "pure text function", "stem_tsv": "pure text function", "stem_length": "pure text function",
    "query_stems": "pure text function", "search_term_groups": "pure text function",
    "rerank_search": "security invoker: the search flow runs as its caller, under the caller's tenant and RLS"
                     " (tests/db/test_sql_rerank.py: two tenants, no tenant, a per-tenant reader)",
    "search_term_counts": "reads kb.term_stats under RLS: the caller's tenant's document languages (kb.query_languages)",
    "query_languages": "reads kb.term_stats under RLS: another tenant's id reads nothing (checked below)",
    "language_subtag": "pure text function", "text_script": "pure text function", "language_script": "pure text function",
    "script_language": "pure text function", "stem_languages": "pure text function", "language_lexeme": "pure text function",
    "tsv_language": "pure text function",
    "has_nospace": "pure text function", "nospace_class": "pure text function", "nospace_grams": "pure text function",
    "terms_tsquery": "pure text function", "doc_length": "pure text function", "audit_row_hash": "pure: hashes the row it is given",
    "chunks_derive": "trigger", "documents_rederive_chunks": "trigger", "chunks_maintain_stats": "trigger", "chunks_maintain_term_blocks": "trigger",
    "apply_stats_delta": "not executable by the app",
    "bump_generation": "trigger",
    "chunks_take_review": "trigger", "guard_reviews_apply": "trigger", "documents_typed_values": "trigger",
    "bm25_tf_part": "pure arithmetic", "ts_rank_tf": "a constant array", "ts_rank_tf_compute": "pure: ts_rank of constants",
    "refresh_term_blocks": "rebuilds kb.current_tenant()'s lists only",
    "search_lexical": "filters kb.current_tenant()", "search_semantic": "filters kb.current_tenant()",
    "search_hybrid": "security invoker: ranks with kb.hybrid_fusion, reads the texts under the caller's RLS",
    "hybrid_fusion": "security invoker: fuses what the two list searches return for kb.current_tenant()",
    "search_lexical_ids": "filters kb.current_tenant()", "search_semantic_ids": "filters kb.current_tenant()",
    # the optional pg_textsearch engine (tests/retrieval/test_lexical_engine.py: tenants apart there)
    "search_lexical_ids_bm25": "reads kb.current_tenant()'s partition only",
    "bm25_token": "pure text function", "bm25_lexemes": "pure text function", "bm25_query_text": "pure text function",
    "lexical_engine": "reads the catalog only",
    "lexical_engine_serves": "reads the catalog and kb.current_tenant()'s build record",
    "lexical_bm25_current": "reads the given tenant's build record under the caller's RLS",
    "lexical_bm25_rebuild": "not executable by the app",
    "lexical_bm25_partition": "not executable by the app", "chunks_maintain_lexical_bm25": "trigger",
    "use_lexical_engine": "not executable by the app",
    "retrieve_hybrid": "security invoker: reads under the caller's RLS, joins on kb.current_tenant()",
    "chunk_texts": "security invoker: reads under the caller's RLS, looks up kb.current_tenant()'s rows only",
    "apply_tenant_policies": "not executable by the app",
    "search_filter": "checks and rewrites its argument: reads no table",
    "search_filter_time": "checks and rewrites its argument: reads no table",
    "search_filter_number": "checks and rewrites its argument: reads no table",
    "search_filter_language": "checks and rewrites its argument: reads no table",
    "metadata_values": "reads its argument: no table",
    "search_filter_docs_args": "rewrites its argument: reads no table",
    "search_filter_docs_where": "pure: returns a constant text",
    "search_filter_docs_is_number": "pure: reads its argument", "search_filter_docs_num_in": "pure: compares its arguments",
    "search_filter_docs_ts_in": "compares its arguments: reads no table",
    "search_filter_docs": "filters kb.current_tenant() (and RLS for the app role); a filter naming A reads nothing",
    "audit_append": "writes the current tenant's chain only", "audit_verify": "not executable by the app",
    "audit_add_month": "not executable by the app",
    "record_outcome": "writes the tenant it is given; refused in another tenant's transaction (test_record_outcome)",
    "evict_expired_cache": "not executable by the app",
    "schema_layer_version": "pure: returns a constant (the version of the SQL layer applied)",
    "guard_flagged_share_rows": "security invoker: reads kb.chunks under the caller's RLS (test_guard_caller_documents)",
}
HOSTILE = [
    "x'); set role postgres; --", "reset role", "'; select set_config('auth.tenant_id', '{a}', false); --",
    "set session authorization default", "{a}", "$$; drop table kb.chunks; $$", "\\'; reset all; --",
]


@pytest.fixture(scope="module")
def ab(app_url):
    """Tenants A and B, each with a document, a chunk, a cache row, an audit row, a curation
    and a pair score."""
    a, b = uuid.uuid4(), uuid.uuid4()
    ids = {}
    with psycopg.connect(app_url) as conn:
        session.configure_connection(conn)
        for t, word in ((a, "alphasecret"), (b, "betapublic")):
            doc = insert_doc(conn, t, f"{word} title", [f"{word} zebra invoice"], [basis(3)])
            with tenant_transaction(conn, t):
                chunk = conn.execute("select chunk_id from kb.chunks where doc_id = %s", [doc]).fetchone()[0]
                conn.execute("insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb,"
                             " expires_at) values (gen_random_uuid(), kb.current_tenant(), repeat('b', 64),"
                             " 'lexical_only', '[]', now() + interval '1 hour')")
                from kb_rerank.audit import store as audit
                run(conn, audit.append_row, audit.AuditRecord(kind="served", source="lexical_only", query_hash="c" * 64,
                                                          trace_id="t"), key=audit.AuditKey(b"h" * 32))
                conn.execute("insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id)"
                             " values (kb.current_tenant(), repeat('c', 64), 0, %s)", [chunk])
                conn.execute("insert into kb.kb_rerank_pair_scores (tenant_id, model, query_hash, chunk_id,"
                             " content_hash, score, expires_at) values (kb.current_tenant(), 'm', repeat('c', 64),"
                             " %s, repeat('d', 64), 0.25, now() + interval '1 hour')", [chunk])
                conn.execute("select kb.refresh_term_blocks(4, 1)")  # BM25 lists for every word
                if t == a:  # B has no policy row, so B's own insert (rolled back) can be tried
                    conn.execute("insert into kb.tenant_policy (tenant_id) values (kb.current_tenant())")
                    # a review of A's chunk (B's own review of the same text is tried, rolled back)
                    conn.execute("insert into kb.guard_reviews (tenant_id, content_hash, decision, chunk_id)"
                                 " select kb.current_tenant(), content_hash, 'block', chunk_id from kb.chunks"
                                 " where chunk_id = %s", [chunk])
            ids[t] = {"doc": doc, "chunk": chunk, "word": word}
    return a, b, ids


def _snapshot(owner_conn, a):
    out = {}
    for table in TABLES:
        if table == "embedding_config":
            out[table] = owner_conn.execute("select md5(string_agg(x::text, ',' order by x::text))"
                                            " from kb.embedding_config x").fetchone()[0]
            continue
        out[table] = owner_conn.execute(
            f"select count(*), md5(coalesce(string_agg(x::text, ',' order by x::text), '')) from kb.{table} x"
            " where tenant_id = %s", [a]).fetchone()
    return out


def test_catalog_is_fully_covered(owner_conn):
    """Every table, view and (non-extension) function in kb has a rule in this file."""
    rels = dict(owner_conn.execute(
        "select c.relname, c.relkind from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'kb' and c.relkind in ('r', 'p', 'v', 'm', 'f')").fetchall())
    assert {k for k, v in rels.items() if v in ("r", "p", "f")} == set(TABLES)
    assert {k for k, v in rels.items() if v in ("v", "m")} == VIEWS
    funcs = {r[0] for r in owner_conn.execute(
        "select p.proname from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'kb'"
        " and not exists (select 1 from pg_depend d where d.objid = p.oid and d.deptype = 'e')")}
    assert funcs == set(FUNCTIONS)


def test_views_are_security_invoker(owner_conn):
    for (name, opts) in owner_conn.execute(
            "select c.relname, c.reloptions from pg_class c join pg_namespace n on n.oid = c.relnamespace"
            " where n.nspname = 'kb' and c.relkind = 'v'"):
        assert "security_invoker=true" in (opts or []), name


@pytest.mark.parametrize("table", sorted(TABLES))
def test_table_b_cannot_see_count_change_or_forge_a(table, app_conn, owner_conn, ab):
    a, b, ids = ab
    before = _snapshot(owner_conn, a)
    has_tenant = table != "embedding_config"
    readable = app_conn.execute("select has_table_privilege(%s, 'SELECT')", [f"kb.{table}"]).fetchone()[0]
    if not readable:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # no privilege at all (kb.audit_heads)
            with tenant_transaction(app_conn, b):
                app_conn.execute(f"select count(*) from kb.{table}")
    with tenant_transaction(app_conn, b):
        if has_tenant and readable:
            assert app_conn.execute(f"select count(*) from kb.{table} where tenant_id = %s", [a]).fetchone()[0] == 0
            assert app_conn.execute(f"select count(*) from kb.{table} where tenant_id <> %s", [b]).fetchone()[0] == 0
            assert app_conn.execute(f"select count(distinct tenant_id) from kb.{table}").fetchone()[0] <= 1
    for stmt in ([f"update kb.{table} set tenant_id = tenant_id where tenant_id = %s",
                  f"delete from kb.{table} where tenant_id = %s"] if has_tenant else
                 ["update kb.embedding_config set dim = dim where %s is not null",
                  "delete from kb.embedding_config where %s is not null"]):
        try:
            with tenant_transaction(app_conn, b):
                assert app_conn.execute(stmt, [a]).rowcount == 0, stmt
        except psycopg.errors.InsufficientPrivilege:
            pass  # no such privilege at all: also refused
    if TABLES[table]:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, b):
                app_conn.execute(TABLES[table], {"t": a, **ids[a]})
        with tenant_transaction(app_conn, b):  # the same insert for B itself works: the refusal is the tenant
            with app_conn.transaction():
                app_conn.execute(TABLES[table], {"t": b, **ids[b]})
                raise psycopg.Rollback()
    elif has_tenant:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, b):
                app_conn.execute(f"insert into kb.{table} (tenant_id) values (%s)", [a])
    assert _snapshot(owner_conn, a) == before


@pytest.mark.parametrize("setting", [None, ""])
def test_no_tenant_sees_nothing_in_any_table_or_view(setting, app_conn, ab):
    with app_conn.transaction():
        if setting is not None:
            app_conn.execute("select set_config('auth.tenant_id', %s, true)", [setting])
        for rel in sorted(set(TABLES) - {"embedding_config"} - NO_PRIVILEGE | VIEWS):
            assert app_conn.execute(f"select count(*) from kb.{rel}").fetchone()[0] == 0, rel
        for rel in sorted(NO_PRIVILEGE):
            assert not app_conn.execute("select has_table_privilege(%s, 'SELECT')", [f"kb.{rel}"]).fetchone()[0], rel


@pytest.mark.parametrize("view", sorted(VIEWS))
def test_views_as_b_show_nothing_of_a(view, app_conn, ab):
    a, b, _ = ab
    with tenant_transaction(app_conn, b):
        tenants = {r[0] for r in app_conn.execute(f"select tenant_id from kb.{view}")}
    assert a not in tenants and tenants <= {b}


def _norm(msg: str, *ids) -> str:
    for i in ids:
        msg = msg.replace(str(i), "<id>")
    return re.sub(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<uuid>", msg)


# chunk_doc: unique (doc_id, position) used to be checked across tenants, so B inserting a
# chunk into A's doc_id got a unique violation instead of the foreign-key error a random
# doc_id gets; migration 0005 scopes the key by tenant.
@pytest.mark.parametrize("target", ["curation_chunk", "chunk_doc"])
def test_errors_do_not_reveal_that_a_row_of_a_exists(target, app_conn, ab):
    a, b, ids = ab
    stmt = {
        "curation_chunk": "insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id)"
                          " values (kb.current_tenant(), repeat('d', 64), 0, %s)",
        "chunk_doc": "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " values (kb.current_tenant(), %s, 0, 'x', repeat('0', 64),"
                     " (select array_fill(0.1::real, array[dim])::vector from kb.embedding_config))",
    }[target]
    real = ids[a]["chunk" if target == "curation_chunk" else "doc"]
    errors = []
    for value in (real, uuid.uuid4()):
        with pytest.raises(psycopg.Error) as exc:
            with tenant_transaction(app_conn, b):
                app_conn.execute(stmt, [value])
        e = exc.value
        errors.append((type(e), e.sqlstate, _norm(str(e), value, b), _norm(e.diag.message_detail or "", value, b)))
    assert errors[0] == errors[1]


def test_functions_as_b_return_nothing_of_a(app_conn, owner_conn, ab):
    a, b, ids = ab
    word = ids[a]["word"]
    with tenant_transaction(app_conn, b):
        assert app_conn.execute("select kb.current_tenant()").fetchone()[0] == b
        for sql, params in (("select chunk_id from kb.search_lexical(%s, 50)", [f"{word} zebra"]),
                            ("select chunk_id from kb.search_semantic(%s, 50)", [basis(3)]),
                            ("select chunk_id from kb.search_hybrid(%s, %s, 50)", [f"{word} zebra", basis(3)]),
                            ("select chunk_id from kb.search_lexical_ids(%s, 50)", [f"{word} zebra"]),
                            ("select chunk_id from kb.search_semantic_ids(%s, 50)", [basis(3)]),
                            ("select chunk_id from kb.retrieve_hybrid(%s, %s, 60, 60, 'rrf', 1, 1, 1.2, 0.75, 50,"
                             " 'm', %s, 0)", [f"{word} zebra", basis(3), "e" * 64])):
            got = {r[0] for r in app_conn.execute(sql, params)}
            assert ids[a]["chunk"] not in got and got <= {ids[b]["chunk"]}, sql
        # a filter naming A's document (its source path, title, id, tenant) reads nothing of A
        a_uri = owner_conn.execute("select source_uri from kb.documents where doc_id = %s", [ids[a]["doc"]]).fetchone()[0]
        for f in ({"source_path": a_uri}, {"title": f"{word} title"}, {"doc_id": str(ids[a]["doc"])},
                  {"tenant_id": str(a)}):
            for sql, params in (("select chunk_id from kb.search_lexical(%s, 50, 1.2, 0.75, %s)", [f"{word} zebra"]),
                                ("select chunk_id from kb.search_semantic(%s, 50, %s)", [basis(3)]),
                                ("select chunk_id from kb.search_hybrid(%s, %s, 50, filter => %s)",
                                 [f"{word} zebra", basis(3)]),
                                ("select unnest(kb.search_filter_docs(%s))", [])):
                assert app_conn.execute(sql, [*params, Jsonb(f)]).fetchall() == [], (sql, f)
        from kb_rerank.audit import store as audit
        row = run(app_conn, audit.append_row, audit.AuditRecord(kind="served", source="lexical_only", query_hash="e" * 64,
                                                            trace_id="hostile"), key=audit.AuditKey(b"h" * 32))
        assert row["tenant_id"] == b
        live_a = owner_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s", [a]).fetchone()[0]
        # pure functions touch no table: they are immutable or stable with no table in their body
        for name in [f for f, rule in FUNCTIONS.items() if rule.startswith("pure")]:
            vol = owner_conn.execute("select provolatile from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
                                     " where n.nspname = 'kb' and proname = %s", [name]).fetchone()[0]
            assert vol == "i", name
    assert owner_conn.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s", [a]).fetchone()[0] == live_a
    # B naming A's tenant to kb.query_languages reads none of A's languages (RLS): the answer is
    # the one for a tenant with no documents
    with tenant_transaction(app_conn, b):
        own_a = app_conn.execute("select kb.query_languages(%s, %s), kb.query_languages(%s, null)",
                                 [f"{word} zebra", a, f"{word} zebra"]).fetchone()
        assert own_a[0] == own_a[1]
        assert app_conn.execute("select count(*) from kb.term_stats where tenant_id = %s", [a]).fetchone()[0] == 0
    # B rebuilding its BM25 lists leaves A's as they are
    lists_sql = "select array_agg((term, level, part, chunk_ids, tail) order by term, level, part) from kb.term_blocks where tenant_id = %s"
    lists_a = owner_conn.execute(lists_sql, [a]).fetchone()[0]
    assert lists_a and ids[a]["word"] in str(lists_a)
    with tenant_transaction(app_conn, b):
        assert app_conn.execute("select kb.refresh_term_blocks(2, 1)").fetchone()[0] >= 1
    assert owner_conn.execute(lists_sql, [a]).fetchone()[0] == lists_a
    for fn in ("kb.apply_stats_delta(kb.chunks[], integer)", "kb.chunks_derive()", "kb.documents_rederive_chunks()",
               "kb.chunks_maintain_stats()",
               "kb.chunks_maintain_term_blocks()", "kb.audit_row_hash(kb.kb_rerank_audit)", "kb.audit_verify()",
               "kb.evict_expired_cache(integer)", "kb.lexical_bm25_partition(uuid, boolean)", "kb.use_lexical_engine(text)",
               "kb.lexical_bm25_rebuild(uuid)",
               "kb.chunks_maintain_lexical_bm25()", "kb.search_lexical_ids_bm25(text, integer, double precision,"
               " double precision, jsonb, text)"):
        assert owner_conn.execute("select has_function_privilege('kb_app', %s, 'EXECUTE')", [fn]).fetchone()[0] is False, fn


def test_app_cannot_become_another_role(app_conn, owner_conn):
    owner = owner_conn.execute("select current_user").fetchone()[0]
    for role in ("kb_search", "kb_maint", "kb_stats", "kb_audit", owner):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with app_conn.transaction():
                app_conn.execute(f'set role "{role}"')


@pytest.mark.parametrize("text", HOSTILE)
def test_sql_in_query_strings_is_only_text(text, app_conn, ab):
    a, b, ids = ab
    q = text.format(a=a) + f" {ids[a]['word']} zebra"
    with tenant_transaction(app_conn, b):
        for sql, params in (("select chunk_id from kb.search_lexical(%s, 50)", [q]),
                            ("select chunk_id from kb.search_hybrid(%s, %s, 50)", [q, basis(3)])):
            assert ids[a]["chunk"] not in {r[0] for r in app_conn.execute(sql, params)}
        assert app_conn.execute("select current_user, kb.current_tenant()").fetchone() == ("kb_app", b)


def test_sql_in_query_strings_through_the_api(settings, embedder, ab):
    a, b, ids = ab
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder)
    a_ids = {str(ids[a]["chunk"]), str(ids[a]["doc"])}
    with TestClient(app) as client:
        for text in HOSTILE:
            for source in ("hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation"):
                r = client.post(URL, json={"query": text.format(a=a) + f" {ids[a]['word']} zebra", "source": source},
                                headers=bearer(b))
                assert r.status_code == 200, r.text
                got = {x["chunk_id"] for x in r.json()["results"]} | {x["doc_id"] for x in r.json()["results"]}
                assert not (got & a_ids)
                assert ids[a]["word"] not in r.text.replace(text.format(a=a), "")
