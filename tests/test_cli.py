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


def test_term_blocks_rebuilds_a_tenants_bm25_term_blocks(capsys, monkeypatch, settings, app_conn):
    import uuid

    from kb_rerank.store.session import tenant_transaction

    from .helpers import basis, insert_doc

    tenant = uuid.uuid4()
    # (the title is indexed with each chunk, migration 0017: a word the chunks hold already)
    insert_doc(app_conn, tenant, "Zebra", ["zebra crossing", "zebra stripes"], [basis(1), basis(2)])
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("KB_TERM_LIST_MIN_DF", "2")
    assert cli.main(["term-blocks", "--tenant", str(tenant), "--quiet"]) == 0
    # the exact term and its stem (issue 15: the stemmed field has blocks of its own)
    out = capsys.readouterr()
    assert out.out.startswith(f"term blocks of 2 words rebuilt for tenant {tenant}")
    assert "deprecated" not in out.err
    # the old name still works, with a one-line notice on stderr
    assert cli.main(["lists", "--tenant", str(tenant), "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"term blocks of 2 words rebuilt for tenant {tenant}")
    assert out.err == "kb-rerank: `lists` is deprecated, use `kb-rerank term-blocks`\n"
    with tenant_transaction(app_conn, tenant):
        assert sorted(app_conn.execute("select term, cardinality(chunk_ids) from kb.term_blocks").fetchall()) == [
            ("zebra", 2), ("~ zebra", 2)]
