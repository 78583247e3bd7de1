"""Mixed-language knowledge bases: a query is analysed in its own language (detected by the
service, or named by the caller over REST and in SQL), and a word analysed in more than one
language counts once (kb.search_term_groups: its forms are one group, scored by the best).
Through the real migrations, as the app role."""

from __future__ import annotations

import math
import re
import uuid

import httpx
import pytest

from kb_rerank.app import create_app
from kb_rerank.core.language import detect_query_language
from kb_rerank.retrieval import store as search
from kb_rerank.core.session import run, tenant_transaction

from tests.helpers import basis, insert_doc
from tests.live_server import OPS_TOKEN, SECRET, FakeReranker, bearer, serve_in_thread

ENGLISH = [
    "The boundary layer of a flat plate grows along the flow direction.",
    "Heat transfer in supersonic flow depends on the wall temperature.",
    "Wind tunnel tests measured the pressure distribution on the wing.",
    "The library catalogue lists every book by author and subject.",
    "Printers in the office are serviced every month by the vendor.",
    "Cities grow along rivers where trade and transport meet.",
]


def _english_tenant(app_conn, tenant, others):
    """A tenant of English pages (8 of each text above) and one page of each other language."""
    i = 0
    for rep in range(8):
        for text in ENGLISH:
            insert_doc(app_conn, tenant, f"en-{i}", [text], [basis(i % 300)], language="en")
            i += 1
    for title, (language, text) in others.items():
        insert_doc(app_conn, tenant, title, [text], [basis(i % 300)], language=language)
        i += 1


OTHERS = {
    "de-houses": ("de", "Die alten Häuser der Stadt stehen am Fluss und wurden im Mittelalter gebaut."),
    "ru-books": ("ru", "В городской библиотеке хранятся старые книги и рукописи."),
    "ja-library": ("ja", "東京の図書館には古い本がたくさんあります。"),
}

# (query, its language, a term its analysis must hold, the page it must find first)
QUERIES = [
    ("Wann wurden die alten Häuser am Fluss gebaut?", "de", "~ haus", "de-houses"),
    ("Какие книги хранятся в библиотеке?", "ru", "~ книг", "ru-books"),
    ("東京の図書館にはどんな本がありますか", "ja", "~ 図書", "ja-library"),
]


@pytest.mark.parametrize("query, language, term, first", QUERIES, ids=[q[1] for q in QUERIES])
def test_a_query_is_analysed_in_its_own_language_in_an_english_tenant(app_conn, tenant, query, language, term,
                                                                        first):
    """German, Russian and Japanese questions in a tenant of 48 English pages and one page of
    each: the query's language is detected, its words are analysed in it whatever its share
    of the tenant, and its page ranks first."""
    _english_tenant(app_conn, tenant, OTHERS)
    assert detect_query_language(query) == language
    with tenant_transaction(app_conn, tenant):
        langs = app_conn.execute("select kb.query_languages(%s, kb.current_tenant(), %s)", [query, language]).fetchone()[0]
        terms = [t for t, in app_conn.execute(
            "select term from kb.search_term_groups(%s, kb.query_languages(%s, kb.current_tenant(), %s))",
            [query, query, language])]
        got = [c.doc_title for c in run(app_conn, search.alexical, query, 5, language=detect_query_language(query))]
    assert langs == ([language] if language != "ja" else [])  # Japanese: n-grams, no stemmer
    assert term in terms, terms
    assert got[0] == first, got
    if language == "de":
        # without the query's language, the tenant's main language (English) analyses it
        with tenant_transaction(app_conn, tenant):
            assert app_conn.execute("select kb.query_languages(%s, kb.current_tenant())", [query]).fetchone()[0] == ["en"]
            assert "~ haus" not in [t for t, in app_conn.execute("select term from kb.search_term_counts(%s)", [query])]


def test_a_language_the_tenant_does_not_hold_leaves_the_tenant_languages(app_conn, tenant):
    _english_tenant(app_conn, tenant, {})
    with tenant_transaction(app_conn, tenant):
        q = "Wann wurden die alten Häuser am Fluss gebaut?"
        named, prior = app_conn.execute("select kb.query_languages(%s, kb.current_tenant(), 'de'),"
                                        " kb.query_languages(%s, kb.current_tenant())", [q, q]).fetchone()
    assert named == prior == []  # an English-only tenant: a query with diacritics is searched exact, as before


def test_a_word_analysed_twice_contributes_once(app_conn, tenant):
    """English and German pages in equal numbers: an undetermined query ('printer', too short
    to detect) is stemmed in both, `printer` -> '~ printer' (English) and '~ print' (German).
    A page holding both forms scores the better of the two, as BM25 computed here says, not
    their sum; `E-117` keeps its full weight."""
    pages = {"both": ("en", "The printer stopped printing after the update."),
             "printer": ("en", "A printer on the second floor."),
             "e117": ("en", "Error E-117 appears when the fuser overheats."),
             "de-1": ("de", "Der Drucker im Büro druckt langsam."),
             "de-2": ("de", "Die Anleitung beschreibt den Druckkopf.")}
    for i, (title, (language, text)) in enumerate(pages.items()):
        insert_doc(app_conn, tenant, title, [text], [basis(i)], language=language)
    q = "printer E-117"
    assert detect_query_language(q) is None
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select kb.query_languages(%s, kb.current_tenant())", [q]).fetchone()[0] == ["de", "en"]
        groups = {tuple(sorted(f)): n for f, n in app_conn.execute(
            "select array_agg(term), min(qtf) from kb.search_term_groups(%s, '{de,en}') group by grp", [q])}
        n, stem_total, total = app_conn.execute(
            "select n_chunks, stem_total_len, total_len from kb.corpus_stats").fetchone()
        rows = app_conn.execute("select d.title, c.doc_len, c.stem_len, c.tsv::text from kb.chunks c"
                                " join kb.documents d using (doc_id)").fetchall()
        df = dict(app_conn.execute("select term, df from kb.term_stats where term in ('~ printer', '~ print', 'e-117')"))
        got = {c.doc_title: c.score for c in run(app_conn, search.alexical, q, 10)}
    assert groups == {("~ print", "~ printer"): 1, ("e-117",): 1}

    def part(term, tf, length, avg):
        idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
        return idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * length / avg))

    def tf(tsv, term):  # positions of the term in the tsvector's text (the title's words count too)
        m = re.search(re.escape(f"'{term}'") + r"(?::([0-9,]+))?", tsv)  # a code token may have none
        return 0 if not m else len(m.group(1).split(",")) if m.group(1) else 1

    expected = {}
    for title, doc_len, stem_len, tsv in rows:
        best = max([part(t, tf(tsv, t), stem_len, stem_total / n) for t in ("~ printer", "~ print") if tf(tsv, t)],
                   default=0.0)
        code = part("e-117", tf(tsv, "e-117"), doc_len, total / n) if tf(tsv, "e-117") else 0.0
        if best + code:
            expected[title] = best + code
    # the page with both forms ('printer', 'printing' -> '~ print'): the best form, not the sum
    assert "'~ print'" in dict((r[0], r[3]) for r in rows)["both"]
    assert set(got) == set(expected)
    for title, score in expected.items():
        assert math.isclose(got[title], score, rel_tol=1e-7), (title, got[title], score)


HELP = {
    # the exact error code, in English and German
    "en-e117": ("en", "E-117 on the display: the fuser unit is overheating. Switch the printer off and let it cool."),
    "de-e117": ("de", "Fehler E-117: Die Fixiereinheit ist überhitzt. Gerät ausschalten und abkühlen lassen."),
    # common words, many times
    "en-secure-print": ("en", "Secure print: the printer holds each print job until you enter your PIN; the"
                              " display says Ready."),
    "en-wifi": ("en", "Wi-Fi note: when the printer says it cannot find the network, print the network report."),
    "en-toner": ("en", "When the printer says Toner Low, open the front cover and replace the cartridge."),
    "en-paper": ("en", "If the printer says Paper Jam, open tray 2 and remove the sheet."),
    "en-driver": ("en", "Installing the printer driver: the installer says when the printer is found."),
    "en-scan": ("en", "Scanning to email: the printer says Sent once the message has left."),
    "de-drucker": ("de", "Der Drucker sagt Bereit, wenn der Druckauftrag angenommen wurde; drucken Sie erneut."),
    "de-papier": ("de", "Papierstau: Öffnen Sie die Klappe und entfernen Sie das Papier vorsichtig."),
    "de-toner": ("de", "Tonerkartusche wechseln: vordere Abdeckung öffnen und die Kartusche herausziehen."),
    "de-wlan": ("de", "WLAN einrichten: Der Drucker sagt, welche Netzwerke er sieht."),
    "ja-e117": ("ja", "エラー:定着ユニットが過熱しています。電源を切って冷ましてください。"),
    "ja-paper": ("ja", "用紙詰まり:カバーを開けて用紙を取り除いてください。"),
    "zh-e117": ("zh", "错误:定影单元过热。请关闭设备并等待冷却。"),
    "zh-toner": ("zh", "更换碳粉盒:打开前盖并取出碳粉盒。"),
}


def test_an_error_code_ranks_first_in_a_mixed_help_center(app_conn, tenant):
    """Sixteen help pages in English, German, Japanese and Chinese: "printer says E-117" finds an
    E-117 page first in the lexical list with the language detected (English), as the service
    searches; without it (the tenant's languages, English and German) each common word is one
    group."""
    for i, (title, (language, text)) in enumerate(HELP.items()):
        insert_doc(app_conn, tenant, title, [text], [basis(i)], language=language)
    q = "printer says E-117"
    assert detect_query_language(q) == "en"
    with tenant_transaction(app_conn, tenant):
        detected = [c.doc_title for c in run(app_conn, search.alexical, q, 5, language="en")]
        prior = [c.doc_title for c in run(app_conn, search.alexical, q, 5)]
    assert detected[0].endswith("e117"), (detected, prior)
    # without it, `printer` is also German '~ print', which the secure-print page holds three
    # times: one group, scored once, so the E-117 page stays in the top three
    assert "en-e117" in prior[:3], prior


@pytest.fixture
def server(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN), reranker=FakeReranker(),
                     embedder=embedder)
    with serve_in_thread(app) as base:
        with httpx.Client(base_url=base, timeout=60) as client:
            yield client


def test_the_language_named_over_rest_and_in_sql(app_conn, server):
    """`Häuser` alone is too short to detect, and the tenant's main language is English: it is
    stemmed as English and misses the German page. Named German, in the request body
    (`language`, normalised: 'German', 'de-AT') or as the SQL searches' `language`, it finds it.
    An unknown language is a 422 naming the field, on both routes, and changes nothing."""
    tenant = uuid.uuid4()
    _english_tenant(app_conn, tenant, {"de-houses": OTHERS["de-houses"]})
    q = "Häuser"
    assert detect_query_language(q) is None
    sql = {"lexical": "select d.title from kb.search_lexical(%s, 5, 1.2, 0.75, null, %s) s"
                      " join kb.documents d using (doc_id)",
           "hybrid": "select d.title from kb.search_hybrid(%s, %s::vector, 5, language => %s) s"
                     " join kb.documents d using (doc_id)"}
    vec = "[" + ",".join(["0.05"] * 384) + "]"
    with tenant_transaction(app_conn, tenant):
        assert "de-houses" not in [t for t, in app_conn.execute(sql["lexical"], [q, None])]
        assert [t for t, in app_conn.execute(sql["lexical"], [q, "de"])] == ["de-houses"]
        assert "de-houses" in [t for t, in app_conn.execute(sql["hybrid"], [q, vec, "de"])]
        hybrid_none = app_conn.execute("select count(*) from kb.search_hybrid(%s, %s::vector, 5) s"
                                       " where s.lexical_rank is not null", [q, vec]).fetchone()[0]
    assert hybrid_none == 0
    h = bearer(tenant)
    url = "/v1/kb/search/rerank"
    r = server.post(url, json={"query": q, "source": "lexical_only"}, headers=h)
    assert r.status_code == 200 and r.json()["results"] == [], r.text
    for name in ("German", "de-AT", "deu"):
        r = server.post(url, json={"query": q, "source": "lexical_only", "language": name}, headers=h)
        assert r.status_code == 200, r.text
        assert [x["doc_title"] for x in r.json()["results"]] == ["de-houses"], r.text
    r = server.post("/v1/kb/context", json={"query": q, "language": "de"}, headers=h)
    assert r.status_code == 200, r.text
    for route in (url, "/v1/kb/context"):
        for bad in ("klingon", "", 7, "x" * 100):
            r = server.post(route, json={"query": q, "language": bad}, headers=h)
            assert r.status_code == 422, (route, bad, r.text)
            assert r.json()["field"] == "language", r.text


def test_the_language_named_on_the_command_line(app_conn, settings, monkeypatch, capsys):
    """`kb-rerank search --language` names the query's language as the request's `language`
    does: `Häuser` (too short to detect) finds the German page only when named; an unknown
    language is a usage error naming it."""
    from kb_rerank.cli import main as cli

    tenant = uuid.uuid4()
    _english_tenant(app_conn, tenant, {"de-houses": OTHERS["de-houses"]})
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    base = ["search", "Häuser", "--tenant", str(tenant), "--mode", "lexical"]
    assert cli.main(base) == 0
    assert "de-houses" not in capsys.readouterr().out
    assert cli.main(base + ["--language", "German"]) == 0
    out = capsys.readouterr().out
    assert "1 results" in out and "de-houses" in out, out
    with pytest.raises(SystemExit) as exc:
        cli.main(base + ["--language", "klingon"])
    assert exc.value.code == 2
    assert "unknown language 'klingon'" in capsys.readouterr().err


# A weak guess (under MIN_QUERY_CONFIDENCE, from MIN_QUERY_GUESS up) is passed to the search only
# when the tenant's own languages for the query leave it out (RetrievalSpec.query_language):
# it may add a language the tenant holds, never narrow. Through RetrievalSpec, as the service.
TURKISH_Q = "Bazı toplum eczaneleri ne yapar?"  # the detector: Turkish at about 0.57
TURKISH_PAGE = ("tr", "Toplum eczaneleri reçeteli ilaçları hazırlar ve hastalara ilaçları hakkında danışmanlık verir.")
GERMAN_KEYWORDS = "Drucker Fehler E-117"  # the detector: English at about 0.37


def _spec(language=None):
    from kb_rerank.core.settings import Settings
    from kb_rerank.retrieval.spec import LEXICAL, RetrievalSpec

    return RetrievalSpec.of(Settings.from_env(), LEXICAL, candidates=10, language=language)


def _weak(q, language):
    """The detector's top guess for ``q`` is ``language``, weak (MIN_QUERY_GUESS to MIN_QUERY_CONFIDENCE)."""
    from kb_rerank.core.language import MIN_QUERY_CONFIDENCE, MIN_QUERY_GUESS, QueryGuess, _get_detector, _window, \
        guess_query_language

    score = float(_get_detector().detect(_window(q), model="lite", k=1)[0]["score"])
    assert MIN_QUERY_GUESS <= score < MIN_QUERY_CONFIDENCE, score
    assert detect_query_language(q) is None
    assert guess_query_language(q) == QueryGuess(language, False)


def test_a_weakly_guessed_language_the_tenant_holds_analyses_the_query(app_conn, tenant):
    """A Turkish question the detector guesses at under 0.7, in a tenant of 48 English pages
    and one Turkish page (2 % of the chunks): the tenant's languages ({en}) leave Turkish out,
    so the guess is passed, the query analysed in Turkish, and its page ranks first."""
    _english_tenant(app_conn, tenant, {"tr-pharmacies": TURKISH_PAGE})
    _weak(TURKISH_Q, "tr")
    spec = _spec()
    with tenant_transaction(app_conn, tenant):
        passed = run(app_conn, spec.query_language, TURKISH_Q)
        langs, prior = app_conn.execute("select kb.query_languages(%s, kb.current_tenant(), %s),"
                                        " kb.query_languages(%s, kb.current_tenant())",
                                        [TURKISH_Q, passed, TURKISH_Q]).fetchone()
        got = [c.doc_title for c in run(app_conn, spec.fetch, TURKISH_Q, None)]
    assert passed == "tr"
    assert prior == ["en"]  # without the guess: the tenant's main language
    assert langs == ["tr"]
    assert got[0] == "tr-pharmacies", got
    # a named language always wins over the guess
    with tenant_transaction(app_conn, tenant):
        assert run(app_conn, _spec("en").query_language, TURKISH_Q) == "en"
        assert app_conn.execute("select kb.query_languages(%s, kb.current_tenant(), 'en')",
                                [TURKISH_Q]).fetchone()[0] == ["en"]


def _same_as_undetermined(app_conn, tenant, q, passed):
    """The spec passes ``passed`` for ``q``'s weak guess, and the search answers as with no language at all."""
    spec = _spec()
    with tenant_transaction(app_conn, tenant):
        assert run(app_conn, spec.query_language, q) == passed
        langs, prior = app_conn.execute("select kb.query_languages(%s, kb.current_tenant(), %s),"
                                        " kb.query_languages(%s, kb.current_tenant())", [q, passed, q]).fetchone()
        got = [(c.doc_title, c.score) for c in run(app_conn, spec.fetch, q, None)]
        undetermined = [(c.doc_title, c.score) for c in run(app_conn, search.alexical, q, 10, language=None)]
    assert langs == prior
    assert got == undetermined
    return got


def test_a_weak_guess_the_tenant_does_not_hold_keeps_the_fallback(app_conn, tenant):
    """The same Turkish question in a tenant of English and German pages (no Turkish): the
    guess is passed (the tenant's languages leave it out) and changes nothing, the tenant's
    languages analyse it."""
    _english_tenant(app_conn, tenant, {"de-houses": OTHERS["de-houses"],
                                       "de-pharmacy": ("de", "Die Apotheke der Stadt verkauft Medikamente.")})
    insert_doc(app_conn, tenant, "en-toplum", ["Toplum is the name of the pharmacy chain in the old town."],
               [basis(298)], language="en")
    _weak(TURKISH_Q, "tr")
    got = _same_as_undetermined(app_conn, tenant, TURKISH_Q, "tr")
    assert got[0][0] == "en-toplum", got


def test_a_keyword_query_guessed_in_a_language_the_tenant_does_not_hold_changes_nothing(app_conn, tenant):
    """`reset password`: Hungarian at about 0.40, in a tenant of English pages and a German one."""
    _english_tenant(app_conn, tenant, {"de-houses": OTHERS["de-houses"]})
    insert_doc(app_conn, tenant, "en-reset", ["To reset your password, open the account settings."], [basis(299)],
               language="en")
    _weak("reset password", "hu")
    got = _same_as_undetermined(app_conn, tenant, "reset password", "hu")
    assert got[0][0] == "en-reset", got


HELP_PAGES = {
    "en-e117": ("en", "Printer error E-117 appears when the fuser overheats; let it cool down."),
    "en-paper": ("en", "Load paper in the tray and close the printer cover."),
    "en-wifi": ("en", "Connect the printer to the office Wi-Fi network."),
    "en-toner": ("en", "Replace the toner cartridge when the printout fades."),
    "de-e117": ("de", "Der Drucker meldet den Fehler E-117, wenn die Fixiereinheit überhitzt."),
    "de-papier": ("de", "Fehler beim Papiereinzug: das Papier im Fach des Druckers gerade einlegen."),
    "de-wlan": ("de", "Den Drucker mit dem WLAN im Büro verbinden."),
    "de-toner": ("de", "Die Tonerkartusche wechseln, wenn der Ausdruck blass wird."),
}


def _help_tenant(app_conn, tenant):
    """A user's help pages in English and German, four each."""
    for i, (title, (language, text)) in enumerate(HELP_PAGES.items()):
        insert_doc(app_conn, tenant, title, [text], [basis(i)], language=language)


def test_a_weak_guess_never_narrows_the_tenant_languages(app_conn, tenant):
    """A German keyword query the detector weakly calls English, in a tenant of English and
    German pages: the tenant's languages ({de,en}) already hold English, so nothing is passed
    and the rows are exactly those of no language; passing the guess would have analysed it in
    English only and cost the German pages their words."""
    _help_tenant(app_conn, tenant)
    _weak(GERMAN_KEYWORDS, "en")
    got = _same_as_undetermined(app_conn, tenant, GERMAN_KEYWORDS, None)
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select kb.query_languages(%s, kb.current_tenant())",
                                [GERMAN_KEYWORDS]).fetchone()[0] == ["de", "en"]
        narrowed = [(c.doc_title, c.score) for c in run(app_conn, search.alexical, GERMAN_KEYWORDS, 10,
                                                        language="en")]
    assert got[0][0] == "de-e117", got
    assert got != narrowed  # what the weak guess would have done, were it passed


@pytest.mark.parametrize("q, language", [(GERMAN_KEYWORDS, "en"),
                                         ("Ce făcea Tesla Electric Light & Manufacturing?", "en")],
                         ids=["de-keywords", "ro-question"])
def test_a_weak_guess_among_the_tenant_languages_passes_nothing(app_conn, tenant, q, language):
    """A weak guess the tenant's own languages for the query already hold is not passed; a
    sure guess of the same tenant is passed as it is."""
    _help_tenant(app_conn, tenant)
    insert_doc(app_conn, tenant, "ro-tesla", ["Compania Tesla Electric Light & Manufacturing instala iluminat."],
               [basis(20)], language="ro")
    _weak(q, language)
    sure = "Wie viele Punkte erzielten die Broncos im Super Bowl?"
    assert detect_query_language(sure) == "de"
    with tenant_transaction(app_conn, tenant):
        prior = app_conn.execute("select kb.query_languages(%s, kb.current_tenant())", [q]).fetchone()[0]
        assert language in prior
        assert run(app_conn, _spec().query_language, q) is None
        assert run(app_conn, _spec().query_language, sure) == "de"
