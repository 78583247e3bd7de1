"""BM25 statistics per language: a query in a language the tenant holds is weighed with the
statistics of that language's chunks (kb.corpus_language_stats, kb.term_language_stats), as in
a tenant of that language alone; a term only other languages' chunks hold keeps the tenant's.
Through the real migrations, as the app role."""

from __future__ import annotations

import math
import uuid

from kb_rerank.core.session import run, tenant_transaction
from kb_rerank.retrieval import store as search

from tests.helpers import basis, insert_doc

ENGLISH = [
    "The boundary layer of a flat plate grows along the flow direction.",
    "Heat transfer in supersonic flow depends on the wall temperature and the island.",
    "Wind tunnel tests measured the pressure distribution on the wing of the aircraft.",
    "The library catalogue lists every book by author, subject and year of the island history.",
    "Error E-117 appears when the fuser unit overheats; switch the printer off.",
]

GREEK = [
    "Η Αθήνα είναι η πρωτεύουσα της Ελλάδας και η μεγαλύτερη πόλη της χώρας.",
    "Το νησί της Κρήτης είναι το μεγαλύτερο νησί της Ελλάδας και έχει μακρά ιστορία.",
    "Ο Παρθενώνας χτίστηκε στην Ακρόπολη της Αθήνας τον πέμπτο αιώνα.",
    "Η Θεσσαλονίκη είναι η δεύτερη μεγαλύτερη πόλη της Ελλάδας, στο βόρειο τμήμα της χώρας.",
    "Το νησί της Ρόδου έχει πολλά μεσαιωνικά κάστρα και μεγάλη ιστορία.",
    "Η βιβλιοθήκη της πόλης έχει παλιά βιβλία για την ιστορία του νησιού.",
]

QUERIES = ["Ποιο είναι το μεγαλύτερο νησί της Ελλάδας;", "Πότε χτίστηκε ο Παρθενώνας στην Αθήνα;",
           "Ποια πόλη είναι η πρωτεύουσα της χώρας;"]


def _load(app_conn, tenant, english_copies: int, greek: list[str] = GREEK) -> None:
    i = 0
    for rep in range(english_copies):
        for text in ENGLISH:
            insert_doc(app_conn, tenant, f"en-{i}", [text], [basis(i % 300)], language="en")
            i += 1
    for j, text in enumerate(greek):
        insert_doc(app_conn, tenant, f"el-{j}", [text], [basis(j)], language="el")


def _scores(app_conn, tenant, query: str, language: str | None = "el", k: int = 20) -> dict[str, float]:
    with tenant_transaction(app_conn, tenant):
        return {c.doc_title: c.score for c in run(app_conn, search.alexical, query, k, language=language)}


def _recount(app_conn, tenant) -> tuple[set, set]:
    """The per-language statistics recomputed from the tenant's chunks, and as stored."""
    with tenant_transaction(app_conn, tenant):
        want_c = set(app_conn.execute(
            "select kb.tsv_language(tsv), count(*), sum(doc_len), sum(stem_len) from kb.chunks"
            " where kb.tsv_language(tsv) is not null group by 1"))
        got_c = set(app_conn.execute(
            "select language, n_chunks, total_len, stem_total_len from kb.corpus_language_stats"))
        want_t = set(app_conn.execute(
            "select kb.tsv_language(tsv), l, count(*) from kb.chunks cross join unnest(tsvector_to_array(tsv)) as l"
            " where kb.tsv_language(tsv) is not null group by 1, 2"))
        got_t = set(app_conn.execute("select language, term, df from kb.term_language_stats"))
    return (want_c, want_t), (got_c, got_t)


def test_a_minority_language_query_scores_as_in_a_tenant_of_its_own(app_conn):
    """Six Greek pages beside 40 English ones: a Greek question (language named) gives each
    Greek page the score it has in a tenant of the Greek pages alone (N, df and avglen of the
    Greek chunks), and another tenant's Greek pages count in neither. Without the language and
    with two languages analysing it (the tenant statistics) the scores differ, so the
    comparison can fail."""
    mixed, alone, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    _load(app_conn, mixed, 8)
    _load(app_conn, alone, 0)
    # another tenant: many Greek pages holding the query's words
    _load(app_conn, other, 0, GREEK * 5 + ["νησί νησί νησί Ελλάδας πόλη"] * 10)
    with tenant_transaction(app_conn, mixed):
        el = app_conn.execute("select n_chunks from kb.corpus_language_stats where language = 'el'").fetchone()
        assert el == (len(GREEK),)
        assert app_conn.execute("select count(*) from kb.corpus_language_stats").fetchone()[0] == 2
    for q in QUERIES:
        own = _scores(app_conn, alone, q)
        got = _scores(app_conn, mixed, q)
        assert own, q
        assert set(got) == set(own), (q, got, own)
        for title, score in own.items():
            assert math.isclose(got[title], score, rel_tol=1e-9), (q, title, got[title], score)
    # named English (a language the tenant holds), the Greek words are still analysed in Greek
    # but weighed with the tenant's statistics (they are in no English chunk): other scores
    q = QUERIES[0]
    own, tenant_stats = _scores(app_conn, alone, q), _scores(app_conn, mixed, q, language="en")
    assert set(tenant_stats) == set(own)
    assert all(not math.isclose(tenant_stats[t], own[t], rel_tol=1e-3) for t in own)
    # undetected, the query's one analysis language (Greek, its script) is the statistics'
    assert _scores(app_conn, mixed, q, language=None) == _scores(app_conn, mixed, q)
    assert _recount(app_conn, mixed)[0] == _recount(app_conn, mixed)[1]


def test_the_blocks_bound_the_language_statistics(app_conn):
    """With term blocks built (on the tenant's statistics), the search weighed with the Greek
    statistics returns the exhaustive top k: the bounds widen by the Greek average length."""
    mixed = uuid.uuid4()
    _load(app_conn, mixed, 6, GREEK * 4)
    exhaustive = {q: _scores(app_conn, mixed, q, k=3) for q in QUERIES}  # no blocks yet
    with tenant_transaction(app_conn, mixed):
        assert app_conn.execute("select kb.refresh_term_blocks(1, 2)").fetchone()[0] > 0
        assert app_conn.execute("select count(*) from kb.term_blocks where term like '~ %'").fetchone()[0] > 0
    for q in QUERIES:
        after = _scores(app_conn, mixed, q, k=3)
        assert exhaustive[q].keys() == after.keys(), (q, exhaustive[q], after)
        for title, score in exhaustive[q].items():
            assert math.isclose(after[title], score, rel_tol=1e-9)


def test_an_identifier_keeps_the_tenant_statistics_across_languages(app_conn, tenant):
    """A Greek question naming an error code only English pages hold finds that page, its code
    weighed by the tenant's statistics (hand-computed BM25), its Greek words by the Greek ones."""
    _load(app_conn, tenant, 4)
    q = "Τι σημαίνει το σφάλμα E-117;"
    got = _scores(app_conn, tenant, q)
    with tenant_transaction(app_conn, tenant):
        n, total = app_conn.execute("select n_chunks, total_len from kb.corpus_stats").fetchone()
        df = app_conn.execute("select df from kb.term_stats where term = 'e-117'").fetchone()[0]
        assert app_conn.execute("select count(*) from kb.term_language_stats"
                                " where language = 'el' and term = 'e-117'").fetchone()[0] == 0
        lens = dict(app_conn.execute("select d.title, c.doc_len from kb.chunks c join kb.documents d using (doc_id)"
                                     " where c.tsv @@ 'e-117'::tsquery"))
    assert len(lens) == 4 and set(lens) <= set(got)
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    for title, length in lens.items():
        want = idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 * length / (total / n)))
        assert math.isclose(got[title], want, rel_tol=1e-7), (title, got[title], want)


def test_the_language_statistics_stay_exact_under_update_and_delete(app_conn, tenant):
    """Pages rewritten, moved to another language and deleted: the per-language statistics equal
    a recount from the chunks after each step, and a language with no chunk left has no row."""
    _load(app_conn, tenant, 2)
    assert _recount(app_conn, tenant)[0] == _recount(app_conn, tenant)[1]
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("update kb.chunks set content = content || ' Ακρόπολη Ακρόπολη'"
                         " where doc_id in (select doc_id from kb.documents where title like 'el-%')")
        app_conn.execute("update kb.documents set language = 'de' where title = 'en-0'")
        app_conn.execute("delete from kb.documents where title in ('el-0', 'el-1')")
    want, got = _recount(app_conn, tenant)
    assert want == got
    assert ("de", 1) in {(c[0], c[1]) for c in got[0]}
    with tenant_transaction(app_conn, tenant):
        app_conn.execute("delete from kb.documents where title like 'el-%'")
        assert app_conn.execute("select count(*) from kb.corpus_language_stats where language = 'el'").fetchone()[0] == 0
        assert app_conn.execute("select count(*) from kb.term_language_stats where language = 'el'").fetchone()[0] == 0
    want, got = _recount(app_conn, tenant)
    assert want == got


def test_another_tenants_language_statistics_are_invisible(app_conn):
    """The app role reads only its own tenant's rows, and none with no tenant set."""
    a, b = uuid.uuid4(), uuid.uuid4()
    _load(app_conn, a, 1)
    _load(app_conn, b, 0, GREEK[:2])
    with tenant_transaction(app_conn, a):
        assert {t for t, in app_conn.execute("select distinct tenant_id from kb.term_language_stats")} == {a}
        assert {t for t, in app_conn.execute("select tenant_id from kb.corpus_language_stats")} == {a}
    with app_conn.transaction():
        assert app_conn.execute("select count(*) from kb.corpus_language_stats").fetchone()[0] == 0
        assert app_conn.execute("select count(*) from kb.term_language_stats").fetchone()[0] == 0


# A Turkish page set and English pages sharing stems with it ('~ super', '~ rotor', '~ 50'),
# one English page holding an error code a Turkish question names.
TURKISH = [
    "Süper Bowl 50 maçında Denver Broncos takımı otuz dört puan aldı.",
    "Rotor kanatları helikopterin üstünde döner ve kaldırma kuvveti üretir.",
    "İstanbul Türkiye'nin en büyük şehridir ve iki kıtaya yayılır.",
    "Ankara Türkiye'nin başkentidir ve orta Anadolu'da yer alır.",
]
SHARED = [
    "The super rotor of the test rig turned at 50 cycles per second.",
    "A super rotor with 50 blades was tested in the super wind tunnel.",
    "Printer error E-117 means the fuser overheated; the rotor stopped.",
]


def _load_turkish(app_conn, tenant, english_copies: int) -> None:
    i = 0
    for rep in range(english_copies):
        for text in SHARED:
            insert_doc(app_conn, tenant, f"en-{i}", [text], [basis(i % 300)], language="en")
            i += 1
    for j, text in enumerate(TURKISH):
        insert_doc(app_conn, tenant, f"tr-{j}", [text], [basis(j)], language="tr")


def test_a_stem_of_the_query_language_matches_only_chunks_of_that_language(app_conn, tenant):
    """A Turkish question (language named) whose stems English pages share ('~ super',
    '~ rotor', '~ 50') finds only the Turkish pages through them, as a Turkish field would;
    the error code E-117, kept whole, still finds the English page; the same words as an
    English question (or with no statistics language) still match the English pages."""
    _load_turkish(app_conn, tenant, 2)
    with tenant_transaction(app_conn, tenant):
        terms = {t for t, _ in app_conn.execute("select * from kb.search_term_counts(%s, '{tr}')",
                                               ["Süper rotor 50"])}
        assert {"~ super", "~ rotor", "~ 50"} <= terms
    got = _scores(app_conn, tenant, "Süper Bowl 50 rotor kanatları", language="tr")
    assert {"tr-0", "tr-1"} <= set(got)
    assert not any(t.startswith("en-") for t in got), got
    en = _scores(app_conn, tenant, "super rotor 50", language="en")
    assert {f"en-{i}" for i in range(6)} <= set(en)
    assert not any(t.startswith("tr-") for t in en), en
    code = _scores(app_conn, tenant, "E-117 hatası ne anlama gelir?", language="tr")
    assert {"en-2", "en-5"} <= set(code), code
    # a chunk of no known language counts for every language
    insert_doc(app_conn, tenant, "none-0", ["Super rotor notes."], [basis(7)], language=None)
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select count(*) from kb.chunks c join kb.documents d using (doc_id)"
                                " where d.title = 'none-0' and kb.tsv_language(c.tsv) is null").fetchone()[0] == 1
    assert "none-0" in _scores(app_conn, tenant, "Süper rotor", language="tr")


def test_the_language_restriction_is_exact_under_the_blocks(app_conn):
    """Term blocks built over every language's postings (many English chunks holding the
    shared stems): the Turkish question's top k through the blocks equals the exhaustive one
    (no blocks), and each score equals the hand-computed BM25 over the Turkish pages alone."""
    mixed = uuid.uuid4()
    _load_turkish(app_conn, mixed, 40)
    queries = ["Süper Bowl 50 rotor kanatları", "Rotor 50 süper", "Türkiye'nin başkenti süper rotor"]
    exhaustive = {q: _scores(app_conn, mixed, q, language="tr", k=3) for q in queries}
    with tenant_transaction(app_conn, mixed):
        assert app_conn.execute("select kb.refresh_term_blocks(1, 2)").fetchone()[0] > 0
        assert app_conn.execute("select count(*) from kb.term_blocks where term = '~ rotor'").fetchone()[0] > 0
    for q in queries:
        after = _scores(app_conn, mixed, q, language="tr", k=3)
        assert exhaustive[q] and exhaustive[q].keys() == after.keys(), (q, exhaustive[q], after)
        assert all(t.startswith("tr-") for t in after), (q, after)
        for title, score in exhaustive[q].items():
            assert math.isclose(after[title], score, rel_tol=1e-9)
    # the hand-computed BM25 of the one-term question '~ rotor' over the Turkish chunks
    with tenant_transaction(app_conn, mixed):
        n, stem_total = app_conn.execute("select n_chunks, stem_total_len from kb.corpus_language_stats"
                                         " where language = 'tr'").fetchone()
        df = app_conn.execute("select df from kb.term_language_stats where language = 'tr'"
                              " and term = '~ rotor'").fetchone()[0]
        lens = dict(app_conn.execute("select d.title, c.stem_len from kb.chunks c join kb.documents d using (doc_id)"
                                     " where c.tsv @@ '''~ rotor'''::tsquery and d.language = 'tr'"))
    got = _scores(app_conn, mixed, "rotor", language="tr")
    assert set(got) == set(lens) == {"tr-1"}
    idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
    want = idf * 2.2 / (1 + 1.2 * (0.25 + 0.75 * lens["tr-1"] / (stem_total / n)))
    assert math.isclose(got["tr-1"], want, rel_tol=1e-7), (got, want)


def test_another_languages_chunk_counts_for_the_identifier_alone(app_conn, tenant):
    """An English page holding both a stem of a Turkish question ('~ rotor') and its error
    code (E-117) scores the error code alone: the same score as for the question without
    the stem; a Turkish page holding the stem still counts it."""
    _load_turkish(app_conn, tenant, 2)
    both = _scores(app_conn, tenant, "E-117 rotor", language="tr")
    code = _scores(app_conn, tenant, "E-117", language="tr")
    assert {"en-2", "en-5", "tr-1"} <= set(both), both
    assert not {"en-0", "en-1", "en-3", "en-4"} & set(both), both
    for title in ("en-2", "en-5"):
        assert math.isclose(both[title], code[title], rel_tol=1e-9), (title, both, code)
    # as an English question, the stem counts in the English pages
    en = _scores(app_conn, tenant, "E-117 rotor", language="en")
    assert {f"en-{i}" for i in range(6)} <= set(en) and "tr-1" not in en, en


def test_a_stem_of_another_script_counts_in_the_languages_that_analysed_it(app_conn, tenant):
    """A Greek question's Latin words ('Super Bowl', analysed as English: the tenant's Latin
    language) find the Greek and English pages holding them, not a Turkish page (a third
    language, under a tenth of the English chunks) holding the same words."""
    i = 0
    for rep in range(20):
        for text in ENGLISH:
            insert_doc(app_conn, tenant, f"en-{i}", [text], [basis(i % 300)], language="en")
            i += 1
    insert_doc(app_conn, tenant, "en-bowl", ["The Super Bowl final was played in February."], [basis(1)],
               language="en")
    for j, text in enumerate(GREEK):
        insert_doc(app_conn, tenant, f"el-{j}", [text], [basis(j)], language="el")
    insert_doc(app_conn, tenant, "el-bowl", ["Ο τελικός του Super Bowl έγινε τον Φεβρουάριο στην Αμερική."],
               [basis(2)], language="el")
    insert_doc(app_conn, tenant, "tr-bowl", ["Super Bowl finali şubat ayında Amerika'da oynandı."], [basis(3)],
               language="tr")
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select kb.query_languages('Ποιος κέρδισε το Super Bowl;', kb.current_tenant(),"
                                " 'el')").fetchone()[0] == ["el", "en"]
    got = _scores(app_conn, tenant, "Ποιος κέρδισε το Super Bowl;", language="el")
    assert {"el-bowl", "en-bowl"} <= set(got) and "tr-bowl" not in got, got
    # the same words in a Turkish question count in the Turkish page alone
    tr = _scores(app_conn, tenant, "Super Bowl kim kazandı?", language="tr")
    assert "tr-bowl" in tr and not {"el-bowl", "en-bowl"} & set(tr), tr
    # with no language detected, every chunk holding them
    none = _scores(app_conn, tenant, "Super Bowl", language=None)
    assert {"el-bowl", "en-bowl", "tr-bowl"} <= set(none), none
