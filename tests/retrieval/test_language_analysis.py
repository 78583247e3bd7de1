"""Every language analysed (migration 0021, retrieval/sql/language.sql and
retrieval/sql/text_analysis.sql), through the real migrations as the app role.

Each analyser: a stemmed match in the language (an inflected query word finds the document),
identifiers kept whole in every language, Thai and CJK runs matched by their n-grams; the
query-language decision (kb.query_languages) with the tenant's documents as the prior; a
language set in SQL re-derives the chunks; and for every analyser, the pruned BM25 top k
equals BM25 computed here over every document, with and without term blocks."""

from __future__ import annotations

import itertools
import math
import random
import uuid
from collections import Counter

import pytest

from kb_rerank.retrieval import store as search
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.session import run

from tests.helpers import basis, insert_doc

SEARCH_TERMS = "select coalesce(array_agg(c.term order by c.term), '{}') from kb.search_term_counts(%s) as c"


def _titles(app_conn, tenant, query, k=20):
    with tenant_transaction(app_conn, tenant):
        return [r.doc_title for r in run(app_conn, search.alexical, query, k)]


# (language, document text, a query with another form of one of its words, that word's stem)
STEMMED = [
    ("ru", "Студенты читали новые книги в библиотеке", "книга", "~ книг"),
    ("tr", "Öğrenciler kütüphanede kitapları okudular", "kitap", "~ kitap"),
    ("el", "Οι μεγάλες χώρες της Ευρώπης", "χώρα", "~ χωρ"),
    ("de", "Die alten Häuser stehen am Fluss", "Haus", "~ haus"),
    ("fr", "Les bibliothèques municipales ferment tôt", "bibliothèque", "~ bibliothequ"),
    ("es", "Las bibliotecas públicas abren hoy", "biblioteca", "~ bibliotec"),
    ("ro", "Studenții citesc cărțile noi", "cartea", "~ cart"),
    ("hi", "भारत की भाषाओं का इतिहास", "भाषा", "~ भाष"),
    ("en", "The servers were connected yesterday", "connections", "~ connect"),
]


@pytest.mark.parametrize("language,text,query,stem", STEMMED, ids=[s[0] for s in STEMMED])
def test_an_inflected_query_word_finds_the_document_in_its_language(app_conn, tenant, language, text, query, stem):
    """The document's words are stemmed by its language's Snowball stemmer and the query's by
    the same one (the tenant's documents are in that language): another form of a word
    matches. A document of another tenant in the language changes nothing."""
    insert_doc(app_conn, tenant, "target", [text], [basis(1)], language=language)
    insert_doc(app_conn, tenant, "other", ["unrelated words about weather and rain"], [basis(2)], language="en")
    insert_doc(app_conn, uuid.uuid4(), "foreign", [text], [basis(3)], language=language)
    with tenant_transaction(app_conn, tenant):
        terms = app_conn.execute(SEARCH_TERMS, [query]).fetchone()[0]
        tsv = app_conn.execute("select c.tsv::text from kb.chunks c join kb.documents d using (doc_id)"
                               " where d.title = 'target'").fetchone()[0]
    assert stem in terms, terms
    assert f"'{stem}'" in tsv and f"'@language {language}'" in tsv
    assert _titles(app_conn, tenant, query) == ["target"]


@pytest.mark.parametrize("language,text", [
    ("ru", "Ошибка ERR_402 при оплате товара SKU-7781 в версии v2.3.1"),
    ("th", "ข้อผิดพลาดERR_402 เกิดขึ้นกับสินค้า SKU-7781 ในรุ่น v2.3.1"),
    ("zh", "支付时出现错误ERR_402，商品SKU-7781，版本v2.3.1"),
    ("ar", "خطأ ERR_402 عند الدفع للمنتج SKU-7781 في الإصدار v2.3.1"),
    ("tr", "Ödeme sırasında ERR_402 hatası, ürün SKU-7781, sürüm v2.3.1"),
    ("vi", "Lỗi ERR_402 khi thanh toán sản phẩm SKU-7781 phiên bản v2.3.1"),
])
def test_identifiers_are_matched_whole_in_every_language(app_conn, tenant, language, text):
    """ERR_402, SKU-7781 and v2.3.1 are searched whole (the exact field) whatever the
    document's language, and a neighbouring identifier (ERR_409) does not match."""
    insert_doc(app_conn, tenant, "target", [text], [basis(1)], language=language)
    insert_doc(app_conn, tenant, "other", ["ERR_409 SKU-7782 v2.3.2"], [basis(2)], language="en")
    for code in ("ERR_402", "SKU-7781", "v2.3.1"):
        with tenant_transaction(app_conn, tenant):
            assert code.lower() in app_conn.execute(SEARCH_TERMS, [code]).fetchone()[0]
        assert _titles(app_conn, tenant, code) == ["target"], code
    assert _titles(app_conn, tenant, "ERR_409") == ["other"]


@pytest.mark.parametrize("language,text,query", [
    ("th", "ประเทศไทยมีจังหวัดทั้งหมดเจ็ดสิบหกจังหวัด", "จังหวัด"),
    ("th", "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย", "เมืองหลวง"),
    ("zh", "我们在项目中使用全文检索技术来查找文档", "全文检索"),
    ("ja", "東京都の明日の天気予報は晴れです", "天気予報"),
])
def test_a_word_inside_a_run_without_spaces_is_found_by_its_ngrams(app_conn, tenant, language, text, query):
    """PostgreSQL's parser makes the whole run one token, which a query word inside it never
    equals; its n-grams (trigrams of Thai code points, bigrams of Han and Kana) match it."""
    insert_doc(app_conn, tenant, "target", [text], [basis(1)], language=language)
    insert_doc(app_conn, tenant, "other", ["ภาษาอังกฤษ 英語 english words"], [basis(2)], language="en")
    n = 3 if language == "th" else 2
    grams = {"~ " + query[i:i + n] for i in range(len(query) - n + 1)}
    with tenant_transaction(app_conn, tenant):
        assert set(app_conn.execute(SEARCH_TERMS, [query]).fetchone()[0]) == grams
        exact = app_conn.execute("select count(*) from kb.chunks where tsv @@ kb.terms_tsquery(array[%s])",
                                 [query]).fetchone()[0]
    assert exact == 0  # the whole-run token alone would not find it
    assert _titles(app_conn, tenant, query)[0] == "target"


def test_nospace_grams_match_python_reference(app_conn):
    """kb.nospace_grams against a plain Python reading of its rule: maximal runs, Thai
    trigrams, Han/Kana bigrams, a run shorter than n as itself, in order."""
    text = "abc ภาษาไทย 中文分词 x ก テスト"
    got = [g for (g,) in app_conn.execute("select gram from kb.nospace_grams(%s) order by ord", [text])]
    expected = []
    for run, n in (("ภาษาไทย", 3), ("中文分词", 2), ("ก", 3), ("テスト", 2)):
        expected += [run[i:i + n] for i in range(max(len(run) - n + 1, 1))]
    assert got == expected


def _tenant_with(app_conn, docs):
    t = uuid.uuid4()
    for i, (lang, text) in enumerate(docs):
        insert_doc(app_conn, t, f"d{i}", [text], [basis(i % 384)], language=lang)
    return t


def _languages(app_conn, tenant, query):
    with tenant_transaction(app_conn, tenant):
        return app_conn.execute("select kb.query_languages(%s, kb.current_tenant())", [query]).fetchone()[0]


def test_query_language_decision_uses_the_tenants_documents_as_prior(app_conn):
    """kb.query_languages: Latin words in an English/Vietnamese-only tenant follow the rule
    before 0021 (English when the query can only be English, else exact); a tenant with
    French documents searches a French query with the French and English stemmers
    (unsure: both, a stem no document holds matches nothing) and an English one with
    English; another script takes the tenant's languages of that script, or the script's
    default when it has none; a language with a tenth of the largest one's chunks or less
    is left out; Thai needs no stemmer."""
    en = _tenant_with(app_conn, [("en", "servers and connections")] * 3 + [("vi", "hóa đơn điện tử")])
    assert _languages(app_conn, en, "what connections are there") == ["en"]
    assert _languages(app_conn, en, "hoa don dien tu") == []
    assert _languages(app_conn, en, "hóa đơn") == []
    assert _languages(app_conn, en, "книги") == ["ru"]  # no Cyrillic document: the script's default
    assert _languages(app_conn, en, "ภาษาไทย") == []
    fr = _tenant_with(app_conn, [("fr", "les connexions du réseau")] * 12 + [("en", "network connections")] * 2
                      + [("de", "Häuser")])
    assert _languages(app_conn, fr, "les connexions réseau") == ["en", "fr"]  # de: below a tenth
    assert _languages(app_conn, fr, "what is the network") == ["en"]
    ru = _tenant_with(app_conn, [("ru", "книги и журналы")] * 4 + [("sr", "књиге")] * 2 + [("en", "books")])
    assert _languages(app_conn, ru, "книги") == ["ru", "sr"]
    assert _languages(app_conn, ru, "книги about books") == ["en", "ru", "sr"]


def test_a_language_set_in_sql_rederives_the_chunks_and_the_counts(app_conn, tenant):
    """UPDATE kb.documents SET language re-derives the document's chunks (as a title change
    does): the stemmed field in the new language, the chunk counted in it."""
    doc = insert_doc(app_conn, tenant, "t", ["Студенты читали книги"], [basis(1)], language="en")
    counts = ("select coalesce(array_agg(term || ':' || df order by term), '{}') from kb.term_stats"
              " where term like '@language %%'")
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute(counts).fetchone()[0] == ["@language en:1"]
        app_conn.execute("update kb.documents set language = 'ru' where doc_id = %s", [doc])
        assert app_conn.execute(counts).fetchone()[0] == ["@language ru:1"]
        tsv = app_conn.execute("select tsv::text from kb.chunks where doc_id = %s", [doc]).fetchone()[0]
    assert "'~ книг'" in tsv and "@language en" not in tsv


# ---- the pruned search against exhaustive BM25, one corpus per analyser ----------------

def _corpus(language, rng):
    """Documents in ``language`` from a small vocabulary of inflected forms (Zipf-like), with
    identifiers in some; returns {title: text} and the word list queries draw from."""
    if language in ("th", "zh", "ja"):
        words = {"th": ["ประเทศ", "จังหวัด", "เมือง", "ภาษา", "ไทย", "หลวง", "แม่น้ำ", "ภูเขา", "ทะเล", "อาหาร"],
                 "zh": ["中国", "文化", "历史", "经济", "城市", "人口", "语言", "学校", "技术", "文档"],
                 "ja": ["東京", "天気", "予報", "電車", "会社", "学校", "言葉", "料理", "山", "川"]}[language]
        joiner = ""
    else:
        bases = {"ru": ["книг", "студент", "город", "библиотек", "страниц", "работ", "школ", "язык", "мир", "дом"],
                 "tr": ["kitap", "öğrenci", "şehir", "okul", "dil", "ev", "yol", "deniz", "dağ", "köprü"],
                 "en": ["connect", "server", "network", "invoice", "paint", "boundary", "layer", "flow", "wing", "heat"]}
        endings = {"ru": ["а", "и", "ой", "ами", "ах", ""], "tr": ["", "lar", "ları", "da", "ın", "ler"],
                   "en": ["", "s", "ing", "ed", "er"]}
        if language == "mixed":
            words = [b + e for lang in ("ru", "tr", "en") for b in bases[lang] for e in endings[lang]]
        else:
            words = [b + e for b in bases[language] for e in endings[language]]
        joiner = " "
    weights = [1 / (i + 1) for i in range(len(words))]
    codes = ["ERR_402", "SKU-7781", "v2.3.1", "ERR_409"]
    docs = {}
    for i in range(60):
        ws = rng.choices(words, weights, k=rng.randint(2, 25))
        if rng.random() < 0.3:
            ws.append(rng.choice(codes))
        docs[f"d{i:03d}"] = joiner.join(ws) if joiner else " ".join(
            "".join(ws[j:j + 3]) for j in range(0, len(ws), 3))  # runs of three words
    return docs, words, codes


def _exhaustive(app_conn, tenant, docs, queries, ks=(5, 20), language=None):
    with tenant_transaction(app_conn, tenant):
        rows = app_conn.execute(
            "select d.title, c.doc_len, c.stem_len, u.lexeme, coalesce(array_length(u.positions, 1), 1)"
            " from kb.chunks c join kb.documents d using (doc_id) cross join lateral unnest(c.tsv) as u").fetchall()
    tf, lens, lang = {}, {}, {}
    for title, dl, sl, lexeme, n in rows:
        tf.setdefault(title, {})[lexeme] = n
        lens[title] = (dl, sl)
        if lexeme.startswith("@language "):
            lang[title] = lexeme.split()[1]

    def statistics(docs):  # N, average lengths (exact, stemmed field), df over these chunks
        n = len(docs)
        return (n, {False: sum(lens[d][0] for d in docs) / n, True: sum(lens[d][1] for d in docs) / n},
                Counter(t for d in docs for t in tf[d]))

    tenant_stats = statistics(list(lens))
    checked = 0
    for q, k in itertools.product(queries, ks):
        with tenant_transaction(app_conn, tenant):
            langs = app_conn.execute("select kb.query_languages(%s, kb.current_tenant(), %s)",
                                     [q, language]).fetchone()[0]
            groups = app_conn.execute(
                "select grp, qtf, array_agg(term) from kb.search_term_groups(%s,"
                " kb.query_languages(%s, kb.current_tenant(), %s)) group by grp, qtf", [q, q, language]).fetchall()
            got = [(r.score, r.doc_title) for r in run(app_conn, search.alexical, q, k, language=language)]
        # a query in a language the tenant holds (named), or analysed in one language only: a
        # term its chunks hold is weighed with their statistics, any other with the tenant's
        field = language if language in lang.values() else None
        stats_language = field or (langs[0] if len(langs) == 1 else None)
        own = [d for d in lens if lang.get(d) == stats_language]
        language_stats = statistics(own) if own else None
        # and with a named language, a stem counts only in its chunks, those of no known
        # language and, for a stem of another script, those of the languages that analysed
        # it; a number only in the first two (a field per language)

        def script(s):
            return "latn" if all(ord(ch) <= 0x24F for ch in s) else "cyrl" if any(
                0x400 <= ord(ch) <= 0x52F for ch in s) else "other"

        def counts(d, t):
            if not field or not t.startswith("~ ") or lang.get(d) in (None, field):
                return True
            return not t[2:].isdigit() and lang[d] in langs and {"ru": "cyrl"}.get(lang[d], "latn") == script(t[2:])

        def part(d, t):
            f = tf[d].get(t, 0)
            if not f or not counts(d, t):
                return 0.0
            stemmed = t.startswith("~ ")
            n_docs, avg, df = language_stats if language_stats and language_stats[2][t] else tenant_stats
            idf = math.log(1 + (n_docs - df[t] + 0.5) / (df[t] + 0.5))
            return idf * f * 2.2 / (f + 1.2 * (0.25 + 0.75 * lens[d][stemmed] / avg[stemmed]))

        def bm25(d):  # a group (the forms of one word) scores its best form, times its qtf
            return sum(qtf * max(part(d, t) for t in forms) for _, qtf, forms in groups)

        expected = sorted(((round(bm25(d), 9), d) for d in lens), key=lambda x: (-x[0], x[1]))
        expected = [e for e in expected if e[0] > 0][:k]
        assert len(got) == len(expected), q
        for (gs, gd), (es, ed) in zip(got, expected):
            assert math.isclose(gs, es, rel_tol=1e-7, abs_tol=1e-8), (q, k, got, expected)
            assert gd == ed or math.isclose(bm25(gd), es, rel_tol=1e-7), (q, k, gd, ed)
        checked += 1
    return checked


@pytest.mark.parametrize("language", ["ru", "tr", "th", "zh", "ja", "mixed"])
def test_pruned_bm25_equals_exhaustive_scoring_for_every_analyser(app_conn, tenant, language):
    """For each analyser (Snowball stemmers as typed then folded, n-grams, a tenant mixing
    languages so that queries are stemmed by several), the pruned search's top k equals BM25
    computed here over every chunk's lexemes, with and without term blocks. The stemmed
    field's length is the number of its positions, and no block is built for a language
    lexeme."""
    rng = random.Random(32)
    docs, words, codes = _corpus(language, rng)
    langs = {"mixed": ["ru", "tr", "en"]}.get(language, [language])
    for i, (title, text) in enumerate(docs.items()):
        insert_doc(app_conn, tenant, title, [text], [basis(i % 384)], language=langs[i % len(langs)])
    with tenant_transaction(app_conn, tenant):
        bad = app_conn.execute("select count(*) from kb.chunks where stem_len <> kb.stem_length(tsv)").fetchone()[0]
    assert bad == 0
    queries = [" ".join(rng.sample(words, rng.randint(1, 4))) for _ in range(20)]
    queries += [words[0] + " " + codes[0], codes[1], words[0] * 2, words[-1]]
    assert _exhaustive(app_conn, tenant, docs, queries) == 2 * len(queries)
    named = ["ru", "tr"] if language == "mixed" else []  # a field per language: the query's named
    for lang in named:
        assert _exhaustive(app_conn, tenant, docs, queries, language=lang) == 2 * len(queries)
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select kb.refresh_term_blocks(4, 5)").fetchone()[0] >= 3
        listed = {t for (t,) in app_conn.execute("select distinct term from kb.term_blocks")}
    assert any(t.startswith("~ ") for t in listed) and not any(t.startswith("@language") for t in listed)
    assert _exhaustive(app_conn, tenant, docs, queries) == 2 * len(queries)
    for lang in named:
        assert _exhaustive(app_conn, tenant, docs, queries, language=lang) == 2 * len(queries)
