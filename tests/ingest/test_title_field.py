"""The title field (migration 0017): a chunk's lexical columns are derived from its document's
title and its content; a title changed in SQL or by ingestion re-derives (and re-embeds)."""

from __future__ import annotations

import uuid

import psycopg

from kb_rerank.db import database as db
from kb_rerank.ingest.loader import ingest_paths
from kb_rerank.retrieval import store as search
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.session import run

from tests.helpers import basis, insert_doc
from tests.ingest.test_ingest import _stats_are_exact
from tests.db.test_migrations import _new_database


def _lexemes(conn, tenant, doc_id):
    with tenant_transaction(conn, tenant):
        return [set(r[0]) for r in conn.execute(
            "select tsvector_to_array(tsv) from kb.chunks where doc_id = %s order by position", [doc_id])]


def test_a_chunk_is_found_through_its_documents_title(app_conn, tenant):
    """Every chunk of a titled document holds the title's words in both fields; a chunk whose
    text never names the topic is found by it, and an identifier in the title stays whole."""
    doc = insert_doc(app_conn, tenant, "Quokka care and ERR_402", ["feeding schedule", "night enclosure"],
                     [basis(1), basis(2)], language="en")
    insert_doc(app_conn, tenant, "Other", ["quokkas are small"], [basis(3)], language="en")
    for lexemes in _lexemes(app_conn, tenant, doc):
        assert {"quokka", "~ quokka", "err_402", "care", "~ care"} <= lexemes
    with tenant_transaction(app_conn, tenant):
        assert {r.doc_title for r in run(app_conn, search.alexical, "quokka", 10)} == {"Quokka care and ERR_402", "Other"}
        assert [r.doc_title for r in run(app_conn, search.alexical, "ERR_402", 10)] == ["Quokka care and ERR_402"]
        assert [r.doc_title for r in run(app_conn, search.alexical, "enclosure", 10)] == ["Quokka care and ERR_402"]
        lens = app_conn.execute("select doc_len from kb.chunks where doc_id = %s order by position", [doc]).fetchall()
    # the title's five words (ERR_402 is also `err` and `402`) and the content's two
    assert [n for (n,) in lens] == [5 + 2, 5 + 2]
    _stats_are_exact(app_conn, tenant)


def test_a_title_or_language_updated_in_sql_re_derives_the_chunks(app_conn, tenant):
    doc = insert_doc(app_conn, tenant, "Quokka care", ["feeding schedule"], [basis(1)], language="en")
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("update kb.documents set title = 'Wombat burrows' where doc_id = %s", [doc])
    (lexemes,) = _lexemes(app_conn, tenant, doc)
    assert {"wombat", "~ wombat", "~ burrow", "feeding"} <= lexemes and not {"quokka", "~ quokka"} & lexemes
    _stats_are_exact(app_conn, tenant)
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select count(*) from kb.term_stats where term like '%%quokka'").fetchone()[0] == 0
        # another language: the stemmed field in German's stemmer (which keeps `burrows`)
        app_conn.execute("update kb.documents set language = 'de' where doc_id = %s", [doc])
    (lexemes,) = _lexemes(app_conn, tenant, doc)
    assert "~ burrows" in lexemes and "~ burrow" not in lexemes
    _stats_are_exact(app_conn, tenant)


def test_a_new_title_re_embeds_and_re_indexes_every_chunk(app_conn, tenant, embedder, settings, tmp_path):
    """Ingestion embeds a chunk with its title: a document whose title changed gets new vectors
    for every chunk (none reused under the old title) and new lexemes."""
    kb = tmp_path / "kb"
    kb.mkdir()
    body = "\n\n".join(f"Paragraph {i}: " + "the enclosure needs shade and water every day. " * 6 for i in range(6))
    (kb / "care.md").write_text("# Quokka care\n\n" + body)
    first = ingest_paths(app_conn, tenant, [kb], embedder, settings)
    assert first.chunks_written >= 2
    with tenant_transaction(app_conn, tenant):
        doc = app_conn.execute("select doc_id from kb.documents").fetchone()[0]
    assert all("quokka" in x for x in _lexemes(app_conn, tenant, doc))
    (kb / "care.md").write_text("# Wombat care\n\n" + body)
    second = ingest_paths(app_conn, tenant, [kb], embedder, settings)
    assert second.updated == 1 and second.embeddings_reused == 0
    assert second.embeddings_computed == second.chunks_written == first.chunks_written
    assert all("wombat" in x and "quokka" not in x for x in _lexemes(app_conn, tenant, doc))
    _stats_are_exact(app_conn, tenant)
