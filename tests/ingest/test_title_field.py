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


def test_0017_re_derives_titled_chunks_and_rebuilds_their_blocks(server_url):
    """Up from 0016 (a database at head, downgraded: 0016's chunk trigger, the rest of the
    layer as shipped), titled documents' chunks gain the title's words (untitled ones are not
    rewritten), the statistics stay exact and the BM25 blocks are rebuilt with the parameters
    they had (no appended parts); down again, all as it was."""
    url, s = _new_database(server_url)
    db.migrate(s)
    db.downgrade(s, revision="0016_app_role")
    tenant = uuid.uuid4()
    insert = ("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
              " select %s, %s, %s, %s, repeat('0', 64), array_fill(0.1::real, array[dim])::vector"
              " from kb.embedding_config")

    def state(conn):
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        # kb.term_tops before 0019_term_blocks_name, kb.term_blocks from it on
        blocks = "kb.term_blocks" if conn.execute("select to_regclass('kb.term_blocks')").fetchone()[0] \
            else "kb.term_tops"
        assert conn.execute("select n_chunks, total_len, stem_total_len from kb.corpus_stats").fetchone() == \
            conn.execute("select count(*), sum(doc_len), sum(stem_len) from kb.chunks").fetchone()
        return {
            "lexemes": dict(conn.execute(
                "select d.title || c.position, tsvector_to_array(c.tsv) from kb.chunks c join kb.documents d"
                " using (doc_id)").fetchall()),
            "extra_len": dict(conn.execute(
                "select d.title, array_agg(distinct c.doc_len - kb.doc_length(c.content)) from kb.chunks c"
                " join kb.documents d using (doc_id) group by d.title").fetchall()),
            "blocks": conn.execute(f"select term, level, part, n, k1, b from {blocks} order by 1, 2, 3").fetchall(),
            "untitled_xmin": conn.execute(
                "select array_agg(c.xmin::text order by c.chunk_id) from kb.chunks c join kb.documents d"
                " using (doc_id) where d.title = ''").fetchone()[0],
            "df": dict(conn.execute("select term, df from kb.term_stats").fetchall()),
        }

    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        for i in range(12):
            # (language unknown: 0021, on the way to head, leaves such English chunks as they are,
            # no language lexeme, so what 0017 rewrote is what changed)
            doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, language)"
                               " values (%s, %s, %s, repeat('0', 64), null) returning doc_id",
                               [tenant, f"u{i}", "Zebra" if i < 6 else ""]).fetchone()[0]
            conn.execute(insert, [tenant, doc, 0, " ".join(["zebra"] * (1 + i % 3) + ["filler"] * (i % 4))])
        conn.execute("select kb.refresh_term_tops(2, 3, 0.9::float8, 0.4::float8)")
        conn.commit()
        before = state(conn)
    assert before["extra_len"] == {"Zebra": [0], "": [0]} and before["blocks"]
    db.migrate(s)
    with psycopg.connect(url) as conn:
        after = state(conn)
    assert after["extra_len"] == {"Zebra": [1], "": [0]}  # the title's one word
    assert after["untitled_xmin"] == before["untitled_xmin"]  # untitled chunks not rewritten
    assert after["lexemes"] == before["lexemes"] and after["df"] == before["df"]  # (the title's word is in the body)
    assert all(part == 0 for _, _, part, _, _, _ in after["blocks"])  # rebuilt: nothing appended
    assert {(n, k1, b) for _, level, _, n, k1, b in after["blocks"] if level == 0} == {(2, 0.9, 0.4)}
    assert {t for t, *_ in after["blocks"]} == {t for t, *_ in before["blocks"]}
    # the migration's rebuild (a frozen inline copy) equals the installed function's, to the bit
    full = ("select term, level, part, chunk_ids, n, tail, avglen, k1, b from kb.term_blocks"
            " order by term, level, part")
    with psycopg.connect(url) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        migrated = conn.execute(full).fetchall()
        min_df = conn.execute("select min(df) from kb.term_stats where term in (select term from kb.term_blocks)"
                              ).fetchone()[0]
        conn.execute("select kb.refresh_term_blocks(2, %s, 0.9::float8, 0.4::float8)", [min_df])
        assert conn.execute(full).fetchall() == migrated
        conn.rollback()
    db.downgrade(s, revision="0016_app_role")
    with psycopg.connect(url) as conn:
        down = state(conn)
    assert down["extra_len"] == before["extra_len"] and down["blocks"] == before["blocks"]
    assert down["lexemes"] == before["lexemes"] and down["df"] == before["df"]
