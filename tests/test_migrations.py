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
union all
select 'storage ' || a.attrelid::regclass::text || '.' || a.attname || ' ' || a.attstorage::text
from pg_attribute a join pg_class c on c.oid = a.attrelid join pg_namespace n on n.oid = c.relnamespace
where n.nspname = 'kb' and c.relkind = 'r' and a.attnum > 0 and not a.attisdropped
order by 1
"""


def _catalog(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute(CATALOG)]


def _new_database(server_url: str) -> tuple[str, Settings]:
    """An empty database of its own on the test server: its URL and settings."""
    name = f"kb_mig_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = db.replace_url(server_url, dbname=name)
    return url, Settings(database_url=url)


def test_downgrade_base_then_upgrade_head(server_url, settings):
    url, s = _new_database(server_url)
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


def test_0007_moves_existing_tsvectors_in_line_and_keeps_statistics(server_url):
    """A chunk written at 0006 has its (large) tsvector in the TOAST table; upgrading to 0007
    moves it into the heap row without changing it or the BM25 statistics."""
    url, s = _new_database(server_url)
    db.migrate(s, revision="0006_pair_scores")
    tenant = uuid.uuid4()
    text = " ".join(f"word{i} term{i % 50}" for i in range(200))  # ~3 kB tsvector, fits a page
    stats_sql = ("select (select array_agg((term, df) order by term) from kb.term_stats),"
                 " (select array_agg((tenant_id, n_chunks, total_len)) from kb.corpus_stats)")
    with psycopg.connect(url) as conn:
        doc = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
            " values (%s, 'a', 'a', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute(
            "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
            " select %s, %s, 0, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
            " from kb.embedding_config", [tenant, doc, text])
        conn.commit()
        before = conn.execute("select tsv::text, pg_column_toast_chunk_id(tsv) is not null from kb.chunks").fetchone()
        stats = conn.execute(stats_sql).fetchone()
    assert before[1]  # out of line at 0006
    db.migrate(s)
    with psycopg.connect(url) as conn:
        after = conn.execute("select tsv::text, pg_column_toast_chunk_id(tsv) is not null from kb.chunks").fetchone()
        assert after == (before[0], False)
        assert conn.execute(stats_sql).fetchone() == stats
        assert conn.execute("select attstorage from pg_attribute where attrelid = 'kb.chunks'::regclass"
                            " and attname = 'tsv'").fetchone()[0] == "m"
        # and the statistics trigger is back on
        conn.execute("delete from kb.chunks")
        assert conn.execute("select coalesce(sum(n_chunks), 0) from kb.corpus_stats where tenant_id = %s",
                            [tenant]).fetchone()[0] == 0


def test_0008_downgrade_keeps_search_and_writes_working(server_url):
    """Down to 0007, kb.term_tops and its trigger go; kb.search_lexical (an idempotent file,
    not re-applied by a downgrade) still answers, and chunks can still be written. Up again,
    the lists come back empty and are rebuilt on demand."""
    url, s = _new_database(server_url)
    db.migrate(s)
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")
    search_sql = "select array_agg(content order by rank) from kb.search_lexical('zebra', 5)"
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
            " values (%s, 'a', 'a', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute(insert, [tenant, doc, 0, "zebra crossing"])
        assert conn.execute("select kb.refresh_term_tops(4, 1)").fetchone()[0] == 2
        conn.commit()
        assert conn.execute(search_sql).fetchone()[0] == ["zebra crossing"]
    db.downgrade(s, revision="0007_tsv_inline")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute("select to_regclass('kb.term_tops')").fetchone()[0] is None
        conn.execute(insert, [tenant, doc, 1, "zebra zebra"])
        conn.commit()
        # one document, so its best chunk: the new one, written without the lists' trigger
        assert conn.execute(search_sql).fetchone()[0] == ["zebra zebra"]
    db.migrate(s)
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute("select count(*) from kb.term_tops").fetchone()[0] == 0
        assert conn.execute("select kb.refresh_term_tops(4, 1)").fetchone()[0] == 2


def test_0009_upgrade_installs_the_tf_table_the_search_needs(server_url):
    """0009 changes functions only: upgrading a database at 0008 (which had no
    kb.ts_rank_tf) must re-apply the SQL files, so that kb.search_lexical finds it."""
    url, s = _new_database(server_url)
    db.migrate(s)
    db.downgrade(s, revision="0008_term_tops")
    tenant = uuid.uuid4()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("drop function kb.ts_rank_tf()")
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'a', 'a', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select %s, %s, 0, 'zebra zebra crossing', repeat('0', 64),"
                     " array_fill(0.1::real, array[dim])::vector from kb.embedding_config", [tenant, doc])
        with pytest.raises(psycopg.errors.UndefinedFunction):
            conn.execute("select * from kb.search_lexical('zebra', 5)")
    db.migrate(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision() == "0010_trust"
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        rows = conn.execute("select content, score from kb.search_lexical('zebra', 5)").fetchall()
    assert [r[0] for r in rows] == ["zebra zebra crossing"] and rows[0][1] > 0
