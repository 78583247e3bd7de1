"""SQL access for one tenant (`kb-rerank sql-access`), tried as the SQL caller it is for: a
login role mapped to tenant B (a member of kb_sql_reader) connects itself, sets
auth.tenant_id to tenant A (and to nothing, and to garbage), reads every table and view of
schema kb it can read and calls every function of schema kb it can execute (found in the
catalog): nothing of A comes back. It cannot write, cannot grant itself anything, cannot
become another role; revoking ends it. The service role keeps choosing its tenant by the
setting."""

from __future__ import annotations

import io
import uuid

import psycopg
import pytest

from kb_rerank.cli import main as cli
from kb_rerank.db import database as db
from kb_rerank.db import sql_access
from kb_rerank.core.session import tenant_transaction

from tests.helpers import basis
from tests.db.test_hostile_tenants import TABLES, VIEWS, ab  # noqa: F401 - ab: the module fixture (tenants A and B)

READER = "kb_sql_reader"


def _url(owner_url: str, role: str, password: str) -> str:
    return db.replace_url(owner_url, user=role, password=password)


@pytest.fixture
def reader(owner_url, ab):
    """A login role mapped to tenant B, created by `grant`; revoked afterwards."""
    a, b, ids = ab
    role, pw = f"kb_test_reader_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(owner_url) as conn:
        got = sql_access.grant(conn, b, role=role, password=pw, app_role="kb_app")
    assert got.created and got.tenant == b
    yield role, _url(owner_url, role, pw)
    with psycopg.connect(owner_url) as conn:
        if conn.execute("select 1 from pg_roles where rolname = %s", [role]).fetchone():
            sql_access.revoke(conn, role=role)


# the settings a hostile session tries: none, A's (for the transaction, for the session), B's own, garbage
SETTINGS = [None, "A-local", "A-session", "B", "", "not-a-uuid"]


def _set(conn, setting, a, b):
    if setting == "A-local":
        conn.execute("select set_config('auth.tenant_id', %s, true)", [str(a)])
    elif setting == "A-session":
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(a)])
    elif setting == "B":
        conn.execute("select set_config('auth.tenant_id', %s, true)", [str(b)])
    elif setting is not None:
        conn.execute("select set_config('auth.tenant_id', %s, true)", [setting])


def _a_markers(ids, a) -> list[str]:
    return [str(a), str(ids[a]["chunk"]), str(ids[a]["doc"]), ids[a]["word"]]


# --------------------------------------------------------------------------- catalog


def test_reader_group_and_mapping_catalog(owner_conn, reader):
    """kb_sql_reader logs in nowhere and bypasses nothing; it holds no write privilege on any
    relation of kb and nothing on kb.sql_access; the mapped role is a member of it alone; the
    app role is not a member (nor the other way round); kb.sql_access is readable by kb_access
    only, under forced RLS; the lookup is a definer pinned like every other."""
    role, _ = reader
    assert owner_conn.execute(
        "select rolcanlogin, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb from pg_roles where rolname = %s",
        [READER]).fetchone() == (False, False, False, False, False)
    assert owner_conn.execute(
        "select rolcanlogin, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolreplication from pg_roles"
        " where rolname = %s", [role]).fetchone() == (True, False, False, False, False, False)
    groups = [r[0] for r in owner_conn.execute(
        "select g.rolname from pg_auth_members m join pg_roles g on g.oid = m.roleid"
        " where m.member = %s::regrole", [role])]
    assert groups == [READER]
    for x, y in (("kb_app", READER), (READER, "kb_app"), (role, "kb_app")):
        assert not owner_conn.execute("select pg_has_role(%s, %s, 'MEMBER')", [x, y]).fetchone()[0], (x, y)
    writes = owner_conn.execute(
        "select c.oid::regclass::text, p from pg_class c join pg_namespace n on n.oid = c.relnamespace,"
        " unnest(array['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER']) p"
        " where n.nspname = 'kb' and has_table_privilege(%s, c.oid, p)", [role]).fetchall()
    assert writes == []
    for who in ("public", "kb_app", READER, role, "kb_search", "kb_stats", "kb_audit"):
        for priv in ("SELECT", "INSERT", "UPDATE", "DELETE"):
            assert not owner_conn.execute("select has_table_privilege(%s, 'kb.sql_access', %s)",
                                          [who, priv]).fetchone()[0], (who, priv)
    assert owner_conn.execute("select relrowsecurity, relforcerowsecurity from pg_class"
                              " where oid = 'kb.sql_access'::regclass").fetchone() == (True, True)
    assert owner_conn.execute("select has_table_privilege('kb_access', 'kb.sql_access', 'SELECT')").fetchone()[0]
    assert owner_conn.execute(
        "select pg_get_userbyid(proowner), prosecdef, proconfig from pg_proc"
        " where oid = 'kb.sql_access_tenant()'::regprocedure").fetchone() == (
        "kb_access", True, ["search_path=pg_catalog, kb, pg_temp"])
    # no schema or database privilege beyond reading: no CREATE anywhere, no TEMP
    assert owner_conn.execute("select array_agg(nspname) from pg_namespace"
                              " where has_schema_privilege(%s, oid, 'CREATE')", [role]).fetchone()[0] is None
    assert not owner_conn.execute("select has_database_privilege(%s, current_database(), 'TEMPORARY')",
                                  [role]).fetchone()[0]
    assert not owner_conn.execute("select has_database_privilege(%s, current_database(), 'CREATE')",
                                  [role]).fetchone()[0]


# every function of kb the reader may execute, with arguments that exercise it
CALLS = {
    "kb.current_tenant()": "select kb.current_tenant()",
    "kb.sql_access_tenant()": "select kb.sql_access_tenant()",
    "kb.code_tokens(text)": "select kb.code_tokens('ERR_402 {word}')",
    "kb.to_tsv(text)": "select kb.to_tsv('{word} zebra')",
    "kb.doc_length(text)": "select kb.doc_length('{word} zebra')",
    "kb.terms_tsquery(text[])": "select kb.terms_tsquery(array['{word}'])",
    "kb.stop_words_en()": "select kb.stop_words_en()",
    "kb.vi_syllable_shape(text)": "select kb.vi_syllable_shape('hoa')",
    "kb.query_is_english(text)": "select kb.query_is_english('{word} invoice')",
    "kb.code_token_counts(text)": "select kb.code_token_counts('{word}')",
    "kb.query_term_counts(text)": "select kb.query_term_counts('{word} zebra')",
    "kb.stem_config(text)": "select kb.stem_config('{word}')",
    "kb.stem_tsv(text,text)": "select kb.stem_tsv('{word} zebra', 'english')",
    "kb.stem_length(tsvector)": "select kb.stem_length(kb.to_tsv('{word}'))",
    "kb.query_stems(text)": "select kb.query_stems('{word} invoices')",
    "kb.search_term_counts(text)": "select kb.search_term_counts('{word} zebra')",
    "kb.search_term_counts(text,text[])": "select kb.search_term_counts('{word} zebra', '{en,ru}')",
    "kb.query_languages(text,uuid)": "select kb.query_languages('{word} zebra', kb.current_tenant())",
    "kb.query_languages(text,uuid,text)": "select kb.query_languages('{word} zebra', kb.current_tenant(), 'de')",
    "kb.search_term_groups(text,text[])": "select kb.search_term_groups('{word} zebra', '{en,de}')",
    "kb.language_subtag(text)": "select kb.language_subtag('{word}')",
    "kb.text_script(text)": "select kb.text_script('{word}')",
    "kb.language_script(text)": "select kb.language_script('{word}')",
    "kb.script_language(text)": "select kb.script_language('{word}')",
    "kb.stem_languages()": "select kb.stem_languages()",
    "kb.language_lexeme(text)": "select kb.language_lexeme('{word}')",
    "kb.tsv_language(tsvector)": "select kb.tsv_language(kb.to_tsv('{word}'))",
    "kb.has_nospace(text)": "select kb.has_nospace('{word}')",
    "kb.nospace_class()": "select kb.nospace_class()",
    "kb.nospace_grams(text)": "select kb.nospace_grams('{word} ภาษาไทย')",
    "kb.bm25_tf_part(double precision,double precision,double precision,double precision,double precision)":
        "select kb.bm25_tf_part(1, 1, 1, 1.2, 0.75)",
    "kb.ts_rank_tf()": "select kb.ts_rank_tf()",
    "kb.ts_rank_tf_compute()": "select kb.ts_rank_tf_compute()",
    "kb.search_lexical(text,integer,double precision,double precision,jsonb,text)":
        "select * from kb.search_lexical('{word} zebra invoice', 50)",
    "kb.search_semantic(vector,integer,jsonb)": "select * from kb.search_semantic(%(vec)s, 50)",
    "kb.search_hybrid(text,vector,integer,integer,text,double precision,double precision,double precision,"
    "double precision,jsonb,text)": "select * from kb.search_hybrid('{word} zebra', %(vec)s, 50)",
    # what kb.search_hybrid ranks with, as its caller: the fusion and the two id lists
    "kb.hybrid_fusion(text,vector,integer,integer,text,double precision,double precision,double precision,"
    "double precision,jsonb,text,uuid[],uuid[],double precision[])": "select * from kb.hybrid_fusion('{word} zebra', %(vec)s, 50, 10, 'convex', 0.7, 0.3,"
                               " 1.2, 0.75, null, null)",
    "kb.search_lexical_ids(text,integer,double precision,double precision,jsonb,text)":
        "select * from kb.search_lexical_ids('{word} zebra invoice', 50)",
    "kb.search_semantic_ids(vector,integer,jsonb)": "select * from kb.search_semantic_ids(%(vec)s, 50)",
    # a filter naming A's document by its title (B's reader sees none of A's documents)
    "kb.search_filter_docs(jsonb)": """select kb.search_filter_docs('{"title": "{word} title"}')""",
    "kb.search_filter(jsonb)": """select kb.search_filter('{"title": "{word}"}')""",
    "kb.search_filter_time(text,text)": "select kb.search_filter_time('2024-05-01', 'filter.x')",
    "kb.search_filter_number(jsonb,text)": "select kb.search_filter_number('2', 'filter.x')",
    "kb.search_filter_language(text,text)": "select kb.search_filter_language('JA', 'filter.x')",
    # the filter's predicate on a document, its parameters and range checks (no table read)
    "kb.search_filter_docs_args(jsonb)": """select * from kb.search_filter_docs_args('{"title": {"$in": ["t"]}, "n": {"$gte": 1}}')""",
    "kb.search_filter_docs_where()": "select kb.search_filter_docs_where()",
    "kb.search_filter_docs_is_number(jsonb)": """select kb.search_filter_docs_is_number('{"$gte": 1}')""",
    "kb.search_filter_docs_num_in(double precision,jsonb)": """select kb.search_filter_docs_num_in(2, '{"$gte": 1}')""",
    "kb.search_filter_docs_ts_in(timestamp with time zone,jsonb)":
        """select kb.search_filter_docs_ts_in('2024-05-01', '{"$gte": "2024-01-01T00:00:00.000000+00:00"}')""",
    "kb.guard_flagged_share_rows()": "select * from kb.guard_flagged_share_rows()",
    # the texts the searches read, asked for A's chunk by its ids (B's reader gets no row)
    "kb.chunk_texts(uuid,uuid)": "select * from kb.chunk_texts(%(chunk)s, %(doc)s)",
    "kb.search_lexical_ids(text,integer,double precision,double precision,jsonb,text)":
        "select * from kb.search_lexical_ids('{word} zebra invoice', 50)",
    "kb.search_semantic_ids(vector,integer,jsonb)": "select * from kb.search_semantic_ids(%(vec)s, 50)",
    "kb.retrieve_hybrid(text,vector,integer,integer,text,double precision,double precision,double precision,"
    "double precision,integer,text,text,bigint,jsonb,text,uuid[],uuid[],double precision[])":
        "select * from kb.retrieve_hybrid('{word} zebra', %(vec)s, 50, 10, 'convex', 0.7, 0.3, 1.2, 0.75, 50,"
        " null, null, 0, null, null)",
}
# kb.rerank_search, where the server has PL/Python: its reader cases are in tests/db/test_sql_rerank.py
SQL_RERANK = "kb.rerank_search(text,text,integer,jsonb)"


@pytest.mark.parametrize("setting", SETTINGS)
def test_reader_reads_only_its_tenant_whatever_it_sets(setting, owner_conn, reader, ab):
    """Every relation of kb it can SELECT (the catalog's list, which must be what the layer
    grants) and every function of kb it can EXECUTE (the catalog's list, which must be
    CALLS), with A's own words and vector as input: no row of A, no identifier or word of
    A, and current_tenant() is B whatever the setting says."""
    a, b, ids = ab
    role, url = reader
    readable = {r[0] for r in owner_conn.execute(
        "select c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'kb' and c.relkind in ('r', 'p', 'v', 'm') and has_table_privilege(%s, c.oid, 'SELECT')",
        [role])}
    assert readable == (set(TABLES) | VIEWS) - {"audit_heads", "kb_rerank_audit_default", "audit_checkpoints",
                                                 "sql_access", "kb_rerank_inflight"}
    executable = {r[0] for r in owner_conn.execute(
        "select replace(p.oid::regprocedure::text, 'public.', '') from pg_proc p join pg_namespace n"
        " on n.oid = p.pronamespace where n.nspname = 'kb' and has_function_privilege(%s, p.oid, 'EXECUTE')",
        [role])}
    assert executable - {SQL_RERANK} == set(CALLS)
    markers = _a_markers(ids, a)
    word = ids[a]["word"]
    with psycopg.connect(url) as conn:
        from kb_rerank.core.session import configure_connection

        configure_connection(conn)
        with conn.transaction():
            try:
                _set(conn, setting, a, b)
            except psycopg.Error:
                raise AssertionError(f"setting {setting!r} refused")
            seen = 0
            for rel in sorted(readable):
                rows = conn.execute(f"select * from kb.{rel}").fetchall()
                text = repr(rows)
                assert not [m for m in markers if m in text], (rel, setting)
                cols = [d.name for d in conn.execute(f"select * from kb.{rel} limit 0").description]
                if "tenant_id" in cols:
                    tenants = {r[0] for r in conn.execute(f"select distinct tenant_id from kb.{rel}")}
                    assert tenants <= {b}, (rel, tenants)
                    seen += len(rows)
            assert seen > 0  # not vacuous: B's own rows are there
            for fn, stmt in CALLS.items():
                with conn.transaction():
                    rows = conn.execute(stmt.replace("{word}", word),
                                        {"vec": basis(3), "chunk": ids[a]["chunk"], "doc": ids[a]["doc"]}).fetchall()
                text = repr(rows)
                # the text functions echo their input (A's word): for them, A's identifiers
                reads = fn.startswith(("kb.search_lexical", "kb.search_semantic", "kb.search_hybrid", "kb.hybrid_fusion",
                                       "kb.guard_flagged", "kb.retrieve_hybrid", "kb.chunk_texts",
                                       "kb.search_filter_docs"))
                assert not [m for m in (markers if reads else markers[:3]) if m in text], (fn, setting, rows)
            got = {r[0] for r in conn.execute("select chunk_id from kb.search_lexical(%s, 50)",
                                               [f"{ids[b]['word']} zebra"])}
            assert got == {ids[b]["chunk"]}  # B's own rows are found
            assert conn.execute("select kb.current_tenant(), session_user::text").fetchone() == (b, role)


def test_service_role_still_chooses_its_tenant(app_conn, owner_conn, ab):
    """Unchanged for the service (and any role outside kb_sql_reader): the setting decides.
    A superuser, which PostgreSQL counts as a member of every role, keeps the setting too
    (`kb-rerank audit verify --tenant`, the CLI as the owner)."""
    a, b, ids = ab
    if owner_conn.execute("select rolsuper from pg_roles where rolname = session_user").fetchone()[0]:
        assert owner_conn.execute("select pg_has_role(session_user, %s, 'MEMBER')", [READER]).fetchone()[0]
    for t in (a, b):
        with tenant_transaction(owner_conn, t):
            assert owner_conn.execute("select kb.current_tenant()").fetchone()[0] == t
    for t in (a, b):
        with tenant_transaction(app_conn, t):
            assert app_conn.execute("select kb.current_tenant()").fetchone()[0] == t
            assert app_conn.execute("select kb.sql_access_tenant()").fetchone()[0] is None
            got = {r[0] for r in app_conn.execute("select chunk_id from kb.search_lexical(%s, 50)",
                                                   [f"{ids[t]['word']} zebra"])}
            assert got == {ids[t]["chunk"]}


def test_member_without_mapping_sees_nothing(owner_conn, owner_url, ab):
    """A member of kb_sql_reader that no mapping names (granted by hand, or mapped in
    another database of the cluster) gets no tenant, whatever it sets: fail closed."""
    a, b, ids = ab
    role = f"kb_test_unmapped_{uuid.uuid4().hex[:8]}"
    owner_conn.execute(f'create role "{role}" login inherit')
    owner_conn.execute(f'grant {READER} to "{role}"')
    try:
        with psycopg.connect(_url(owner_url, role, "x")) as conn:
            with conn.transaction():
                _set(conn, "A-local", a, b)
                assert conn.execute("select kb.current_tenant()").fetchone()[0] is None
                assert conn.execute("select count(*) from kb.chunks").fetchone()[0] == 0
                assert conn.execute("select count(*) from kb.search_lexical(%s, 50)",
                                    [f"{ids[a]['word']} zebra"]).fetchone()[0] == 0
    finally:
        owner_conn.execute(f'drop role "{role}"')


# --------------------------------------------------------------------------- writes and privileges


WRITES = [
    "insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb, expires_at)"
    " values (gen_random_uuid(), kb.current_tenant(), repeat('a', 64), 'lexical_only', '[]', now() + interval '1 hour')",
    "delete from kb.kb_rerank_cache",
    "insert into kb.kb_rerank_audit (tenant_id, seq, kind, severity, source, query_hash, trace_id, created_at,"
    " prev_hash, row_hash) values (kb.current_tenant(), 99, 'served', 0, 'lexical_only', repeat('a', 64), 'x', now(),"
    " repeat('0', 64), repeat('0', 64))",
    "select kb.audit_append('served', 0::smallint, 'lexical_only', repeat('e', 64), 'x', null, 0, 0, null, null,"
    " repeat('a', 64), repeat('b', 32), repeat('c', 16))",
    "insert into kb.kb_rerank_pair_scores (tenant_id, model, query_hash, chunk_id, content_hash, score, expires_at)"
    " values (kb.current_tenant(), 'm', repeat('a', 64), gen_random_uuid(), repeat('0', 64), 0.5, now())",
    "update kb.chunks set content = 'pwned'",
    "delete from kb.documents",
    "insert into kb.tenant_policy (tenant_id) values (kb.current_tenant())",
    "update kb.kb_rerank_curation set note = 'x'",
    "select kb.refresh_term_blocks()",
    "select kb.evict_expired_cache()",
    "truncate kb.kb_rerank_cache",
]
ESCALATIONS = [
    "set role kb_app", "set role kb_search", "set role kb_access", "set session authorization kb_app",
    "select * from kb.sql_access",
    "insert into kb.sql_access (role_name, tenant_id) values (session_user, '{a}')",
    "update kb.sql_access set tenant_id = '{a}'",
    "grant select on kb.sql_access to public",
    "grant {reader} to kb_app",
    "alter role {role} bypassrls", "alter role {role} createrole",
    "create role kb_test_escalated login",
    "create table kb.mine (x int)", "create temporary table mine (x int)",
    "create function kb.current_tenant() returns uuid language sql as $$ select '{a}'::uuid $$",
    "alter function kb.current_tenant() owner to {role}",
    "select lo_from_bytea(0, 'x')",
]


def test_reader_cannot_write_or_grant_itself_anything(owner_conn, reader, ab):
    a, b, ids = ab
    role, url = reader
    before = owner_conn.execute("select md5(string_agg(x::text, ',' order by x::text)) from kb.sql_access x"
                                ).fetchone()[0]
    counts = owner_conn.execute("select (select count(*) from kb.kb_rerank_cache), (select count(*) from"
                                " kb.kb_rerank_audit), (select count(*) from kb.chunks)").fetchone()
    with psycopg.connect(url, autocommit=True) as conn:
        for stmt in WRITES + [s.format(a=a, role=role, reader=READER) for s in ESCALATIONS]:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                with conn.transaction():
                    _set(conn, "B", a, b)
                    conn.execute(stmt)
        if conn.info.server_version >= 160000:  # membership without SET (PostgreSQL 16+)
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"set role {READER}")
        assert conn.execute("select kb.current_tenant(), current_user::text").fetchone() == (b, role)
    assert owner_conn.execute("select md5(string_agg(x::text, ',' order by x::text)) from kb.sql_access x"
                              ).fetchone()[0] == before
    assert owner_conn.execute("select (select count(*) from kb.kb_rerank_cache), (select count(*) from"
                              " kb.kb_rerank_audit), (select count(*) from kb.chunks)").fetchone() == counts


def test_set_role_to_another_mapped_role_keeps_the_session_tenant(owner_conn, owner_url, reader, ab):
    """A DBA's mistake: the role mapped to A granted to B's role (the `grant` command refuses
    to adopt such a role). The mapping follows session_user, so after SET ROLE to A's role
    B's session still reads B only (inside the definer searches too)."""
    a, b, ids = ab
    role_b, url_b = reader
    role_a = f"kb_test_reader_a_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(owner_url) as conn:
        sql_access.grant(conn, a, role=role_a, app_role="kb_app")
    owner_conn.execute(f'grant "{role_a}" to "{role_b}"')
    try:
        with psycopg.connect(url_b) as conn:
            with conn.transaction():
                conn.execute(f'set local role "{role_a}"')
                assert conn.execute("select current_user::text, kb.current_tenant()").fetchone() == (role_a, b)
                assert ids[a]["word"] not in repr(conn.execute("select content from kb.chunks").fetchall())
                got = {r[0] for r in conn.execute("select chunk_id from kb.search_lexical(%s, 50)",
                                                   [f"{ids[a]['word']} zebra"])}
                assert ids[a]["chunk"] not in got
    finally:
        owner_conn.execute(f'revoke "{role_a}" from "{role_b}"')
        with psycopg.connect(owner_url) as conn:
            sql_access.revoke(conn, role=role_a)


def test_grant_refuses_unsafe_roles(owner_conn, owner_url, ab):
    a, b, ids = ab
    bad = f"kb_test_bad_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(owner_url) as conn:
        for name in ("kb_app", "kb_search", "kb_sql_reader", "postgres", "pg_monitor", "Bad-Name"):
            with pytest.raises(sql_access.SqlAccessError):
                sql_access.grant(conn, b, role=name, app_role="kb_app")
        for attrs, grant in (("login bypassrls", None), ("login createrole", None), ("login noinherit", None),
                             ("login", "kb_app")):
            owner_conn.execute(f'create role "{bad}" {attrs}')
            if grant:
                owner_conn.execute(f'grant "{grant}" to "{bad}"')
            try:
                with pytest.raises(sql_access.SqlAccessError):
                    sql_access.grant(conn, b, role=bad, app_role="kb_app")
            finally:
                owner_conn.execute(f'drop role "{bad}"')
        # a role already mapped to B is not moved to A silently
        name = f"kb_test_once_{uuid.uuid4().hex[:8]}"
        sql_access.grant(conn, b, role=name, app_role="kb_app")
        with pytest.raises(sql_access.SqlAccessError, match="already reads tenant"):
            sql_access.grant(conn, a, role=name, app_role="kb_app")
        sql_access.revoke(conn, role=name)
    assert owner_conn.execute("select count(*) from kb.sql_access where role_name like 'kb_test_bad_%%'"
                              " or role_name like 'kb_test_once_%%'").fetchone()[0] == 0


# --------------------------------------------------------------------------- revoke and the command


def test_revoke_ends_access_even_of_an_open_session(owner_url, reader, ab):
    a, b, ids = ab
    role, url = reader
    conn = psycopg.connect(url, autocommit=True)
    try:
        assert conn.execute("select count(*) from kb.chunks").fetchone()[0] > 0
        with psycopg.connect(owner_url) as oc:
            done = sql_access.revoke(oc, tenant=b)
        assert role in {x.role for x in done}
        with pytest.raises(psycopg.Error):  # ended, or its next statement refused
            conn.execute("select count(*) from kb.chunks").fetchone()
    finally:
        conn.close()
    with psycopg.connect(owner_url) as oc:
        assert oc.execute("select count(*) from pg_roles where rolname = %s", [role]).fetchone()[0] == 0
        assert oc.execute("select count(*) from kb.sql_access where role_name = %s", [role]).fetchone()[0] == 0
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(url).close()


def test_cli_grant_list_revoke(monkeypatch, capsys, settings, owner_conn, ab):
    a, b, ids = ab
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    pw = uuid.uuid4().hex
    monkeypatch.setattr("sys.stdin", io.StringIO(pw + "\n"))
    assert cli.main(["sql-access", "grant", "--tenant", str(b), "--password-stdin"]) == 0
    role = sql_access.default_role(b)
    assert f"{role} reads tenant {b}" in capsys.readouterr().out
    verifier = owner_conn.execute("select rolpassword from pg_authid where rolname = %s", [role]).fetchone()[0]
    assert verifier.startswith("SCRAM-SHA-256$") and pw not in verifier
    assert cli.main(["sql-access", "list"]) == 0
    assert f"{b}  {role}  login" in capsys.readouterr().out
    with psycopg.connect(db.replace_url(settings.database_url, user=role, password=pw)) as conn:
        with conn.transaction():
            _set(conn, "A-local", a, b)
            assert conn.execute("select kb.current_tenant()").fetchone()[0] == b
    assert cli.main(["sql-access", "revoke", "--role", role]) == 0
    assert "role dropped" in capsys.readouterr().out
    assert cli.main(["sql-access", "revoke", "--tenant", str(uuid.uuid4())]) == 1
    assert owner_conn.execute("select count(*) from pg_roles where rolname = %s", [role]).fetchone()[0] == 0
