"""Migrations: down to base and up again; the rebuilt schema equals a fresh one."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from kb_rerank import db
from kb_rerank.settings import Settings

CATALOG = """
select 'table ' || c.relname || ' ' || c.relrowsecurity || c.relforcerowsecurity
from pg_class c join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'kb' and c.relkind in ('r','i')
union all
select 'function ' || p.oid::regprocedure::text || ' definer=' || p.prosecdef || ' owner=' || pg_get_userbyid(p.proowner)
from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'kb'
union all
select 'policy ' || tablename || ' ' || policyname || ' ' || cmd || ' ' || coalesce(qual, '') from pg_policies where schemaname = 'kb'
union all
select 'column ' || table_name || '.' || column_name || ' ' || data_type || ' ' || coalesce(udt_name, '')
from information_schema.columns where table_schema = 'kb'
union all
select 'grant ' || table_name || ' ' || privilege_type from information_schema.role_table_grants
where table_schema = 'kb' and grantee = 'cyberos_app'
order by 1
"""


def _catalog(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(CATALOG)]


def test_downgrade_base_then_upgrade_head(server_url, settings):
    name = f"kb_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = db.replace_url(server_url, dbname=name)
    s = Settings(database_url=url)
    db.migrate(s)
    fresh = _catalog(url)
    assert fresh == _catalog(settings.database_url)  # same as the session's database
    db.downgrade(s, revision="base")
    with psycopg.connect(url) as conn:
        assert conn.execute("select to_regnamespace('kb')").fetchone()[0] is None
        assert db.current_revision(conn) is None
    db.migrate(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision()
    assert _catalog(url) == fresh
    # upgrading an up-to-date database changes nothing
    db.migrate(s)
    assert _catalog(url) == fresh


def test_embedding_dimension_is_recorded_and_checked(app_conn, settings):
    assert app_conn.execute("select dim from kb.embedding_config").fetchone()[0] == settings.embedding_dim
    db.check_embedding_dim(app_conn, settings)
    with pytest.raises(db.DatabaseSetupError, match="1024"):
        db.check_embedding_dim(app_conn, settings.with_(embedder="bge-m3"))


def test_check_server_accepts_this_server(owner_conn):
    db.check_server(owner_conn)  # raises DatabaseSetupError naming what is missing otherwise
    assert owner_conn.execute(
        "select extversion from pg_extension where extname = 'vector'"
    ).fetchone()[0] >= "0.8"


def test_replace_url_keeps_socket_host():
    url = "postgresql://postgres:@/kb?host=%2Ftmp%2Fx"
    assert db.replace_url(url, user="cyberos_app") == "postgresql://cyberos_app@/kb?host=%2Ftmp%2Fx"
    assert db.replace_url("postgresql://u:p@h:5432/a", dbname="b") == "postgresql://u:p@h:5432/b"
