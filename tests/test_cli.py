"""The command line: the pieces a psql user relies on."""

from __future__ import annotations

import json

from kb_rerank import cli


def test_embed_prints_a_pgvector_literal_of_the_configured_dimension(capsys, monkeypatch, settings, app_conn):
    assert cli.main(["embed", "how do I emit hóa đơn"]) == 0
    literal = capsys.readouterr().out.strip()
    vec = json.loads(literal)
    assert len(vec) == settings.embedding_dim
    # the literal is accepted by PostgreSQL as the column's type
    assert app_conn.execute("select vector_dims(%s::vector)", [literal]).fetchone()[0] == settings.embedding_dim


def test_db_url_prints_the_configured_urls(capsys, monkeypatch):
    monkeypatch.setenv("KB_DATABASE_URL", "postgresql://owner:pw@db.example:5432/kb")
    assert cli.main(["db", "url"]) == 0
    assert capsys.readouterr().out.strip() == "postgresql://owner:pw@db.example:5432/kb"
    assert cli.main(["db", "url", "--app"]) == 0
    assert capsys.readouterr().out.strip() == "postgresql://cyberos_app@db.example:5432/kb"


def test_lists_rebuilds_a_tenants_bm25_term_lists(capsys, monkeypatch, settings, app_conn):
    import uuid

    from kb_rerank.store.session import tenant_transaction

    from .helpers import basis, insert_doc

    tenant = uuid.uuid4()
    # (the title is indexed with each chunk, migration 0017: a word the chunks hold already)
    insert_doc(app_conn, tenant, "Zebra", ["zebra crossing", "zebra stripes"], [basis(1), basis(2)])
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("KB_TERM_LIST_MIN_DF", "2")
    assert cli.main(["lists", "--tenant", str(tenant)]) == 0
    # the exact term and its stem (issue 15: the stemmed field has lists of its own)
    assert capsys.readouterr().out.startswith(f"2 BM25 term lists rebuilt for tenant {tenant}")
    with tenant_transaction(app_conn, tenant):
        assert sorted(app_conn.execute("select term, cardinality(chunk_ids) from kb.term_tops").fetchall()) == [
            ("zebra", 2), ("~ zebra", 2)]
