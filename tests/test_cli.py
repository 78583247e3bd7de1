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
