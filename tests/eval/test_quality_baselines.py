"""bench/quality.py's per-language baselines: the collection's language, and the bm25s
analyser users run for it (stemmer, stop words, segmenter). No database, no data sets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "quality.py"

# bm25s, PyStemmer, stopwordsiso, pythainlp, jieba, fugashi and unidic-lite are in the dev
# extra that `make test` installs: a missing one is a failure, not a skip.


@pytest.fixture(scope="module")
def quality():
    spec = importlib.util.spec_from_file_location("kb_bench_quality", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name, lang", [
    ("xquad-ru", "ru"), ("xquad-tr", "tr"), ("xquad-ar", "ar"), ("xquad-el", "el"), ("xquad-ro", "ro"),
    ("xquad-hi", "hi"), ("xquad-th", "th"), ("xquad-vi", "vi"), ("cranfield", "en"), ("cisi", "en"),
    ("cacm", "en"), ("trec-covid", "en"), ("mr_tydi-ja", "ja"),
])
def test_collection_language_from_folder_name(quality, tmp_path, name, lang):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "SOURCE.md").write_text("# a set\n\n- Caveat: tells whether the language is analysed at all\n")
    assert quality.collection_language(folder) == lang


def test_collection_language_source_line_and_override(quality, tmp_path):
    folder = tmp_path / "mystery"
    folder.mkdir()
    (folder / "SOURCE.md").write_text("# Mystery\n\n- Language: Russian\n")
    assert quality.collection_language(folder) == "ru"
    (folder / "SOURCE.md").write_text("# Mystery\n\n- **Language**: tr\n")
    assert quality.collection_language(folder) == "tr"
    assert quality.collection_language(folder, "th") == "th"
    assert quality.collection_language(tmp_path / "xquad-ru", "English") == "en"


def test_russian_inflections_share_a_stem(quality):
    ru = quality.stem_baseline("ru")
    assert ru.stemmer == "russian"
    toks = ru("Книги, книга и книгой")
    assert len(toks) == 3 and len(set(toks)) == 1  # 'и' is a Russian stop word
    assert ru("книги") == ru("книга")


def test_turkish_inflections_share_a_stem(quality):
    tr = quality.stem_baseline("tr")
    assert tr.stemmer == "turkish"
    assert len(set(tr("kitaplar kitabı kitap"))) == 1
    assert tr("evler") == tr("evde") == tr("ev")


def test_hindi_keeps_vowel_signs_inside_words(quality):
    # bm25s's own pattern (\w\w+) cuts these words at every vowel sign
    assert quality.word_pattern(2).findall("हिन्दी भारत की राजभाषा") == ["हिन्दी", "भारत", "की", "राजभाषा"]
    hi = quality.stem_baseline("hi")
    assert hi.stemmer == "hindi" and hi.segmenter == "words"


def test_thai_is_segmented(quality):
    th = quality.stem_baseline("th")
    assert th.stemmer is None
    words = th.split("ภาษาไทยเป็นภาษาที่สวยงาม")
    assert len(words) > 1  # PostgreSQL's default parser: one token (no spaces in the sentence)
    assert "".join(words) == "ภาษาไทยเป็นภาษาที่สวยงาม"
    assert th("ภาษาไทยเป็นภาษาที่สวยงาม")  # stop words ('เป็น', 'ที่') go, content words stay


def test_chinese_is_segmented(quality):
    zh = quality.stem_baseline("zh")
    words = zh.split("我爱北京天安门")
    assert len(words) > 1 and "北京" in words


def test_japanese_is_segmented(quality):
    ja = quality.stem_baseline("ja")
    words = ja.split("日本語の文章を解析する")
    assert len(words) > 2 and "文章" in words


def test_vietnamese_keeps_diacritics(quality):
    vi = quality.stem_baseline("vi")
    assert vi.stemmer is None and vi.stopwords
    assert vi.split("Hóa đơn HÒA") == ["hóa", "đơn", "hòa"]


def test_english_is_what_it_was(quality):
    """The English row: bm25s.tokenize with English stop words and PyStemmer english, as before."""
    import bm25s
    import Stemmer

    en = quality.stem_baseline("en")
    texts = ["The boundary-layer flows over a flat plate were studied, and their transition.",
             "What is the effect of heat transfer on supersonic wings?", "", "a of the", "Ünïcode café naïve"]
    before = bm25s.tokenize(texts, stopwords="en", stemmer=Stemmer.Stemmer("english"), return_ids=False,
                            show_progress=False)
    assert en.tokenize(texts) == before
    assert en.description == "en stop words, Snowball"
    assert quality.stem_baseline("english") == en
