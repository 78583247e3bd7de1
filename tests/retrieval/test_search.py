"""Lexical (BM25), semantic and hybrid search against the real database."""

from __future__ import annotations

import itertools
import math
import uuid
from collections import Counter

import numpy as np
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from kb_rerank.retrieval import store as search
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.session import run

from tests.helpers import basis, insert_doc, unit

# The distinct, sorted terms a query is searched with (kb.search_term_counts, what
# kb.search_lexical reads) and its exact-field terms (kb.query_term_counts).
SEARCH_TERMS = "select coalesce(array_agg(c.term order by c.term), '{}') from kb.search_term_counts(%s) as c"
QUERY_TERMS = "select coalesce(array_agg(c.term order by c.term), '{}') from kb.query_term_counts(%s) as c"


def _titles(rows):
    return [r.doc_title for r in rows]


def _rank_of(rows, needle):
    for i, r in enumerate(rows, 1):
        if needle.lower() in r.doc_title.lower():
            return i
    return None


def _err_title(app_conn, tenant):
    with tenant_transaction(app_conn, tenant):
        return app_conn.execute(
            "select title from kb.documents where source_uri = 'err-402.md'"
        ).fetchone()[0]


ERROR_PAGES = {
    "Subscription lapsed": "Your plan renewal did not go through, so the account is read-only. The dashboard "
                           "shows ERR_402 in the banner. Renew from Billing > Plan to restore access.",
    "Error ERR_401": "ERR_401 means the API key is missing or invalid. Create a new key in Settings > API.",
    "Error ERR_403": "ERR_403 means your role lacks permission for this action. Ask an administrator.",
    "Error ERR_404": "ERR_404: the invoice or customer you asked for does not exist.",
    "Error ERR_409": "ERR_409: a conflicting edit happened; reload the invoice and try again.",
    "Error ERR_429": "ERR_429: too many requests; slow down and retry after the Retry-After delay.",
    "Error ERR_422": "ERR_422: a field in your request is invalid; the response names the field.",
}


def test_error_code_found_by_lexical_and_hybrid_but_missed_by_semantic(app_conn, tenant, embedder):
    """Sibling error pages look alike to an embedding; the exact token decides."""
    for title, text in ERROR_PAGES.items():
        insert_doc(app_conn, tenant, title, [text], embedder.embed_passages([f"{title}\n{text}"]))
    q = "ERR_402"
    emb = embedder.embed_query(q)
    with tenant_transaction(app_conn, tenant):
        lex = run(app_conn, search.alexical, q, 20)
        sem = run(app_conn, search.asemantic, emb, 20)
        hyb = run(app_conn, search.ahybrid, q, emb, 20)
    assert _titles(lex)[0] == "Subscription lapsed"
    assert _titles(hyb)[0] == "Subscription lapsed"
    assert _titles(sem)[0] != "Subscription lapsed"  # semantic alone misses it


def test_error_code_in_sample_knowledge_base(app_conn, sample_tenant, embedder):
    title = _err_title(app_conn, sample_tenant)
    with tenant_transaction(app_conn, sample_tenant):
        lex = run(app_conn, search.alexical, "ERR_402", 20)
        hyb = run(app_conn, search.ahybrid, "what does ERR_402 mean", embedder.embed_query("what does ERR_402 mean"), 20)
    assert _titles(lex)[0] == title
    assert _titles(hyb)[0] == title


def test_paraphrase_found_by_semantic_when_lexical_misses(app_conn, sample_tenant, embedder):
    q = "transfer ownership of my workspace to a colleague"
    with tenant_transaction(app_conn, sample_tenant):
        target = app_conn.execute(
            "select title from kb.documents where source_uri = 'change-account-owner.md'"
        ).fetchone()[0]
        sem = run(app_conn, search.asemantic, embedder.embed_query(q), 20)
        lex = run(app_conn, search.alexical, q, 20)
    assert _titles(sem)[0] == target
    assert target not in _titles(lex)[:1]


@pytest.mark.parametrize("query", ["hoa don dien tu", "xuat hoa don", "HÓA ĐƠN điện tử"])
def test_vietnamese_without_diacritics_finds_documents_with_them(app_conn, sample_tenant, query):
    with tenant_transaction(app_conn, sample_tenant):
        lex = run(app_conn, search.alexical, query, 5)
        langs = app_conn.execute(
            "select d.language from kb.documents d where d.doc_id = %s", [lex[0].doc_id]
        ).fetchone()[0]
    assert lex, query
    assert "hóa đơn" in lex[0].content.lower()
    assert langs == "vi"


@pytest.mark.parametrize("token,source", [("SKU-1234", "sku-codes.md"), ("v2.3.1", "release-notes-v2-3-1.md"),
                                          ("ERR_402", "err-402.md")])
def test_code_tokens_match_whole(app_conn, sample_tenant, token, source):
    with tenant_transaction(app_conn, sample_tenant):
        lex = run(app_conn, search.alexical, token, 5)
        doc = app_conn.execute("select doc_id from kb.documents where source_uri = %s", [source]).fetchone()[0]
        terms = app_conn.execute(QUERY_TERMS, [token]).fetchone()[0]
    assert token.lower() in terms  # kept whole, besides its parts
    assert lex[0].doc_id == doc



@pytest.fixture(scope="module")
def rrf_tenant(app_url):
    """Three documents whose lexical and semantic ranks are known by construction:
    lexical('apple banana', k=2) = [A, B]   (A has both words twice, B has one once)
    semantic(e0, k=2)            = [B, C]   (B = e0, C close to e0, A orthogonal)"""
    t = uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        from kb_rerank.core.session import configure_connection

        configure_connection(conn)
        a = insert_doc(conn, t, "A", ["apple banana apple banana"], [basis(1)])
        b = insert_doc(conn, t, "B", ["banana split dessert"], [basis(0)])
        c = insert_doc(conn, t, "C", ["cherry tart dessert"], [unit(basis(0) + 0.3 * basis(2))])
    return t, {"A": a, "B": b, "C": c}


# RRF with rrf_k 60 and weights 1:1 (a fixed configuration; kb.search_hybrid's defaults
# are the service's convex fusion, tests/retrieval/test_one_default.py)
RRF = {"fusion": "rrf", "rrf_k": 60, "lexical_weight": 1.0, "semantic_weight": 1.0}


def test_rrf_matches_hand_computed_values(app_conn, rrf_tenant):
    t, ids = rrf_tenant
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.ahybrid, "apple banana", basis(0), k=2, **RRF)
    # A: lexical 1              -> 1/61             = 0.0163934
    # B: lexical 2, semantic 1  -> 1/62 + 1/61      = 0.0325225
    # C: semantic 2             -> 1/62             = 0.0161290
    got = {r.doc_title: (r.lexical_rank, r.semantic_rank, round(r.score, 7)) for r in rows}
    assert got == {"A": (1, None, 0.0163934), "B": (2, 1, 0.0325225), "C": (None, 2, 0.016129)}
    assert _titles(rows) == ["B", "A", "C"]
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.ahybrid, "apple banana", basis(0), k=2, **{**RRF, "rrf_k": 0})
    # rrf_k = 0: B = 1/2 + 1/1 = 1.5, A = 1, C = 1/2
    assert [(r.doc_title, round(r.score, 6)) for r in rows] == [("B", 1.5), ("A", 1.0), ("C", 0.5)]


def test_weights_shift_fusion(app_conn, rrf_tenant):
    t, _ = rrf_tenant
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.ahybrid, "apple banana", basis(0), k=2, **{**RRF, "lexical_weight": 3.0})
    # A = 3/61 = 0.04918, B = 3/62 + 1/61 = 0.06478, C = 1/62 = 0.01613
    assert [(r.doc_title, round(r.score, 5)) for r in rows] == [("B", 0.06478), ("A", 0.04918), ("C", 0.01613)]


def test_interleave_is_round_robin_without_duplicates(app_conn, rrf_tenant):
    t, _ = rrf_tenant
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.ahybrid, "apple banana", basis(0), k=2, fusion="interleave")
    # lexical[1]=A, semantic[1]=B, lexical[2]=B (taken), semantic[2]=C
    assert [(r.doc_title, round(r.score, 6)) for r in rows] == [("A", 1.0), ("B", 0.5), ("C", round(1 / 3, 6))]


def test_convex_fusion_of_min_max_normalised_scores(app_conn, rrf_tenant):
    t, _ = rrf_tenant
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.ahybrid, "apple banana", basis(0), k=3, fusion="convex",
                             lexical_weight=1.0, semantic_weight=2.0)
    # lexical top 3 = [A, B] (C has neither word): normalised A 1, B 0
    # semantic top 3 = [B 1.0, C 1/sqrt(1.09), A 0.0]: normalised B 1, C 0.957826, A 0
    # score = (1 * lexn + 2 * semn) / 3
    assert [(r.doc_title, round(r.score, 6)) for r in rows] == [
        ("B", round(2 / 3, 6)), ("C", round(2 / math.sqrt(1.09) / 3, 6)), ("A", round(1 / 3, 6))]
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.ahybrid, "apple banana", basis(0), k=2, fusion="convex",
                             lexical_weight=3.0, semantic_weight=1.0)
    # semantic top 2 = [B, C]: C is the list's minimum, normalised to 0 like a missing score
    assert [(r.doc_title, round(r.score, 6)) for r in rows] == [("A", 0.75), ("B", 0.25), ("C", 0.0)]


@pytest.mark.parametrize("args,message", [
    ({"k": 0}, "k must be between 1 and 1000"),
    ({"fusion": "max"}, "fusion must be"),
    ({"rrf_k": -1}, "rrf_k must be >= 0"),
    ({"fusion": "convex", "lexical_weight": 0.0, "semantic_weight": 0.0}, "convex fusion needs weights"),
    ({"fusion": "convex", "lexical_weight": -1.0}, "convex fusion needs weights"),
])
def test_hybrid_rejects_bad_arguments(app_conn, rrf_tenant, args, message):
    t, _ = rrf_tenant
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        with tenant_transaction(app_conn, t):
            run(app_conn, search.ahybrid, "apple", basis(0), **{"k": 2, **args})


def test_bm25_matches_hand_computation(app_conn, rrf_tenant):
    """kb.search_lexical against BM25 computed here from the same tokens."""
    t, _ = rrf_tenant
    docs = {"A": "apple banana apple banana", "B": "banana split dessert", "C": "cherry tart dessert"}
    toks = {k: v.split() for k, v in docs.items()}
    n = len(docs)
    avg = sum(len(v) for v in toks.values()) / n
    k1, b = 1.2, 0.75

    def bm25(query_terms, d):
        s = 0.0
        for term in query_terms:
            df = sum(term in v for v in toks.values())
            tf = toks[d].count(term)
            if tf:
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len(toks[d]) / avg))
        return s

    # e.g. A: df(apple)=1 -> idf = ln(1 + 2.5/1.5) = 0.98083; tf=2, |A|=4, avg=10/3
    #      apple: 0.98083 * 2*2.2 / (2 + 1.2*(0.25 + 0.75*4/(10/3))) = 0.98083*4.4/3.38 = 1.27683
    assert math.isclose(bm25(["apple"], "A"), 1.27683, rel_tol=1e-4)
    # "dessert" typed twice weighs twice (qtf = 2), as in Lucene
    for query, terms in (("apple banana dessert", ["apple", "banana", "dessert"]),
                         ("dessert apple, DESSERT", ["dessert", "apple", "dessert"])):
        with tenant_transaction(app_conn, t):
            rows = run(app_conn, search.alexical, query, 10)
        got = {r.doc_title: r.score for r in rows}
        expected = {d: bm25(terms, d) for d in docs}
        assert set(got) == {d for d, s in expected.items() if s > 0}
        for d, s in got.items():
            assert math.isclose(s, expected[d], rel_tol=1e-9), (query, d, s, expected[d])
        assert [r.lexical_rank for r in rows] == list(range(1, len(rows) + 1))


def test_lexical_dedups_by_document_and_hybrid_fuses_per_document(app_conn, tenant):
    """A document found by the two lists through different chunks is one row with both ranks."""
    insert_doc(app_conn, tenant, "Long", ["walrus one", "walrus two walrus", "walrus three"],
               [basis(3), basis(4), basis(5)])
    insert_doc(app_conn, tenant, "Short", ["walrus seen"], [basis(6)])
    with tenant_transaction(app_conn, tenant):
        lex = run(app_conn, search.alexical, "walrus", 20)
        sem = run(app_conn, search.asemantic, basis(3), 20)
        hyb = run(app_conn, search.ahybrid, "walrus", basis(3), 20, **RRF)
    assert Counter(r.doc_id for r in lex).most_common(1)[0][1] == 1  # one chunk per document
    assert _titles(lex) == ["Long", "Short"]
    assert lex[0].content == "walrus two walrus"  # the document's best chunk
    assert len(sem) == 4  # semantic is per chunk
    assert sem[0].content == "walrus one"  # Long's best semantic chunk is another chunk
    # chunk fusion listed Long twice ("walrus two walrus" lexical 1, "walrus one" semantic 1);
    # per document it is one row with both ranks, and so is Short
    got = {r.doc_title: (r.lexical_rank, r.semantic_rank, r.content) for r in hyb}
    assert len(hyb) == 2
    assert got == {"Long": (1, 1, "walrus one"), "Short": (2, 2, "walrus seen")}
    assert [round(r.score, 7) for r in hyb] == [round(2 / 61, 7), round(2 / 62, 7)]
    assert hyb[0].semantic_score == pytest.approx(1.0)  # the document's best similarity


def test_hybrid_carries_the_chunk_of_the_better_rank(app_conn, tenant):
    insert_doc(app_conn, tenant, "Long", ["walrus one", "walrus two walrus", "walrus three"],
               [basis(3), basis(4), basis(5)])
    insert_doc(app_conn, tenant, "Short", ["walrus seen"], [basis(6)])
    q = unit(basis(6) + 0.5 * basis(3))  # semantic: Short 1, Long 2 (through "walrus one")
    with tenant_transaction(app_conn, tenant):
        lex = run(app_conn, search.alexical, "walrus", 20)
        hyb = run(app_conn, search.ahybrid, "walrus", q, 20)
    assert _titles(lex) == ["Long", "Short"]
    got = {r.doc_title: (r.lexical_rank, r.semantic_rank, r.content, round(r.semantic_score, 6)) for r in hyb}
    # Long ranks higher lexically, so it carries its lexical chunk; semantic_score stays the
    # document's best similarity (of "walrus one"), which the relevance gate reads
    assert got == {"Long": (1, 2, "walrus two walrus", round(0.5 / math.sqrt(1.25), 6)),
                   "Short": (2, 1, "walrus seen", round(1 / math.sqrt(1.25), 6))}


def test_semantic_list_reads_deeper_until_it_holds_k_documents(app_conn, tenant):
    """Five chunks of one document are closer than any other document's: with k = 2 the first
    2k = 4 chunks hold one document, so the function reads deeper and still ranks the second."""
    insert_doc(app_conn, tenant, "Long", [f"part {i}" for i in range(5)],
               [unit(basis(0) + 0.05 * (i + 1) * basis(10 + i)) for i in range(5)])
    insert_doc(app_conn, tenant, "Far", ["far away"], [unit(basis(0) + basis(20))])
    insert_doc(app_conn, tenant, "Farther", ["farther away"], [unit(basis(0) + 2 * basis(21))])
    with tenant_transaction(app_conn, tenant):
        hyb = run(app_conn, search.ahybrid, "zyxwv", basis(0), 2)
    assert [(r.doc_title, r.semantic_rank, r.lexical_rank) for r in hyb] == [("Long", 1, None), ("Far", 2, None)]
    assert hyb[0].content == "part 0"


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=300))
def test_any_query_text_is_accepted(app_conn, rrf_tenant, text):
    t, _ = rrf_tenant
    text = text.replace("\x00", "")  # NUL cannot be sent to PostgreSQL at all; the API refuses it
    with tenant_transaction(app_conn, t):
        rows = run(app_conn, search.alexical, text, 5)
        assert all(r.score > 0 for r in rows)


@pytest.mark.parametrize("query", ["'", "\\", "a & | ! ( ) <-> :* b", "x" * 5000, "''::tsquery", "!!!", "   "])
def test_operator_like_queries_never_raise(app_conn, rrf_tenant, query):
    t, _ = rrf_tenant
    with tenant_transaction(app_conn, t):
        run(app_conn, search.alexical, query, 5)
        run(app_conn, search.ahybrid, query, basis(0), 5)


def test_hnsw_with_tenant_filter_equals_exact_top20(app_conn, owner_conn):
    """Many tenants in one HNSW index: each tenant's top-20 through the index (iterative scan)
    equals its exact top-20."""
    rng = np.random.default_rng(7)
    dim = 384
    tenants = [uuid.uuid4() for _ in range(6)]
    centers = rng.normal(size=(12, dim))
    vectors: dict[uuid.UUID, tuple[list, np.ndarray]] = {}
    for t in tenants:
        vecs = np.stack([unit(centers[rng.integers(12)] + 0.6 * rng.normal(size=dim)) for _ in range(500)])
        ids = []
        with tenant_transaction(app_conn, t):
            doc = app_conn.execute(
                "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                " values (kb.current_tenant(), 'bulk', 'bulk', %s) returning doc_id", ["0" * 64]
            ).fetchone()[0]
            with app_conn.cursor() as cur:
                cur.executemany(
                    "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                    " values (kb.current_tenant(), %s, %s, %s, %s, %s)",
                    [(doc, i, f"row {i}", "0" * 64, v) for i, v in enumerate(vecs)],
                )
            ids = [r[0] for r in app_conn.execute(
                "select chunk_id from kb.chunks where doc_id = %s order by position", [doc])]
        vectors[t] = (ids, vecs)
    owner_conn.execute("analyze kb.chunks")
    total = owner_conn.execute("select count(*) from kb.chunks").fetchone()[0]
    assert total >= 3000
    recalls = []
    for t in tenants:
        ids, vecs = vectors[t]
        for _ in range(5):
            q = unit(centers[rng.integers(12)] + 0.6 * rng.normal(size=dim))
            exact = [ids[i] for i in np.argsort(-(vecs @ q), kind="stable")[:20]]
            with tenant_transaction(app_conn, t):
                got = [r.chunk_id for r in run(app_conn, search.asemantic, q, 20)]
            recalls.append(len(set(got) & set(exact)) / 20)
            assert len(got) == 20
    assert min(recalls) == 1.0, recalls


@pytest.fixture
def own_database(server_url):
    """A freshly migrated database of its own, so that planner statistics do not depend on
    what other tests left in the shared one (hundreds of small tenants make the generic
    estimate of one tenant's rows tiny)."""
    from kb_rerank.db import database as db
    from kb_rerank.core.settings import Settings

    name = f"kb_plan_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = db.replace_url(server_url, dbname=name)
    db.migrate(Settings(database_url=url))
    return url


def test_indexes_are_used_inside_search_functions_as_app_role(own_database):
    """EXPLAIN (via auto_explain of nested statements) of the search functions called as
    kb_app: the (tenant_id, tsv) GIN index and the HNSW index serve them."""
    from kb_rerank.db.database import app_url
    from kb_rerank.core.session import configure_connection
    from kb_rerank.core.settings import Settings

    owner_url = own_database
    app_conn = psycopg.connect(app_url(Settings(database_url=owner_url)))
    configure_connection(app_conn)
    t = uuid.uuid4()
    for other in range(3):  # a few small neighbours
        insert_doc(app_conn, uuid.uuid4(), f"other {other}", ["apple quokka"], [basis(other)])
    rng = np.random.default_rng(3)
    words = ["apple", "banana", "cherry", "dessert", "pear", "plum", "fig", "kiwi"]
    # a selective term (1 row in 100), so that the planner prefers the index on any statistics
    texts = [" ".join(rng.choice(words, 6)) + (" quokka" if i % 100 == 0 else "") for i in range(2000)]
    vecs = [unit(rng.normal(size=384)) for _ in texts]
    with tenant_transaction(app_conn, t):
        doc = app_conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash)"
            " values (kb.current_tenant(), 'bulk', 'bulk', %s) returning doc_id", ["0" * 64]).fetchone()[0]
        with app_conn.cursor() as cur:
            cur.executemany(
                "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                " values (kb.current_tenant(), %s, %s, %s, %s, %s)",
                [(doc, i, x, "0" * 64, v) for i, (x, v) in enumerate(zip(texts, vecs))])
    plans: list[str] = []
    with psycopg.connect(owner_url, autocommit=True) as conn:
        from kb_rerank.core.session import configure_connection

        configure_connection(conn)
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute("analyze kb.chunks")
        conn.execute("load 'auto_explain'")
        for s in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                  "auto_explain.log_level = notice", "client_min_messages = notice",
                  # A tenant of 2,000 rows is small enough that an exact scan of its rows (tenant
                  # index + sort) can cost less than the HNSW index, and the planner rightly takes
                  # it. What this test checks is that nothing (RLS, the definer, the tenant
                  # filter) prevents the indexes from serving the functions, so the cheaper
                  # alternatives are switched off. Under RLS as the invoker, @@ could not use the
                  # GIN index even so.
                  "enable_seqscan = off", "enable_sort = off"):
            conn.execute("set " + s)
        conn.execute("set role kb_app")
        assert conn.execute("select current_user").fetchone()[0] == "kb_app"
        with conn.transaction():
            conn.execute("select set_config('auth.tenant_id', %s, true)", [str(t)])
            conn.execute("select * from kb.search_lexical('quokka', 5)").fetchall()
            conn.execute("select * from kb.search_semantic(%s, 5)", [basis(0)]).fetchall()
    text = "\n".join(plans)
    assert "chunks_tenant_tsv_idx" in text
    assert "chunks_embedding_hnsw_idx" in text
    app_conn.close()


def test_chunk_texts_is_inlined_into_every_search(owner_conn, app_conn, tenant):
    """The four searches read their rows' texts through kb.chunk_texts; the planner inlines it
    (as kb_app and inside the definers, as kb_search): auto_explain of every nested statement
    shows the chunk and document key lookups and never a call of kb.chunk_texts."""
    insert_doc(app_conn, tenant, "Inline title", ["quokka texts", "other words"], [basis(0), basis(1)])
    plans: list[str] = []
    owner_conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
    owner_conn.execute("load 'auto_explain'")
    for s in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
              "auto_explain.log_level = notice", "client_min_messages = notice"):
        owner_conn.execute("set " + s)
    owner_conn.execute("set role kb_app")
    try:
        with owner_conn.transaction():
            owner_conn.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
            got = {
                "lexical": owner_conn.execute("select doc_title, snippet from kb.search_lexical('quokka', 5)").fetchall(),
                "semantic": owner_conn.execute("select doc_title, snippet from kb.search_semantic(%s, 1)",
                                               [basis(0)]).fetchall(),
                "hybrid": owner_conn.execute("select doc_title, snippet from kb.search_hybrid('quokka', %s, 1)",
                                             [basis(0)]).fetchall(),
                "retrieve": owner_conn.execute(
                    "select doc_title, snippet from kb.retrieve_hybrid('quokka', %s, 1, 60, 'rrf', 1, 1, 1.2, 0.75,"
                    " 5, null, null, null)", [basis(0)]).fetchall()}
    finally:
        owner_conn.execute("reset role")
    assert got == {name: [("Inline title", "quokka texts")] for name in got}
    text = "\n".join(plans)
    assert "Function Scan on chunk_texts" not in text, text
    # one document lookup a search, in the search's own plan (an index or a bitmap scan: the
    # planner's choice depends on what other tests left in the table)
    assert text.count(" on documents d") >= 4, text


def test_diacritics_typed_are_exact_and_folded_queries_find_all(app_conn, tenant):
    """Words with diacritics are indexed as typed and folded: `hóa` and `hòa` stay apart for a
    query typed with diacritics, while `hoa` (typed without) finds both."""
    insert_doc(app_conn, tenant, "invoice", ["xuất hóa đơn điện tử"], [basis(7)])
    insert_doc(app_conn, tenant, "peace", ["hòa bình và hòa giải"], [basis(8)])
    with tenant_transaction(app_conn, tenant):
        exact = {r.doc_title for r in run(app_conn, search.alexical, "hóa đơn", 10)}
        folded = {r.doc_title for r in run(app_conn, search.alexical, "hoa", 10)}
        other = {r.doc_title for r in run(app_conn, search.alexical, "hòa", 10)}
        terms = app_conn.execute(QUERY_TERMS, ["Hóa đơn hoa DON"]).fetchone()[0]
        lens = dict(app_conn.execute(
            "select d.title, c.doc_len from kb.chunks c join kb.documents d using (doc_id)").fetchall())
    assert exact == {"invoice"} and other == {"peace"} and folded == {"invoice", "peace"}
    assert terms == ["don", "hoa", "hóa", "đơn"]
    # the extra exact forms do not lengthen a document for BM25 (the title field's one word,
    # migration 0017, and the content's five)
    assert lens == {"invoice": 1 + 5, "peace": 1 + 5}


@pytest.mark.parametrize("query,expected", [
    # English (an unambiguous stop word such as `what`-like `is`, `of`, `and`): stop words dropped
    ("What is the boundary layer of a flat plate?", ["boundary", "flat", "layer", "plate", "what"]),
    ("ERR_402 and the invoice", ["err_402", "invoice"]),
    # only stop words: kept, so the query still finds something
    ("to be or not to be", ["be", "not", "or", "to"]),
    # Vietnamese typed without diacritics: `the`, `to`, `no` are syllables (thẻ, tổ, nó): kept
    ("hoa don the to no", ["don", "hoa", "no", "the", "to"]),
    # any diacritic means "not English": nothing dropped
    ("thẻ and the", ["and", "the", "thẻ"]),
    # no English-only stop word: the ambiguous ones stay
    ("the flow", ["flow", "the"]),
])
def test_query_terms_drop_english_stop_words_only_in_english(app_conn, query, expected):
    assert app_conn.execute(QUERY_TERMS, [query]).fetchone()[0] == expected


def test_vi_syllable_shape(app_conn):
    words = ["the", "to", "no", "but", "it", "nghieng", "and", "of", "is", "with", "into", "there"]
    got = app_conn.execute(
        "select array_agg(kb.vi_syllable_shape(w) order by o) from unnest(%s::text[]) with ordinality as u(w, o)",
        [words]).fetchone()[0]
    assert got == [True] * 6 + [False] * 6


def test_stop_words_do_not_rank_documents(app_conn, tenant):
    """In an English query the stop words add nothing: a document that repeats `the` and `of`
    does not outrank one that has the content word."""
    insert_doc(app_conn, tenant, "stopwords", ["the of the of the of the of and and is is"], [basis(9)])
    insert_doc(app_conn, tenant, "content", ["supersonic nozzle design notes"], [basis(10)])
    with tenant_transaction(app_conn, tenant):
        rows = run(app_conn, search.alexical, "the design of the nozzle", 10)
    assert [r.doc_title for r in rows] == ["content"]


def _zipf_corpus(app_conn, tenant, seed=5):
    """400 documents of Zipf-distributed words and 30 short ones that repeat a word of middling
    frequency (they outscore documents holding a rare query word once among many, so pruning
    must not skip them). Returns (tokens per document title, vocabulary)."""
    import random

    rng = random.Random(seed)
    letters = "bcdfghjklmnpqrstvwxz"
    vocab = sorted({"".join(rng.choice(letters) for _ in range(6)) + "o" for _ in range(400)})
    weights = [1 / (i + 1) for i in range(len(vocab))]  # vocab[0] is in most documents
    toks = {}
    for i in range(400):
        words = rng.choices(vocab, weights, k=rng.randint(3, 40))
        toks[f"d{i:03d}"] = words
        insert_doc(app_conn, tenant, f"d{i:03d}", [" ".join(words)], [basis(i % 384)])
    for i, w in enumerate(vocab[15:45]):
        words = [w] * rng.randint(2, 5) + rng.choices(vocab[:3], k=rng.randint(0, 2))
        toks[f"s{i:03d}"] = words
        insert_doc(app_conn, tenant, f"s{i:03d}", [" ".join(words)], [basis(i)])
    return toks, vocab


def _zipf_queries(toks, vocab, seed=6):
    import random

    rng = random.Random(seed)
    df = Counter(w for v in toks.values() for w in set(v))
    by_df = sorted(df, key=lambda w: (-df[w], w))
    queries = [[by_df[0], by_df[-1]], [by_df[1], by_df[2], by_df[-2]], by_df[:3], by_df[3:12],
               [by_df[0], by_df[5], by_df[40], by_df[-1], by_df[-3]], [by_df[200]], by_df[::37],
               [by_df[0]], [by_df[1]], [by_df[0], by_df[1]]]
    queries += [rng.sample(by_df[:60], rng.randint(1, 6)) + rng.sample(by_df[60:], rng.randint(0, 2))
                for _ in range(25)]
    queries += [[m, r] + rng.sample(by_df[:5], rng.randint(0, 2))
                for m, r in zip(vocab[15:45], rng.sample(by_df[60:200], 30))]
    queries += [[by_df[0], by_df[0], by_df[-1]], [by_df[10], by_df[10], by_df[10], by_df[80]]]
    return queries


def _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries, ks=(5, 20),
                                           params=((1.2, 0.75), (0.9, 0.4))):
    """kb.search_lexical's top k for every query (and k, and BM25 parameters k1, b) equals
    BM25 computed here over every document: same scores in the same order; the documents
    may differ only within exact ties. Each document's title (its key in ``toks``, one word
    that no query holds) is indexed with its content (the title field, migration 0017): one
    more word of length."""
    n = len(toks)
    avg = sum(1 + len(v) for v in toks.values()) / n
    df = Counter(w for v in toks.values() for w in set(v))
    checked = 0
    for k1, b in params:
        checked += _check_bm25(app_conn, tenant, toks, queries, ks, n, avg, df, k1, b)
    return checked


def _check_bm25(app_conn, tenant, toks, queries, ks, n, avg, df, k1, b):
    def bm25(terms, d):
        s = 0.0
        for term in terms:  # a term listed twice counts twice (qtf)
            tf = toks[d].count(term)
            if tf:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                s += idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * (1 + len(toks[d])) / avg))
        return s

    checked = 0
    for terms, k in itertools.product(queries, ks):
        with tenant_transaction(app_conn, tenant):
            rows = run(app_conn, search.alexical, " ".join(terms), k, k1=k1, b=b)
        expected = sorted(((round(bm25(terms, d), 9), d) for d in toks), key=lambda x: (-x[0], x[1]))
        expected = [e for e in expected if e[0] > 0][:k]
        got = [(r.score, r.doc_title) for r in rows]
        assert len(got) == len(expected), terms
        for (gs, gd), (es, ed) in zip(got, expected):
            assert math.isclose(gs, es, rel_tol=1e-7, abs_tol=1e-8), (terms, k, got, expected)
            assert gd == ed or math.isclose(bm25(terms, gd), es, rel_tol=1e-7), (terms, k, gd, ed)
        checked += 1
    return checked


def test_pruned_bm25_top_k_equals_exhaustive_scoring(app_conn, tenant):
    """Without blocks (kb.term_blocks) kb.search_lexical reads every query word through the GIN
    index. On a Zipf-distributed corpus, where queries mix words in most chunks with rare
    ones and the rare words alone give fewer than k documents, its top k must equal BM25
    computed here over every document (with blocks: the next test)."""
    toks, vocab = _zipf_corpus(app_conn, tenant)
    queries = _zipf_queries(toks, vocab)
    assert _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries) == 4 * len(queries)


def _blocks(app_conn, tenant):
    """{term: [(level, chunk ids of all its parts, tail, k1, b, avglen)]} of the tenant's blocks."""
    with tenant_transaction(app_conn, tenant):
        rows = app_conn.execute(
            "select term, level, array_agg(x.id), min(tail), max(tail), min(k1), min(b), min(avglen), max(avglen)"
            " from kb.term_blocks cross join lateral unnest(chunk_ids) as x(id) group by term, level order by term, level")
        out = {}
        for term, level, ids, tmin, tmax, k1, b, amin, amax in rows:
            assert tmin == tmax and amin == amax  # a level's parts share its tail
            out.setdefault(term, []).append((level, set(ids), tmin, k1, b, amin))
    return out


def _assert_block_invariant(app_conn, tenant, toks):
    """Per term and level L: every chunk holding the term outside levels 0..L has tf_part at
    most L's tail (tf_part computed here, with the blocks' k1, b and average length); the
    levels are 0, 1, ... and their tails do not grow."""
    with tenant_transaction(app_conn, tenant):
        chunks = {cid: (title, dl) for cid, title, dl in app_conn.execute(
            "select c.chunk_id, d.title, c.doc_len from kb.chunks c join kb.documents d using (doc_id)")}
    blocks = _blocks(app_conn, tenant)
    for term, levels in blocks.items():
        assert [lv[0] for lv in levels] == list(range(len(levels))), term
        assert all(a[2] >= b_[2] for a, b_ in zip(levels, levels[1:])), term
        if term.startswith("~ "):
            continue  # (the stemmed field: its lengths are checked by the stemmed test)
        seen = set()
        for level, ids, tail, k1, b, avglen in levels:
            seen |= ids
            for cid, (title, dl) in chunks.items():
                tf = toks[title].count(term)
                if tf and cid not in seen:
                    w = tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / avglen))
                    assert w <= tail + 1e-9, (term, level, title, w, tail)
    return blocks


def test_bm25_term_lists_keep_top_k_exact_through_writes(app_conn, tenant):
    """With term blocks (kb.term_blocks: per common term its chunks by tf_part in
    levels, each with a bound on the chunks outside it and the levels before), the top k
    still equals exhaustive BM25: right after the blocks are built, and after writes that
    they did not see: short documents that repeat a listed word (above a level's tail: the
    insert trigger must add them to a level), an update that raises a word's frequency,
    deletes, and long documents that move the average length (the search must widen the
    tails); with blocks built for other k1 and b, and searches with parameters the blocks
    were not built for."""
    toks, vocab = _zipf_corpus(app_conn, tenant, seed=11)
    queries = _zipf_queries(toks, vocab, seed=12)
    with tenant_transaction(app_conn, tenant):
        n_lists = app_conn.execute("select kb.refresh_term_blocks(30, 40)").fetchone()[0]
    blocks = _assert_block_invariant(app_conn, tenant, toks)
    assert n_lists == len(blocks) >= 10
    assert all(len(lv[0][1]) == 30 and lv[0][2] > 0 for lv in blocks.values())
    assert max(len(lv) for lv in blocks.values()) >= 2  # the common terms have deeper levels
    _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries)

    df = Counter(w for v in toks.values() for w in set(v))
    listed = sorted(blocks, key=lambda w: -df[w])[:6]
    for i, w in enumerate(listed):  # short and repetitive: the best chunks for w now
        toks[f"n{i:03d}"] = [w] * 6
        insert_doc(app_conn, tenant, f"n{i:03d}", [" ".join([w] * 6)], [basis(100 + i)])
    after = _assert_block_invariant(app_conn, tenant, toks)
    with tenant_transaction(app_conn, tenant):
        new_ids = {r[0] for r in app_conn.execute(
            "select c.chunk_id from kb.chunks c join kb.documents d using (doc_id) where d.title like 'n%%'")}
    for w in listed:
        assert after[w][0][1] & new_ids, w  # the trigger added the new best chunk to level 0
    queries += [[w] for w in listed]
    _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries)
    # an update: a document of common words becomes one that repeats a listed word; deletes
    victim = next(d for d in sorted(toks) if d.startswith("d") and listed[1] not in toks[d])
    toks[victim] = [listed[1]] * 5 + toks[victim][:3]
    gone = [d for d in sorted(toks) if d.startswith("d") and listed[0] in toks[d]][:5]
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("update kb.chunks c set content = %s from kb.documents d"
                         " where d.doc_id = c.doc_id and d.title = %s", [" ".join(toks[victim]), victim])
        app_conn.execute("delete from kb.documents where title = any (%s)", [gone])
    for d in gone:
        del toks[d]
    _assert_block_invariant(app_conn, tenant, toks)
    _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries)
    for i in range(40):  # long: the average length grows by 3/4
        words = [vocab[-1 - (i % 50)]] * 200 + [listed[i % len(listed)]]  # (tsvector keeps <= 256 positions)
        toks[f"l{i:03d}"] = words
        insert_doc(app_conn, tenant, f"l{i:03d}", [" ".join(words)], [basis(200 + i)])
    _assert_block_invariant(app_conn, tenant, toks)
    _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries, ks=(5, 20, 29))
    # a rebuild takes the new chunks in; level 0 holds the best tf parts
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("select kb.refresh_term_blocks(30, 40)")
    rebuilt = _assert_block_invariant(app_conn, tenant, toks)
    for w in listed:
        assert rebuilt[w][0][1] & new_ids and len(rebuilt[w][0][1]) == 30
    # blocks built for other BM25 parameters serve those (and only those)
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("select kb.refresh_term_blocks(8, 20, 0.9, 0.4)")
    assert {lv[0][3:5] for lv in _assert_block_invariant(app_conn, tenant, toks).values()} == {(0.9, 0.4)}
    _assert_lexical_equals_exhaustive_bm25(app_conn, tenant, toks, queries)


def test_tf_read_through_ts_rank_equals_the_number_of_positions(app_conn):
    """kb.search_lexical reads a term's frequency as width_bucket(ts_rank(...),
    kb.ts_rank_tf()) instead of unnesting the tsvector: for 0 to 256 positions (the most a
    lexeme keeps), any weights, lexemes stored without positions (tf 1) and tsvectors
    concatenated past 256 positions, it must equal the count of positions."""
    rows = app_conn.execute("""
        with v(tsv) as (
          select format('x:%s y:3', (select string_agg(p || (array['', 'A', 'B', 'C'])[1 + p % 4], ',')
                                     from generate_series(1, n) as p))::tsvector
          from generate_series(1, 256) as n
          union all select 'y:1 z'::tsvector
          union all select 'x:1,2 y'::tsvector || 'x y:5'::tsvector
          union all select 'x'::tsvector || 'y:2'::tsvector
          union all select to_tsvector('simple', repeat('x ', 300)) || to_tsvector('simple', repeat('x ', 300))
          union all select setweight(to_tsvector('simple', repeat('x y ', 40)), 'A')
        )
        select coalesce((select coalesce(array_length(u.positions, 1), 1) from unnest(v.tsv) as u
                         where u.lexeme = 'x'), 0),
               width_bucket(ts_rank('{1,1,1,1}', v.tsv, 'x'::tsquery, 0), kb.ts_rank_tf())
        from v""").fetchall()
    assert len(rows) == 261
    assert {r[0] for r in rows} == set(range(0, 257))
    assert all(unnested == ranked for unnested, ranked in rows), [r for r in rows if r[0] != r[1]]
    table = app_conn.execute("select kb.ts_rank_tf(), kb.ts_rank_tf_compute()").fetchone()
    assert table[0] == table[1] and len(table[0]) == 256


def test_lexical_search_recomputes_a_stale_tf_table(owner_conn, rrf_tenant):
    """kb.ts_rank_tf() is a constant written when the SQL files are applied. If it no longer
    matches the server's ts_rank (say, a server upgraded without re-running the migration),
    the search computes the table afresh instead of misreading every tf."""
    t, _ = rrf_tenant
    sql = "select doc_title, score from kb.search_lexical('apple banana dessert', 10)"
    with owner_conn.transaction():
        owner_conn.execute("set local role kb_app")
        owner_conn.execute("select set_config('auth.tenant_id', %s, true)", [str(t)])
        expected = owner_conn.execute(sql).fetchall()
    assert [r[0] for r in expected] == ["A", "B", "C"]
    with owner_conn.transaction(force_rollback=True):
        owner_conn.execute("create or replace function kb.ts_rank_tf() returns real[] language sql immutable"
                           " as 'select array(select x / 2 from unnest(kb.ts_rank_tf_compute()) as x)'")
        owner_conn.execute("set local role kb_app")
        owner_conn.execute("select set_config('auth.tenant_id', %s, true)", [str(t)])
        assert owner_conn.execute(sql).fetchall() == expected


def test_query_term_counts(app_conn):
    rows = app_conn.execute("select term, qtf from kb.query_term_counts(%s) order by term",
                            ["ERR_402 or err_402? Two-factor, two factor; Hóa hóa HOA"]).fetchall()
    # not English (diacritics): `or` stays; the code token counted whole, its parts not
    # searched; the hyphenated word as its parts, with every occurrence
    assert rows == [("err_402", 2), ("factor", 2), ("hoa", 1), ("hóa", 2), ("or", 1), ("two", 2)]
    split = app_conn.execute(QUERY_TERMS, ["internal /slip flow/ wind-tunnel api/v2 user_id"]).fetchone()[0]
    assert split == ["api/v2", "flow", "id", "internal", "slip", "tunnel", "user", "user_id", "wind"]
    english = app_conn.execute("select term, qtf from kb.query_term_counts(%s) order by term",
                               ["the cache of the cache and the CACHE"]).fetchall()
    assert english == [("cache", 3)]


# ---------------------------------------------------------------------------
# the stemmed field ('~ ' lexemes, kb.stem_tsv) beside the exact one


def test_english_query_finds_other_inflections_through_the_stemmed_field(app_conn, tenant):
    insert_doc(app_conn, tenant, "connected", ["The two servers were connected by a private link."], [basis(1)],
               language="en")
    insert_doc(app_conn, tenant, "unrelated", ["Invoices are sent on the first day of the month."], [basis(2)],
               language="en")
    with tenant_transaction(app_conn, tenant):
        hits = {q: [r.doc_title for r in run(app_conn, search.alexical, q, 10)]
                for q in ("connections", "How do I connect the server?", "linking servers")}
        exact_only = [r.doc_title for r in run(app_conn, search.alexical, "connexion", 10)]
    assert hits == {"connections": ["connected"], "How do I connect the server?": ["connected"],
                    "linking servers": ["connected"]}
    assert exact_only == []  # a different word, not an inflection


def test_stemmed_field_lexemes_and_length(app_conn):
    """Plain words of two characters or more, stop words left out, stemmed in an English or
    Vietnamese document (Vietnamese syllables are fixed points of the English stemmer), by the
    language's own Snowball stemmer in another (French: `connexions` -> `connex`);
    code tokens stay in the exact field only."""
    got = app_conn.execute(
        "select kb.stem_tsv(%(en)s, 'en')::text, kb.stem_length(kb.to_tsv(%(en)s) || kb.stem_tsv(%(en)s, 'en')),"
        " kb.stem_tsv(%(vi)s, 'vi')::text, kb.stem_tsv('les connexions', 'fr')::text",
        {"en": "The connected Connections: a SKU-7781 of iPhones", "vi": "nhiều người không ngày hóa"}).fetchone()
    # (the parser reads SKU-7781 as `sku` and the number `-7781`, not a plain word)
    assert got[0] == "'~ connect':2,3 '~ iphon':8 '~ sku':5"
    assert got[1] == 4  # connected, connections, sku, iphones: `the`, `a`, `of` are stop words
    assert got[2] == "'~ hoa':5 '~ khong':3 '~ ngay':4 '~ nguoi':2 '~ nhieu':1"
    assert got[3] == "'~ connex':2 '~ le':1"
    with_stems = app_conn.execute("select kb.to_tsv('SKU-7781') || kb.stem_tsv('SKU-7781', 'en')").fetchone()[0]
    assert "sku-7781" in with_stems and "~ sku-7781" not in with_stems


@pytest.mark.parametrize("query,expected", [
    # English (a word that cannot be a Vietnamese syllable): stemmed, stop words of both lists out
    ("What connections are in the boundary layers?", ["~ boundari", "~ connect", "~ layer"]),
    ("connections", ["~ connect"]),
    ("connect connected connecting", None),  # one stem, qtf 3: checked below
    # identifiers stay whole and exact in an English query
    ("ERR_402 invoices", ["err_402", "~ invoic"]),
    ("SKU-7781 v2.3.1 prices", ["sku-7781", "v2.3.1", "~ price"]),
    # Vietnamese with diacritics, or only syllable-shaped words: the exact field, as before
    ("hóa đơn điện tử", ["hóa", "tử", "điện", "đơn"]),
    ("hoa don dien tu", ["dien", "don", "hoa", "tu"]),
    ("hoa don the to no", ["don", "hoa", "no", "the", "to"]),
    # only stop words: the exact terms, so the query still finds something
    ("to be or not to be", ["be", "not", "or", "to"]),
])
def test_each_query_picks_its_field(app_conn, query, expected):
    terms = app_conn.execute(SEARCH_TERMS, [query]).fetchone()[0]
    if expected is None:
        assert app_conn.execute("select array_agg(array[term, qtf::text]) from kb.search_term_counts(%s)",
                                [query]).fetchone()[0] == [["~ connect", "3"]]
        return
    assert terms == expected
    if not any(t.startswith("~ ") for t in expected):  # not stemmed: searched exactly as before 0011
        assert terms == app_conn.execute(QUERY_TERMS, [query]).fetchone()[0]


def test_identifiers_stay_exact_in_english_queries(app_conn, tenant, embedder):
    """An English sentence around an identifier: the stemmed words may match the sibling pages
    (`means`), the identifier decides, and a sibling identifier never matches."""
    for title, text in ERROR_PAGES.items():
        insert_doc(app_conn, tenant, title, [text], embedder.embed_passages([f"{title}\n{text}"]), language="en")
    with tenant_transaction(app_conn, tenant):
        rows = run(app_conn, search.alexical, "What does the ERR_402 banner mean?", 20)
        sibling = run(app_conn, search.alexical, "ERR_409 conflicts", 20)
    assert rows[0].doc_title == "Subscription lapsed"
    assert "Error ERR_409" not in _titles(rows)
    assert {"Error ERR_401", "Error ERR_403"} <= set(_titles(rows))  # `means` ~ `mean`, below
    assert _titles(sibling)[0] == "Error ERR_409" and "Subscription lapsed" not in _titles(sibling)


def test_vietnamese_search_is_unchanged_by_the_stemmed_field(app_conn, tenant):
    """Vietnamese documents get a stemmed field too, but a Vietnamese query never reads it:
    its scores are BM25 over the exact lexemes and the exact length (doc_len) alone."""
    insert_doc(app_conn, tenant, "invoice", ["xuất hóa đơn điện tử cho khách hàng"], [basis(7)], language="vi")
    insert_doc(app_conn, tenant, "peace", ["hòa bình và hòa giải"], [basis(8)], language="vi")
    insert_doc(app_conn, tenant, "english", ["electronic invoices for customers"], [basis(9)], language="en")
    with tenant_transaction(app_conn, tenant):
        for query in ("hóa đơn điện tử", "hoa don", "hòa"):
            rows = run(app_conn, search.alexical, query, 10)
            terms = app_conn.execute(SEARCH_TERMS, [query]).fetchone()[0]
            assert terms == app_conn.execute(QUERY_TERMS, [query]).fetchone()[0]
            assert not any(t.startswith("~ ") for t in terms)
            n, avg = app_conn.execute("select n_chunks, total_len::float8 / n_chunks from kb.corpus_stats").fetchone()
            for r in rows:
                tsv, dl = app_conn.execute("select tsv, doc_len from kb.chunks where chunk_id = %s",
                                           [r.chunk_id]).fetchone()
                expected = 0.0
                for t in terms:
                    df = app_conn.execute("select df from kb.term_stats where term = %s", [t]).fetchone()
                    tf = app_conn.execute("select count(*) from unnest(%s::tsvector) u, unnest(u.positions) p"
                                          " where u.lexeme = %s", [tsv, t]).fetchone()[0]
                    if tf:
                        idf = math.log(1 + (n - df[0] + 0.5) / (df[0] + 0.5))
                        expected += idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * dl / avg))
                assert math.isclose(r.score, expected, rel_tol=1e-7), (query, r.doc_title)
        assert _titles(run(app_conn, search.alexical, "hóa đơn", 10)) == ["invoice"]
        assert _titles(run(app_conn, search.alexical, "hòa", 10)) == ["peace"]


def _stem_corpus(app_conn, tenant, seed=21):
    """An English corpus for the stemmed field: Zipf-distributed base words, each written with
    one of five endings (one stem, several forms), English stop words and single letters
    (in no stemmed lexeme, and in the exact length only), and code tokens (searched in the
    exact field). Returns (words per document title, base words, code tokens)."""
    import random

    rng = random.Random(seed)
    # consonant, consonant, vowel, two different consonants: `blart` (blarts, blarting,
    # blarted: one stem; blarter another)
    cons = "bcdfghklmnprstv"
    bases = sorted({rng.choice(cons) + rng.choice("lr") + rng.choice("aou") + "".join(rng.sample("dkmnprt", 2))
                    for _ in range(300)})
    weights = [1 / (i + 1) for i in range(len(bases))]
    codes = [f"zq_{i}" for i in range(1, 10)]  # (parts: `zq`, a word, and one digit, none)
    endings = ["", "s", "ing", "ed", "er"]
    docs = {}
    for i in range(360):
        words = [b + rng.choice(endings) for b in rng.choices(bases, weights, k=rng.randint(3, 40))]
        words += rng.choices(["the", "of", "which", "x", "q"], k=rng.randint(0, 12))
        if rng.random() < 0.3:
            words.append(rng.choice(codes))
        rng.shuffle(words)
        docs[f"d{i:03d}"] = words
    for i, b in enumerate(bases[10:40]):  # short, repetitive: must not be pruned away
        docs[f"s{i:03d}"] = [b + e for e in rng.choices(endings, k=rng.randint(2, 5))]
    for title, words in docs.items():
        insert_doc(app_conn, tenant, title, [" ".join(words)], [basis(len(title) % 384)], language="en")
    return docs, bases, codes


def test_pruned_bm25_top_k_equals_exhaustive_scoring_on_the_stemmed_field(app_conn, tenant):
    """The pruned search (block-max MaxScore over the term blocks) with stemmed terms, each normalised
    by the stemmed field's length, and code tokens, normalised by the exact one, in one
    query: its top k equals BM25 computed here over every document, with and without
    blocks."""
    docs, bases, codes = _stem_corpus(app_conn, tenant)
    vocab = sorted({w for ws in docs.values() for w in ws} | {b + e for b in bases for e in ("", "s", "ing", "ed", "er")})
    stem = dict(app_conn.execute("select w, (ts_lexize('english_stem', w))[1] from unnest(%s::text[]) as w",
                                 [vocab]).fetchall())
    assert all(len({stem[b + e] for e in ("", "s", "ing", "ed")}) == 1 for b in bases)  # one stem
    stop = {"the", "of", "which"}
    with tenant_transaction(app_conn, tenant):
        lens = {t: (dl, sl) for t, dl, sl in app_conn.execute(
            "select d.title, c.doc_len, c.stem_len from kb.chunks c join kb.documents d using (doc_id)")}
    fields = {}
    for title, words in docs.items():
        stems = Counter("~ " + stem[w] for w in words if len(w) >= 2 and w not in stop and w not in codes)
        stems.update("~ zq" for w in words if w in codes)  # the code token's letters, as a word
        fields[title] = stems + Counter(w for w in words if w in codes)
        # (+ 1 in each field: the title, one word that no query holds, indexed with the content: 0017)
        assert lens[title] == (1 + len(words) + sum(w in codes for w in words), 1 + sum(stems.values())), title
    n = len(docs)
    avg = {False: sum(d for d, _ in lens.values()) / n, True: sum(s for _, s in lens.values()) / n}
    df = Counter(t for f in fields.values() for t in f)

    def bm25(terms, d):
        s = 0.0
        for t, qtf in Counter(terms).items():
            tf = min(fields[d][t], 1) if t in codes else fields[d][t]  # a code token counts once
            if tf:
                stemmed = t.startswith("~ ")
                idf = math.log(1 + (n - df[t] + 0.5) / (df[t] + 0.5))
                s += qtf * idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * lens[d][stemmed] / avg[stemmed]))
        return s

    import random

    rng = random.Random(22)
    by_df = sorted(bases, key=lambda b: -df["~ " + stem[b]])
    queries = [[by_df[0] + "s", by_df[-1] + "ing"], by_df[:4], [by_df[1] + "ed", codes[0]], [by_df[0], by_df[0] + "er"],
               [codes[3], codes[5], by_df[2]], ["the", by_df[30], "of", by_df[0]]]
    queries += [[b + rng.choice(["", "s", "ing", "ed", "er"]) for b in rng.sample(by_df[:60], rng.randint(1, 5))]
                + rng.sample(codes, rng.randint(0, 2)) for _ in range(25)]
    queries += [[m + "s", r] for m, r in zip(bases[10:40], rng.sample(by_df[60:200], 30))]

    def check(ks=(5, 20)):
        for words, k in itertools.product(queries, ks):
            q = " ".join(words)
            terms = ["~ " + stem[w] if w not in codes else w for w in words if w not in stop]
            with tenant_transaction(app_conn, tenant):
                assert sorted(set(terms)) == app_conn.execute(SEARCH_TERMS, [q]).fetchone()[0]
                rows = run(app_conn, search.alexical, q, k)
            expected = sorted(((round(bm25(terms, d), 9), d) for d in docs), key=lambda x: (-x[0], x[1]))
            expected = [e for e in expected if e[0] > 0][:k]
            got = [(r.score, r.doc_title) for r in rows]
            assert len(got) == len(expected), words
            for (gs, gd), (es, ed) in zip(got, expected):
                assert math.isclose(gs, es, rel_tol=1e-7, abs_tol=1e-8), (words, k, got, expected)
                assert gd == ed or math.isclose(bm25(terms, gd), es, rel_tol=1e-7), (words, k, gd, ed)

    check()
    with tenant_transaction(app_conn, tenant):
        n_lists = app_conn.execute("select kb.refresh_term_blocks(20, 30)").fetchone()[0]
        listed = {t for (t,) in app_conn.execute("select term from kb.term_blocks")}
    assert n_lists >= 5 and any(t.startswith("~ ") for t in listed)
    check()


def test_hybrid_scores_its_lexical_list_with_the_given_bm25_parameters(app_conn, rrf_tenant):
    """kb.search_hybrid takes KB_BM25_K1 / KB_BM25_B as lexical_only does: its lexical scores are kb.search_lexical's at the same k1 and b, and the service passes
    the settings' values to both (Settings.fusion)."""
    from kb_rerank.core.settings import Settings

    t, _ = rrf_tenant
    with tenant_transaction(app_conn, t):
        for k1, b in ((1.2, 0.75), (2.0, 0.2), (0.5, 1.0)):
            lex = {r.doc_title: r.score for r in run(app_conn, search.alexical, "apple banana", 2, k1=k1, b=b)}
            hyb = {r.doc_title: r.lexical_score for r in run(app_conn, search.ahybrid, "apple banana", basis(0), k=2,
                                                                         k1=k1, b=b) if r.lexical_rank}
            assert hyb == pytest.approx(lex, rel=1e-9)
        default = {r.doc_title: r.lexical_score for r in run(app_conn, search.ahybrid, "apple banana", basis(0), k=2)
                   if r.lexical_rank}
        other = {r.doc_title: r.lexical_score for r in run(app_conn, search.ahybrid, "apple banana", basis(0), k=2,
                                                                       k1=2.0, b=0.2) if r.lexical_rank}
    assert default != pytest.approx(other)  # the parameters reach the scoring
    s = Settings(bm25_k1=1.7, bm25_b=0.4)
    assert (s.fusion["k1"], s.fusion["b"]) == (1.7, 0.4)
