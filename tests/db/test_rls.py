"""Row-level security: isolation both ways, fail-closed, no cross-tenant writes, catalog checks."""

from __future__ import annotations

import re
import uuid
from importlib import resources

import psycopg
import pytest

from kb_rerank.core.session import tenant_transaction

from tests.helpers import basis, insert_doc

TENANT_TABLES = {"documents", "chunks", "term_stats", "corpus_stats", "term_language_stats", "corpus_language_stats",
                 "term_blocks", "kb_rerank_cache", "kb_rerank_audit",
                 "kb_rerank_curation", "kb_rerank_pair_scores", "tenant_policy", "guard_reviews"}


def test_app_role_is_neither_superuser_nor_bypassrls_nor_owner(app_conn):
    row = app_conn.execute(
        "select rolsuper, rolbypassrls, rolcreaterole from pg_roles where rolname = current_user"
    ).fetchone()
    assert app_conn.execute("select current_user").fetchone()[0] == "kb_app"
    assert row == (False, False, False)
    owned = app_conn.execute(
        "select count(*) from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'kb' and pg_get_userbyid(c.relowner) = current_user"
    ).fetchone()[0]
    assert owned == 0


def test_every_table_in_kb_has_rls_enabled_and_forced(owner_conn):
    """Catalog test: a new tenant table without RLS fails here."""
    rows = owner_conn.execute(
        """
        select c.relname, c.relrowsecurity, c.relforcerowsecurity,
               exists (select 1 from pg_attribute a where a.attrelid = c.oid and a.attname = 'tenant_id' and not a.attisdropped)
        from pg_class c join pg_namespace n on n.oid = c.relnamespace
        where n.nspname = 'kb' and c.relkind in ('r', 'p')
        """
    ).fetchall()
    tenant_tables = {r[0] for r in rows if r[3]}
    assert TENANT_TABLES <= tenant_tables
    for name, enabled, forced, has_tenant in rows:
        if has_tenant:
            assert enabled and forced, f"kb.{name} has tenant_id but RLS is not enabled and forced"
    # the only table without tenant_id is the embedding configuration
    assert {r[0] for r in rows if not r[3]} <= {"embedding_config"}


TENANT_CONDITION = "(tenant_id = ( SELECT kb.current_tenant() AS current_tenant))"
# the policies on tenant tables that are not the tenant rule, each with its reason in its file
OTHER_POLICIES = {("kb_generation", "Generation is written by the bump trigger")}
# tables with tenant_id under a rule of their own: the login-to-tenant mapping, read by kb_access
# alone and only the session user's row (db/sql/sql_access_policies.sql)
OTHER_TABLES = {"sql_access"}


def test_every_tenant_table_takes_the_one_rule(owner_conn):
    """Each table with tenant_id (its audit partitions apart: reached through the parent) is
    listed once in db/sql/tenant_tables.sql, and every policy on it is the tenant condition,
    but for the named exceptions."""
    listed = re.findall(r"^select kb\.apply_tenant_policies\('kb\.(\w+)'",
                        (resources.files("kb_rerank") / "db" / "sql" / "tenant_tables.sql").read_text(), re.M)
    tables = {r[0] for r in owner_conn.execute(
        "select c.relname from pg_class c join pg_attribute a on a.attrelid = c.oid and a.attname = 'tenant_id'"
        " where c.relnamespace = 'kb'::regnamespace and c.relkind in ('r', 'p') and not c.relispartition")}
    tables -= OTHER_TABLES
    assert sorted(listed) == sorted(tables)
    assert TENANT_TABLES <= tables
    policies = owner_conn.execute(
        "select tablename, policyname, cmd, qual, with_check from pg_policies"
        " where schemaname = 'kb' and tablename = any(%s)", [list(tables)]).fetchall()
    assert {r[0] for r in policies} == tables
    for table, name, cmd, qual, check in policies:
        if (table, name) in OTHER_POLICIES:
            continue
        expected = {"SELECT": (TENANT_CONDITION, None), "DELETE": (TENANT_CONDITION, None),
                    "INSERT": (None, TENANT_CONDITION)}.get(cmd, (TENANT_CONDITION, TENANT_CONDITION))
        assert (qual, check) == expected, (table, name, cmd)


def _policies(conn, table):
    return sorted(conn.execute("select policyname, cmd, qual is not null, with_check is not null from pg_policies"
                               " where schemaname = 'kb' and tablename = %s", [table]).fetchall())


def test_apply_tenant_policies_forces_rls_names_policies_and_grants(owner_conn):
    """The rule on a scratch table (rolled back): RLS forced, one policy per command named
    after the noun (or as `names` says), the app role holding exactly its privileges, the same
    after a second call; a command it does not know is refused before anything changes."""
    with owner_conn.transaction(force_rollback=True):
        owner_conn.execute("create table kb.scratch_rule (tenant_id uuid not null, v integer)")
        owner_conn.execute("grant select, insert, update, delete, truncate on kb.scratch_rule to kb_app")
        for _ in range(2):
            owner_conn.execute("select kb.apply_tenant_policies('kb.scratch_rule', 'Scratches', '{select,insert,update}',"
                               " '{select,insert}', names => '{\"update\": \"Scratches are mended\"}')")
        assert owner_conn.execute("select relrowsecurity, relforcerowsecurity from pg_class"
                                  " where oid = 'kb.scratch_rule'::regclass").fetchone() == (True, True)
        assert _policies(owner_conn, "scratch_rule") == [
            ("Scratches are inserted by their tenant", "INSERT", False, True),
            ("Scratches are mended", "UPDATE", True, True),
            ("Scratches are visible to their tenant", "SELECT", True, False)]
        privileges = {p for p in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
                      if owner_conn.execute("select has_table_privilege('kb_app', 'kb.scratch_rule', %s)",
                                            [p]).fetchone()[0]}
        assert privileges == {"SELECT", "INSERT"}
        owner_conn.execute("select kb.apply_tenant_policies('kb.scratch_rule', null, '{}', '{}', one_policy => 'scratch_rls')")
        assert ("scratch_rls", "ALL", True, True) in _policies(owner_conn, "scratch_rule")
        assert not owner_conn.execute("select has_table_privilege('kb_app', 'kb.scratch_rule', 'SELECT')").fetchone()[0]
        with pytest.raises(psycopg.errors.RaiseException, match="truncate is not select"):
            with owner_conn.transaction():
                owner_conn.execute("select kb.apply_tenant_policies('kb.scratch_rule', 'Scratches', '{truncate}')")
        assert not owner_conn.execute("select has_function_privilege('kb_app',"
                                      " 'kb.apply_tenant_policies(regclass, text, text[], text[], jsonb, text)',"
                                      " 'EXECUTE')").fetchone()[0]


def test_security_definer_functions_pin_search_path(owner_conn):
    rows = owner_conn.execute(
        """
        select p.proname, p.proconfig, pg_get_userbyid(p.proowner)
        from pg_proc p join pg_namespace n on n.oid = p.pronamespace
        where n.nspname = 'kb' and p.prosecdef
        """
    ).fetchall()
    assert {r[0] for r in rows} >= {"search_lexical", "search_semantic"}
    for name, config, owner in rows:
        assert any(c.startswith("search_path=") for c in (config or [])), name
        # one least-privilege owner per job (reasons in the SQL files); a definer not named here
        # is still checked by the catalog tests of test_sql_security
        owners = {"evict_expired_cache": "kb_maint", "audit_append": "kb_audit",
                  "search_lexical": "kb_search", "search_semantic": "kb_search",
                  "apply_stats_delta": "kb_stats", "chunks_maintain_stats": "kb_stats",
                  "refresh_term_blocks": "kb_stats", "chunks_maintain_term_blocks": "kb_stats",
                  "bump_generation": "kb_generation"}
        if name in owners:
            assert owner == owners[name], (name, owner)


def test_cache_is_append_only_for_app(app_conn):
    privs = {
        p: app_conn.execute("select has_table_privilege('kb.kb_rerank_cache', %s)", [p]).fetchone()[0]
        for p in ("SELECT", "INSERT", "DELETE", "UPDATE", "TRUNCATE")
    }
    assert privs == {"SELECT": True, "INSERT": True, "DELETE": True, "UPDATE": False, "TRUNCATE": False}


@pytest.fixture
def two_tenants(app_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    insert_doc(app_conn, a, "Alpha secret ERR_402", ["alpha zebra ERR_402 token"], [basis(0)])
    insert_doc(app_conn, b, "Beta secret ERR_402", ["beta zebra ERR_402 token"], [basis(0)])
    return a, b


def _visible(conn, tenant):
    with tenant_transaction(conn, tenant):
        docs = {r[0] for r in conn.execute("select title from kb.documents")}
        chunks = {r[0] for r in conn.execute("select content from kb.chunks")}
        lex = {r[0] for r in conn.execute("select doc_title from kb.search_lexical('zebra ERR_402', 20)")}
        sem = {r[0] for r in conn.execute("select doc_title from kb.search_semantic(%s, 20)", [basis(0)])}
        hyb = {r[0] for r in conn.execute("select doc_title from kb.search_hybrid('zebra', %s, 20)", [basis(0)])}
        stats = conn.execute("select count(*) from kb.term_stats where term = 'zebra'").fetchone()[0]
        df = conn.execute("select df from kb.term_stats where term = 'zebra'").fetchone()
    return docs, chunks, lex, sem, hyb, stats, df


def test_isolation_both_ways(app_conn, two_tenants):
    a, b = two_tenants
    docs_a, chunks_a, lex_a, sem_a, hyb_a, stats_a, df_a = _visible(app_conn, a)
    docs_b, chunks_b, lex_b, sem_b, hyb_b, stats_b, df_b = _visible(app_conn, b)
    assert docs_a == lex_a == sem_a == hyb_a == {"Alpha secret ERR_402"}
    assert docs_b == lex_b == sem_b == hyb_b == {"Beta secret ERR_402"}
    assert chunks_a == {"alpha zebra ERR_402 token"} and chunks_b == {"beta zebra ERR_402 token"}
    # BM25 statistics are per tenant: each sees df = 1 for a term both tenants use
    assert stats_a == stats_b == 1 and df_a == df_b == (1,)


@pytest.mark.parametrize("setting", [None, ""])
def test_fail_closed_without_tenant(app_conn, two_tenants, setting):
    with app_conn.transaction():
        if setting is not None:
            app_conn.execute("select set_config('auth.tenant_id', %s, true)", [setting])
        for q in (
            "select count(*) from kb.documents",
            "select count(*) from kb.chunks",
            "select count(*) from kb.term_stats",
            "select count(*) from kb.corpus_stats",
            "select count(*) from kb.term_language_stats",
            "select count(*) from kb.corpus_language_stats",
            "select count(*) from kb.term_blocks",
            "select count(*) from kb.kb_rerank_cache",
            "select count(*) from kb.search_lexical('zebra ERR_402', 20)",
        ):
            assert app_conn.execute(q).fetchone()[0] == 0, q
        assert app_conn.execute("select count(*) from kb.search_semantic(%s, 20)", [basis(0)]).fetchone()[0] == 0
        assert app_conn.execute("select count(*) from kb.search_hybrid('zebra', %s, 20)", [basis(0)]).fetchone()[0] == 0


def test_setting_is_per_transaction_not_session(app_conn, two_tenants):
    a, _ = two_tenants
    with tenant_transaction(app_conn, a):
        assert app_conn.execute("select count(*) from kb.documents").fetchone()[0] == 1
    # after the transaction the setting reads '' and nothing is visible
    with app_conn.transaction():
        assert app_conn.execute("select current_setting('auth.tenant_id', true)").fetchone()[0] == ""
        assert app_conn.execute("select count(*) from kb.documents").fetchone()[0] == 0


def test_malformed_tenant_setting_raises(app_conn, two_tenants):
    with pytest.raises(psycopg.errors.InvalidTextRepresentation):
        with app_conn.transaction():
            app_conn.execute("select set_config('auth.tenant_id', 'not-a-uuid', true)")
            app_conn.execute("select count(*) from kb.documents").fetchone()


def test_cross_tenant_writes_are_refused(app_conn, two_tenants):
    a, b = two_tenants
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, a):
            app_conn.execute(
                "insert into kb.documents (tenant_id, source_uri, title, content_hash) values (%s, 'x', 'x', %s)",
                [b, "0" * 64],
            )
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, a):
            app_conn.execute("update kb.documents set tenant_id = %s", [b])
    with tenant_transaction(app_conn, a):
        # B's rows are invisible to A's update and delete: nothing is touched
        assert app_conn.execute("update kb.documents set title = 'pwned' where tenant_id = %s", [b]).rowcount == 0
        assert app_conn.execute("delete from kb.chunks where tenant_id = %s", [b]).rowcount == 0
    with tenant_transaction(app_conn, b):
        assert app_conn.execute("select title from kb.documents").fetchall() == [("Beta secret ERR_402",)]


def test_app_cannot_write_statistics_or_call_internal_functions(app_conn, two_tenants):
    a, _ = two_tenants
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, a):
            app_conn.execute("update kb.term_stats set df = 1000")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, a):
            app_conn.execute("update kb.term_language_stats set df = 1000")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, a):
            app_conn.execute("select kb.apply_stats_delta(array[]::kb.chunks[], 1)")
    with tenant_transaction(app_conn, a):
        assert app_conn.execute("select kb.refresh_term_blocks(4, 1)").fetchone()[0] >= 1
    for stmt in ("update kb.term_blocks set tail = 0", "delete from kb.term_blocks",
                 "insert into kb.term_blocks (tenant_id, term, chunk_ids, tail, avglen, k1, b)"
                 " values (kb.current_tenant(), 'zebra', '{}', 0, 1, 1.2, 0.75)"):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with tenant_transaction(app_conn, a):
                app_conn.execute(stmt)


def test_refresh_term_blocks_needs_a_tenant_and_valid_arguments(app_conn, two_tenants):
    a, _ = two_tenants
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="no tenant"):
        with app_conn.transaction():
            app_conn.execute("select kb.refresh_term_blocks()")
    for args, field in (("0", "list_length"), ("4, 0", "min_df"), ("4, 1, -1", "k1"), ("4, 1, 1.2, 2", "b")):
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=field):
            with tenant_transaction(app_conn, a):
                app_conn.execute(f"select kb.refresh_term_blocks({args})")


def test_query_text_that_looks_like_sql_is_text(app_conn, two_tenants):
    a, b = two_tenants
    hostile = f"zebra'); select set_config('auth.tenant_id', '{b}', false); --"
    with tenant_transaction(app_conn, a):
        titles = {r[0] for r in app_conn.execute("select doc_title from kb.search_lexical(%s, 20)", [hostile])}
        assert titles == {"Alpha secret ERR_402"}
        assert app_conn.execute("select current_setting('auth.tenant_id')").fetchone()[0] == str(a)
