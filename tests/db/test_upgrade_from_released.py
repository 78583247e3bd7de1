"""A database migrated by the release before the package was regrouped (commit 0a61d31:
revision 0022_document_metadata and that release's idempotent layer, in
tests/db/data/layer_0a61d31.sql) upgrades with today's `migrate` to the schema a fresh
database gets: the same functions, policies, grants, columns and indexes (the catalog
comparison of test_migrations), with its rows still searchable. No git at run time."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg

from kb_rerank.db import database as db
from kb_rerank.db import layer
from tests.db.test_migrations import _catalog, _new_database

RELEASED_HEAD = "0022_document_metadata"
RELEASED_LAYER = Path(__file__).parent / "data" / "layer_0a61d31.sql"


def _released_database(server_url: str, monkeypatch):
    """A new database as the release left it: its revisions, then its layer (rendered as that
    release rendered it: the same two placeholders). While 0022 is today's head too, reaching
    it would apply today's layer: that step is held back for this one migrate."""
    url, s = _new_database(server_url)
    with monkeypatch.context() as m:
        m.setattr(layer, "apply_idempotent", lambda *a, **kw: None)
        db.migrate(s, revision=RELEASED_HEAD)
    text = RELEASED_LAYER.read_text("utf-8")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(text.replace("{{embedding_dim}}", str(s.embedding_dim))
                     .replace("{{app_role}}", layer.app_role_sql(s.app_role)))
    return url, s


def test_a_database_of_the_released_layout_upgrades_to_a_fresh_install(server_url, settings, monkeypatch):
    url, s = _released_database(server_url, monkeypatch)
    tenant = uuid.uuid4()
    with psycopg.connect(url) as conn:
        # the released layer is in place: its hybrid search runs, and a document is written
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                           " values (%s, 'a', 'Zebras', repeat('0', 64)) returning doc_id", [tenant]).fetchone()[0]
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select %s, %s, 0, 'zebra crossing', repeat('0', 64),"
                     " array_fill(0.1::real, array[dim])::vector from kb.embedding_config", [tenant, doc])
        conn.commit()
        hybrid = ("select doc_title, content from kb.search_hybrid('zebra',"
                  " (select array_fill(0.1::real, array[dim])::vector from kb.embedding_config))")
        assert conn.execute(hybrid).fetchall() == [("Zebras", "zebra crossing")]
        assert conn.execute("select to_regprocedure('kb.hybrid_fusion(text, vector, integer, integer, text,"
                            " double precision, double precision, double precision, double precision, jsonb)')"
                            ).fetchone()[0] is None
        assert layer.applied_layer_version(conn) != layer.layer_version(embedding_dim=s.embedding_dim,
                                                                        app_role=s.app_role)
    db.migrate(s)
    with psycopg.connect(url) as conn:
        assert db.current_revision(conn) == db.head_revision()
        assert layer.applied_layer_version(conn) == layer.layer_version(embedding_dim=s.embedding_dim,
                                                                        app_role=s.app_role)
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        assert conn.execute(hybrid).fetchall() == [("Zebras", "zebra crossing")]
    got, fresh = _catalog(url), _catalog(settings.database_url)
    assert sorted(set(got) ^ set(fresh)) == []
