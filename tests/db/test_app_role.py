"""The app role is a setting: KB_APP_ROLE. Two databases on ONE server (the test server),
migrated with KB_APP_ROLE=kb_one_app and kb_two_app: each role connects to its own database
only and reads its tenant's rows under RLS there; neither is superuser, BYPASSRLS or owner;
the idempotent layer's grants went to the configured role, and the default role (kb_app) and
the former default (cyberos_app, which 0001 still creates) have nothing in either database;
the catalog checks of tests/db/test_sql_security.py hold for the configured role; the catalog is
the default one's with the role renamed."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg import sql

from kb_rerank.db import layer as sqlfiles
from kb_rerank.db import database as db
from kb_rerank.core.settings import DEFAULT_APP_ROLE, Settings, SettingsError
from kb_rerank.core.session import tenant_transaction

from tests.conftest import _fresh_database
from tests.db.test_migrations import _catalog
from tests.db.test_sql_security import assert_no_temp_and_no_create

ROLES = ("kb_one_app", "kb_two_app")
LEXICAL = "kb.search_lexical(text, integer, double precision, double precision, jsonb, text)"

# every ACL entry of this database's objects, and the database's own, for one grantee
ACL_ENTRIES = """
with acls as (
  select 'relation ' || oid::regclass::text as obj, relacl as acl from pg_class
  union all select 'column ' || attrelid::regclass::text || '.' || attname, attacl from pg_attribute
  union all select 'function ' || oid::regprocedure::text, proacl from pg_proc
  union all select 'schema ' || nspname, nspacl from pg_namespace
  union all select 'type ' || oid::regtype::text, typacl from pg_type
  union all select 'language ' || lanname, lanacl from pg_language
  union all select 'foreign server ' || srvname, srvacl from pg_foreign_server
  union all select 'database ' || datname, datacl from pg_database where datname = current_database()
  union all select 'default acl ' || defaclobjtype::text, defaclacl from pg_default_acl
)
select obj || ' ' || a.privilege_type from acls, aclexplode(acl) a
where acl is not null and a.grantee = %s::regrole
order by 1
"""


@pytest.fixture(scope="module")
def two(server_url):
    """{role: Settings} of two databases on the test server, one per app role."""
    out: dict[str, Settings] = {}
    for role in ROLES:
        url = _fresh_database(server_url, f"kb_test_{role}_{uuid.uuid4().hex[:6]}")
        s = Settings(database_url=url, app_role=role, app_password=f"pw-{role}-{uuid.uuid4().hex[:8]}")
        db.migrate(s)
        out[role] = s
    yield out
    with psycopg.connect(server_url, autocommit=True) as conn:
        for s in out.values():
            conn.execute(sql.SQL("drop database if exists {} with (force)").format(
                sql.Identifier(psycopg.conninfo.conninfo_to_dict(s.database_url)["dbname"])))
        for role in ROLES:  # granted nothing anywhere else: dropped, so the next session starts clean
            try:
                conn.execute(sql.SQL("drop role if exists {}").format(sql.Identifier(role)))
            except psycopg.Error:
                pass


def _as(settings: Settings, role: str, other: Settings | None = None) -> str:
    """URL of ``settings``' database as ``role`` with the password ``other`` (or settings) set on it."""
    pw = (other or settings).app_password
    return db.replace_url(settings.database_url, user=role, password=pw)


def test_app_role_setting_is_validated():
    assert Settings().app_role == "kb_app" == DEFAULT_APP_ROLE
    assert Settings.from_env({"KB_APP_ROLE": "kb_one_app"}).app_role == "kb_one_app"
    for bad in ("kb_search", "kb_maint", "kb_stats", "kb_audit", "kb_generation", "postgres", "public",
                "pg_monitor", "Kb_App", "kb-app", "1app", "", "a" * 64, 'x"; drop role y; --'):
        with pytest.raises(SettingsError, match="KB_APP_ROLE"):
            Settings(app_role=bad)
    with pytest.raises(ValueError):
        sqlfiles.app_role_sql('x"y')


def test_app_url_and_layer_version_follow_the_setting(two):
    one, other = two["kb_one_app"], two["kb_two_app"]
    assert psycopg.conninfo.conninfo_to_dict(db.app_url(one))["user"] == "kb_one_app"
    dim = one.embedding_dim
    v1 = sqlfiles.layer_version(embedding_dim=dim, app_role="kb_one_app")
    assert v1 == sqlfiles.layer_version(embedding_dim=dim, app_role="kb_one_app")  # same settings, same version
    assert v1 != sqlfiles.layer_version(embedding_dim=dim, app_role="kb_two_app")
    assert sqlfiles.layer_version(embedding_dim=dim) == sqlfiles.layer_version(embedding_dim=dim, app_role="kb_app")
    for role, s in ((one.app_role, one), (other.app_role, other)):
        with psycopg.connect(s.database_url) as conn:
            assert sqlfiles.applied_layer_version(conn) == sqlfiles.layer_version(embedding_dim=dim, app_role=role)


def test_each_role_connects_to_its_own_database_only(two):
    one, other = two["kb_one_app"], two["kb_two_app"]
    for s in (one, other):
        with psycopg.connect(db.app_url(s)) as conn:
            assert conn.execute("select current_user").fetchone()[0] == s.app_role
    for role, s, pw_of in (("kb_one_app", other, one), ("kb_two_app", one, other)):
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(_as(s, role, pw_of)).close()
    # cyberos_app (created by 0001 on every cluster) may connect to neither, nor may PUBLIC
    for s in (one, other):
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(db.replace_url(s.database_url, user="cyberos_app")).close()
        with psycopg.connect(s.database_url) as conn:
            assert conn.execute("select has_database_privilege('public', current_database(), 'CONNECT'),"
                                " has_database_privilege('cyberos_app', current_database(), 'CONNECT'),"
                                " has_database_privilege(%s, current_database(), 'CONNECT')",
                                [s.app_role]).fetchone() == (False, False, True)


def test_each_role_reads_its_tenants_rows_under_rls(two):
    for s in two.values():
        a, b = uuid.uuid4(), uuid.uuid4()
        with psycopg.connect(db.app_url(s)) as conn:
            with tenant_transaction(conn, a):
                conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                             " values (%s, 'a.md', 'A', repeat('0', 64))", [a])
            with tenant_transaction(conn, a):
                assert conn.execute("select tenant_id from kb.documents").fetchall() == [(a,)]
                assert conn.execute("select count(*) from kb.search_lexical('zebra', 5)").fetchone()[0] == 0
            with tenant_transaction(conn, b):
                assert conn.execute("select count(*) from kb.documents").fetchone()[0] == 0
            # no tenant: nothing (fails closed)
            assert conn.execute("select count(*) from kb.documents").fetchone()[0] == 0


def test_roles_are_neither_superuser_nor_bypassrls_nor_owner(two):
    for s in two.values():
        with psycopg.connect(s.database_url) as conn:
            assert conn.execute(
                "select rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolinherit, rolcanlogin"
                " from pg_roles where rolname = %s", [s.app_role]).fetchone() == (False, False, False, False, False, True)
            assert conn.execute("select pg_get_userbyid(datdba) <> %s from pg_database"
                                " where datname = current_database()", [s.app_role]).fetchone()[0]
            assert conn.execute(
                "select count(*) from pg_shdepend where deptype = 'o' and refobjid = %s::regrole"
                " and dbid = (select oid from pg_database where datname = current_database())",
                [s.app_role]).fetchone()[0] == 0
            for definer in ("kb_search", "kb_maint", "kb_stats", "kb_audit", "kb_generation"):
                assert not conn.execute("select pg_has_role(%s, %s, 'USAGE')", [s.app_role, definer]).fetchone()[0]


def test_the_layer_was_granted_to_the_configured_role_and_the_default_ones_have_nothing(two, settings):
    for s in two.values():
        others = [r for r in ROLES if r != s.app_role]
        with psycopg.connect(s.database_url) as conn:
            assert conn.execute("select has_function_privilege(%s, %s, 'EXECUTE')",
                                [s.app_role, LEXICAL]).fetchone()[0]
            assert conn.execute("select has_table_privilege(%s, 'kb.documents', 'SELECT')",
                                [s.app_role]).fetchone()[0]
            assert conn.execute("select has_function_privilege(%s, 'kb.schema_layer_version()', 'EXECUTE')",
                                [s.app_role]).fetchone()[0]
            for role in (DEFAULT_APP_ROLE, "cyberos_app", *others):
                assert conn.execute(ACL_ENTRIES, [role]).fetchall() == [], role
                assert not conn.execute("select has_function_privilege(%s, %s, 'EXECUTE')",
                                        [role, LEXICAL]).fetchone()[0], role
                assert not conn.execute("select has_table_privilege(%s, 'kb.documents', 'SELECT')",
                                        [role]).fetchone()[0], role
            assert conn.execute(ACL_ENTRIES, [s.app_role]).fetchall() != []


def test_catalog_security_checks_hold_for_the_configured_role(two):
    for s in two.values():
        with psycopg.connect(s.database_url, autocommit=True) as conn:
            assert_no_temp_and_no_create(conn, s.app_role)
            for fn in ("kb.audit_verify()", "kb.evict_expired_cache(integer)", "kb.chunks_derive()"):
                assert not conn.execute("select has_function_privilege(%s, %s, 'EXECUTE')",
                                        [s.app_role, fn]).fetchone()[0], fn
        with psycopg.connect(db.app_url(s)) as app:
            for role in ("kb_search", "kb_maint", "kb_stats", "kb_audit", DEFAULT_APP_ROLE):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    with app.transaction():
                        app.execute(f'set role "{role}"')


def _normalised(lines: list[str], role: str) -> list[str]:
    """Catalog lines with ``role`` renamed app_role, ACL lists re-sorted after the renaming,
    and the layer version (which includes the role) left out."""
    def acl(m: re.Match) -> str:
        return "acl=" + ",".join(sorted(m.group(1).split(",")))
    def database_acl(m: re.Match) -> str:  # the database's ACL line, sorted the same way
        return "database acl " + ",".join(sorted(m.group(1).split(",")))
    out = [re.sub(r"^database acl (\S*)$", database_acl, re.sub(r"acl=(\S*)", acl, line.replace(role, "app_role")))
           for line in lines]
    return sorted(re.sub(r"'[0-9a-f]{64}'", "'<version>'", line) for line in out)


def test_catalog_is_the_default_ones_with_the_role_renamed(two, settings):
    """Everything else is as a database migrated with the default role (the session's)."""
    default = _normalised(_catalog(settings.database_url), settings.app_role)
    for s in two.values():
        assert _normalised(_catalog(s.database_url), s.app_role) == default


def test_migrate_again_changes_nothing_and_another_role_later_is_refused(two):
    one = two["kb_one_app"]
    before = _catalog(one.database_url)
    db.migrate(one)
    assert _catalog(one.database_url) == before
    # at head, the role is the one 0016 set up: a different KB_APP_ROLE is refused, nothing changes
    with pytest.raises(RuntimeError, match="KB_APP_ROLE=kb_two_app"):
        db.migrate(one.with_(app_role="kb_two_app", app_password=None))
    assert _catalog(one.database_url) == before
