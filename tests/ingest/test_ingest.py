"""Ingestion: idempotence, replacement of changed documents, bad files, exact BM25 statistics."""

from __future__ import annotations

import shutil
from collections import Counter

from kb_rerank.core.session import tenant_transaction
from kb_rerank.ingest.loader import delete_document, ingest_paths

from tests.conftest import EXAMPLES


def _stats_are_exact(conn, tenant):
    """kb.term_stats / kb.corpus_stats equal what the chunks say, for this tenant (both
    fields' lengths)."""
    with tenant_transaction(conn, tenant):
        df = Counter()
        total = stem_total = 0
        rows = conn.execute("select tsvector_to_array(tsv), doc_len, stem_len from kb.chunks").fetchall()
        for lexemes, n, sn in rows:
            df.update(lexemes)
            total += n
            stem_total += sn
        stored = dict(conn.execute("select term, df from kb.term_stats").fetchall())
        corpus = conn.execute("select n_chunks, total_len, stem_total_len from kb.corpus_stats").fetchone()
    assert stored == dict(df)
    assert (corpus or (0, 0, 0)) == (len(rows), total, stem_total)


def test_ingest_is_idempotent_and_replaces_changed_documents(app_conn, tenant, embedder, settings, tmp_path):
    kb = tmp_path / "kb"
    shutil.copytree(EXAMPLES, kb)
    (kb / "binary.md").write_bytes(b"\x00\x01\x02 not text")
    (kb / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (kb / "empty.md").write_text("   \n")

    first = ingest_paths(app_conn, tenant, [kb], embedder, settings)
    n_docs = len(list(EXAMPLES.glob("*.md")))
    assert first.added == n_docs and first.updated == first.unchanged == 0
    assert {b.path.rsplit("/", 1)[-1] for b in first.bad_files} == {"binary.md", "latin1.txt", "empty.md"}
    assert first.embeddings_computed == first.chunks_written > n_docs
    _stats_are_exact(app_conn, tenant)

    again = ingest_paths(app_conn, tenant, [kb], embedder, settings)
    assert (again.added, again.updated, again.unchanged, again.chunks_written, again.embeddings_computed) == (
        0, 0, n_docs, 0, 0)

    # change one paragraph of the long, multi-chunk document
    page = kb / "webhooks.md"
    text = page.read_text()
    page.write_text(text + "\n\n## Changelog\n\nWebhook payload version 7 added the field `ledger_id`.\n")
    with tenant_transaction(app_conn, tenant):
        before = app_conn.execute(
            "select count(*) from kb.chunks c join kb.documents d using (doc_id) where d.source_uri = 'webhooks.md'"
        ).fetchone()[0]
    third = ingest_paths(app_conn, tenant, [kb], embedder, settings)
    assert (third.added, third.updated, third.unchanged) == (0, 1, n_docs - 1)
    assert third.embeddings_reused >= before - 1  # unchanged chunks kept their embeddings
    assert third.embeddings_computed >= 1
    with tenant_transaction(app_conn, tenant):
        chunks = [r[0] for r in app_conn.execute(
            "select content from kb.chunks c join kb.documents d using (doc_id)"
            " where d.source_uri = 'webhooks.md' order by position")]
        assert any("ledger_id" in c for c in chunks)
        assert app_conn.execute("select count(*) from kb.documents").fetchone()[0] == n_docs
    _stats_are_exact(app_conn, tenant)

    assert delete_document(app_conn, tenant, "webhooks.md")
    _stats_are_exact(app_conn, tenant)
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select count(*) from kb.term_stats where term = 'ledger_id'").fetchone()[0] == 0


def test_beir_corpus_jsonl(app_conn, tenant, embedder, settings, tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"_id": "d1", "title": "Boundary layer", "text": "Laminar boundary layer on a flat plate."}\n'
        "{not json}\n"
        '{"_id": "d2", "title": "Shock waves", "text": "Oblique shock waves at hypersonic speed."}\n'
    )
    report = ingest_paths(app_conn, tenant, [corpus], embedder, settings)
    assert report.added == 2 and len(report.bad_files) == 1
    with tenant_transaction(app_conn, tenant):
        uris = {r[0] for r in app_conn.execute("select source_uri from kb.documents")}
    assert uris == {"beir:d1", "beir:d2"}


def test_ingest_rebuilds_bm25_term_lists_when_a_large_share_changed(app_conn, tenant, embedder, settings, tmp_path):
    """After an ingest the tenant's BM25 term blocks (kb.term_blocks) are rebuilt when the
    ingest wrote at least a tenth of its chunks or it has none yet; a small ingest into a
    larger tenant leaves them to the insert trigger (a rebuild reads every chunk)."""
    s = settings.with_(term_list_length=3, term_list_min_df=2)
    kb = tmp_path / "kb"
    shutil.copytree(EXAMPLES, kb)
    first = ingest_paths(app_conn, tenant, [kb], embedder, s)
    with tenant_transaction(app_conn, tenant):
        lists = dict(app_conn.execute("select term, cardinality(chunk_ids) from kb.term_blocks where level = 0").fetchall())
        built = app_conn.execute("select max(built_at) from kb.term_blocks").fetchone()[0]
        n_chunks = app_conn.execute("select n_chunks from kb.corpus_stats").fetchone()[0]
        # (the chunks' language lexeme, '@language en', is counted but never gets blocks)
        df2 = app_conn.execute("select count(*) from kb.term_stats where df >= 2"
                               " and term not like '@language %%'").fetchone()[0]
    assert first.term_lists == len(lists) == df2 > 0
    assert set(lists.values()) <= {2, 3}
    assert "BM25 term lists rebuilt" in first.summary()
    assert ingest_paths(app_conn, tenant, [kb], embedder, s).term_lists is None  # nothing written
    (kb / "small.md").write_text("# Small\n\nOne short page about invoices.\n")
    small = ingest_paths(app_conn, tenant, [kb], embedder, s)
    assert small.chunks_written == 1 < 0.1 * n_chunks and small.term_lists is None
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select max(built_at) from kb.term_blocks").fetchone()[0] == built
    for i in range(5):
        (kb / f"more{i}.md").write_text(f"# More {i}\n\n" + "Invoices and webhooks. " * 50 + "\n\n"
                                        + "Refunds take days. " * 60 + "\n\n" + "Tax rates. " * 100)
    more = ingest_paths(app_conn, tenant, [kb], embedder, s)
    assert more.chunks_written >= 0.1 * n_chunks and more.term_lists and more.term_lists > 0
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select max(built_at) from kb.term_blocks").fetchone()[0] > built
