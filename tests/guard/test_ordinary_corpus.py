"""bench/ordinary_corpus.py: the ordinary-text corpus built from a fixture tree (a gzipped roff
man page, HTML manual and help pages, a README, a changelog, a config file, a BEIR collection,
a written set), its rows' source/lang/kind/licence, markup stripped, the per-source cap and its
seeded sample, the grouped folds, and a missing source skipped and reported."""

from __future__ import annotations

import gzip
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "ordinary_corpus.py"


def _module():
    spec = importlib.util.spec_from_file_location("kb_bench_ordinary_corpus", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


oc = _module()

ROFF = r""".\" a comment that must not show
.TH FROBNICATE 1 "2024-01-01" "frob 1.0" "Benutzerbefehle"
.SH BEZEICHNUNG
frobnicate \- die Frobnikationsstufe eines Geräts einstellen
.SH ÜBERSICHT
.B frobnicate
[\fB\-l\fR \fIStufe\fR] \fIGerät\fR
.SH BESCHREIBUNG
.B frobnicate
setzt die Frobnikationsstufe des genannten Geräts. Die Stufe ist eine Zahl zwischen eins und
zehn; mit höheren Stufen dreht sich das Gerät schneller und braucht mehr Strom aus dem Netz.
.PP
Die voreingestellte Stufe wird aus der Konfigurationsdatei gelesen, wenn keine Option \fB\-l\fR
angegeben ist, und die vorherige Stufe wird in das Protokoll geschrieben, damit sie später
wiederhergestellt werden kann.
.TP
.B \-l \fIStufe\fR
die einzustellende Stufe, von 1 bis 10; andere Werte werden mit einer Fehlermeldung abgelehnt.
"""

HTML_MANUAL = """<!DOCTYPE html><html><head><title>Chapter 3. Backups</title>
<script>var tracking = "SCRIPT_MUST_NOT_SHOW";</script><style>p { color: red }</style></head>
<body><div class="navheader">NAVIGATION_MUST_NOT_SHOW</div>
<div class="chapter"><h1>Backups</h1>
<p>Keep at least two copies of every important file, one of them away from the machine that
holds the original, and check from time to time that a backup can really be restored.</p>
<table><tr><th>Tool</th><th>Use</th></tr><tr><td>rsync</td><td>copies changed files</td></tr>
<tr><td>tar</td><td>makes one archive of a folder</td></tr><tr><td>borg</td><td>deduplicating archives</td></tr></table>
<p>A daily job that copies the home folder to an external disk is a good first step for most
people; it costs little and covers the common case of a failed disk or a deleted file.</p>
</div><div class="navfooter">FOOTER_MUST_NOT_SHOW</div></body></html>
"""

HELP_PAGE = """<html lang="vi"><head><title>Bảng</title></head><body><header>HEADER_MUST_NOT_SHOW</header>
<div id="DisplayArea"><h1>Bảng</h1><p>Hiển thị các câu lệnh để chèn, chỉnh sửa và xoá một bảng và các
phần tử của nó bên trong một tài liệu văn bản, cùng với các tuỳ chọn định dạng cho từng ô.</p></div></body></html>
"""

COPYRIGHT_DEP5 = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: {name}

Files: *
Copyright: 2020 Someone
License: {licence}

Files: debian/*
Copyright: 2021 Else
License: GPL-2+
"""


def _status(packages: dict[str, str]) -> str:
    return "\n".join(f"Package: {p}\nStatus: install ok installed\nVersion: {v}\n" for p, v in packages.items())


def _tree(tmp_path: Path, *, with_manpages: bool = True) -> tuple[object, Path, Path]:
    """A fixture root tree for Roots, a shared folder, a written folder."""
    r = tmp_path / "root"
    man = r / "man"
    doc = r / "doc"
    info = r / "dpkg" / "info"
    info.mkdir(parents=True)
    packages = {"manpages-de": "4.18.1-1", "debian-reference-en": "2.100", "libreoffice-help-vi": "4:7.4.7-1",
                "frob": "1.0-2", "widgetd": "3.1-1"}
    if not with_manpages:
        packages.pop("manpages-de")
    (r / "dpkg").joinpath("status").write_text(_status(packages), encoding="utf-8")
    for pkg, lic in (("manpages-de", "GPL-3+"), ("debian-reference-en", "GPL-2+"),
                     ("libreoffice-help-vi", "MPL-2.0"), ("frob", "Expat"), ("widgetd", "BSD-3-clause")):
        (doc / pkg).mkdir(parents=True, exist_ok=True)
        (doc / pkg / "copyright").write_text(COPYRIGHT_DEP5.format(name=pkg, licence=lic), encoding="utf-8")
    if with_manpages:
        page = man / "de" / "man1" / "frobnicate.1.gz"
        page.parent.mkdir(parents=True)
        page.write_bytes(gzip.compress(ROFF.encode("utf-8")))
        (info / "manpages-de.list").write_text(f"/.\n{page.parent}\n{page}\n", encoding="utf-8")
    debref = r / "debian-reference"
    debref.mkdir()
    (debref / "ch03.en.html").write_text(HTML_MANUAL, encoding="utf-8")
    help_vi = r / "libreoffice-help" / "vi" / "text" / "swriter"
    help_vi.mkdir(parents=True)
    (help_vi / "main0110.html").write_text(HELP_PAGE, encoding="utf-8")
    (doc / "frob" / "README").write_text(
        "Frob\n====\n\nFrob adjusts the frobnication level of widgets. Install it with the package manager "
        "and run frobnicate with the widget's name; see the manual page for the options it takes.\n",
        encoding="utf-8")
    (doc / "frob" / "changelog.Debian.gz").write_bytes(gzip.compress(
        b"frob (1.0-2) unstable; urgency=medium\n\n  * New upstream release with faster widget turning and a fix "
        b"for the level being lost after a restart of the daemon.\n\n -- Maintainer <m@example.org>  Mon, 01 Jan 2024\n"))
    etc = r / "etc"
    (etc / "widgetd").mkdir(parents=True)
    conf = etc / "widgetd" / "widgetd.conf"
    conf.write_text("# widgetd configuration: the daemon reads this file at start and on SIGHUP.\n"
                    "# level: the frobnication level used when a client gives none (1-10).\n"
                    "level = 5\n# log: where the previous levels are written.\nlog = /var/log/widgetd.log\n",
                    encoding="utf-8")
    (info / "widgetd.list").write_text(f"/.\n{conf}\n", encoding="utf-8")
    roots = oc.Roots(man=man, doc=doc, etc=etc, debian_reference=debref, python_doc=r / "python-html",
                     libreoffice_help=r / "libreoffice-help", locale=r / "locale",
                     libreoffice_locale=r / "lo-locale", licenses=r / "common-licenses", tables=(),
                     dpkg_info=info, dpkg_status=r / "dpkg" / "status", use_man=False)
    shared = tmp_path / "shared"
    coll = shared / "xquad-vi"
    coll.mkdir(parents=True)
    with (coll / "corpus.jsonl").open("w", encoding="utf-8") as fh:
        for i in range(40):
            fh.write(json.dumps({"_id": f"p{i}", "title": "", "text": f"Đoạn văn số {i} kể về lịch sử của "
                                 f"một thành phố ven biển, nơi có cảng cá lớn và những ngôi chùa cổ được xây từ "
                                 f"thế kỷ thứ {i + 1}."}, ensure_ascii=False) + "\n")
    (coll / "SOURCE.md").write_text("# XQuAD vi\n\n- Origin: GitHub `x/xquad`, commit `7d30520c717524000f0d`.\n"
                                    "- Licence: **CC BY-SA 4.0** (stated in the README). More text.\n",
                                    encoding="utf-8")
    written = tmp_path / "written"
    written.mkdir()
    (written / "o1.jsonl").write_text(
        json.dumps({"text": "Preheat the oven to 200 degrees, then bake the bread for forty minutes.",
                    "lang": "en", "kind": "recipe"}) + "\n", encoding="utf-8")
    return roots, shared, written


def _rows(out: Path) -> dict[str, list[dict]]:
    return oc.by_group(oc.load(out))


def test_rows_have_source_lang_kind_licence_and_markup_is_stripped(tmp_path):
    roots, shared, written = _tree(tmp_path)
    out = tmp_path / "out"
    manifest = oc.build(out, shared, written, roots=roots, log=lambda s: None)
    rows = _rows(out)
    assert set(rows) == {"man_de", "debian_reference_en", "libreoffice_help_vi", "usr_share_doc_readme_"
                         f"{oc._stable_hash('frob') % oc.SPLIT}", "usr_share_doc_changelog_"
                         f"{oc._stable_hash('frob') % oc.SPLIT}", f"etc_config_{oc._stable_hash('widgetd') % oc.SPLIT}",
                         "tables_html_en", "usr_share_doc_copyright", "shared_xquad_vi",
                         "written_ordinary_o1"}, sorted(rows)
    for name, rs in rows.items():
        for r in rs:
            assert set(r) == set(oc.FIELDS)
            assert r["source"] == name and r["kind"] in oc.KINDS and r["lang"] in oc.LANGS
    man = rows["man_de"]
    assert {(r["lang"], r["kind"], r["licence"], r["version"]) for r in man} == {("de", "manual", "GPL-3+", "4.18.1-1")}
    text = "\n".join(r["text"] for r in man)
    assert text.startswith("frobnicate(1)\n") and "setzt die Frobnikationsstufe des genannten Geräts" in text
    for markup in (".TH", ".SH", ".PP", ".B ", "\\f", "\\-", "a comment"):
        assert markup not in text, markup
    ref = rows["debian_reference_en"]
    assert {(r["lang"], r["kind"], r["licence"], r["version"]) for r in ref} == {("en", "manual", "GPL-2+", "2.100")}
    ref_text = "\n".join(r["text"] for r in ref)
    assert ref_text.startswith("Chapter 3. Backups\n") and "two copies of every important file" in ref_text
    assert "rsync" in ref_text and "copies changed files" in ref_text          # the table kept as text
    for junk in ("<p>", "<table", "<td", "SCRIPT_MUST_NOT_SHOW", "NAVIGATION_MUST_NOT_SHOW",
                 "FOOTER_MUST_NOT_SHOW", "color: red"):
        assert junk not in ref_text, junk
    [table] = rows["tables_html_en"]
    assert (table["kind"], table["licence"], table["origin"]) == ("table", "GPL-2+", f"{roots.debian_reference}/ch03.en.html#table0")
    assert "| rsync | copies changed files |" in table["text"] and "<td" not in table["text"]
    assert {r["kind"] for r in rows["usr_share_doc_copyright"]} == {"policy"}
    vi = rows["libreoffice_help_vi"]
    assert {(r["lang"], r["kind"], r["licence"]) for r in vi} == {("vi", "help_page", "MPL-2.0")}
    assert "HEADER_MUST_NOT_SHOW" not in vi[0]["text"] and "chỉnh sửa và xoá một bảng" in vi[0]["text"]
    readme = next(rs for n, rs in rows.items() if n.startswith("usr_share_doc_readme"))
    assert [(r["kind"], r["licence"], r["version"]) for r in readme] == [("readme", "Expat", "1.0-2")]
    changelog = next(rs for n, rs in rows.items() if n.startswith("usr_share_doc_changelog"))
    assert changelog[0]["kind"] == "changelog" and "faster widget turning" in changelog[0]["text"]
    conf = next(rs for n, rs in rows.items() if n.startswith("etc_config"))
    assert [(r["kind"], r["licence"], r["version"]) for r in conf] == [("config", "BSD-3-clause", "3.1-1")]
    assert "level = 5" in conf[0]["text"]
    xq = rows["shared_xquad_vi"]
    assert {(r["lang"], r["kind"], r["licence"], r["version"]) for r in xq} == {
        ("vi", "encyclopaedia", "CC BY-SA 4.0", "commit 7d30520c7175")}
    assert all(r["origin"].startswith("xquad-vi:p") for r in xq)
    assert [(r["lang"], r["kind"], r["licence"]) for r in rows["written_ordinary_o1"]] == [("en", "recipe", "project's own")]
    assert manifest["sources"]["man_de"]["passages"] == len(man)
    # a source whose package is absent is listed as skipped, with its package named
    assert "python3.11-doc" in manifest["skipped"]["python311_doc_library"]


def test_short_passages_are_dropped():
    doc = oc.Doc("T", "too short to be a passage", "x")
    assert oc.chunk_passages(doc) == []
    long = oc.Doc("Title", "word " * 40, "x")
    [p] = oc.chunk_passages(long)
    assert p.startswith("Title\n") and len(p) >= oc.MIN_CHARS


def test_deroff_without_groff_strips_requests_and_escapes():
    text = oc.deroff(ROFF)
    assert text.startswith("FROBNICATE(1)")
    assert "frobnicate - die Frobnikationsstufe eines Geräts einstellen" in text
    assert "-l Stufe" in text and "setzt die Frobnikationsstufe" in text
    for markup in (".TH", ".SH", ".PP", ".TP", "\\f", "\\-", "a comment"):
        assert markup not in text, markup


def test_per_source_cap_and_seeded_sample(tmp_path):
    roots, shared, written = _tree(tmp_path)
    kw = dict(roots=roots, log=lambda s: None, only=["shared_xquad_vi"])
    a = oc.build(tmp_path / "a", shared, None, per_source=10, seed=28, **kw)
    b = oc.build(tmp_path / "b", shared, None, per_source=10, seed=28, **kw)
    c = oc.build(tmp_path / "c", shared, None, per_source=10, seed=29, **kw)
    assert a["sources"]["shared_xquad_vi"]["passages"] == 10
    ra, rb, rc = (oc.load(tmp_path / d) for d in "abc")
    assert len(ra) == 10 and ra == rb                       # same seed: the same sample, same order
    assert {r["origin"] for r in ra} != {r["origin"] for r in rc}   # another seed: another sample
    full = oc.build(tmp_path / "d", shared, None, per_source=1000, **kw)
    assert full["sources"]["shared_xquad_vi"]["passages"] == 40
    assert len({r["text"] for r in oc.load(tmp_path / "d")}) == 40


def test_source_folds_keep_each_source_whole(tmp_path):
    rows = [{"source": s, "text": f"{s}{i}"} for s, n in (("a", 5), ("b", 3), ("c", 7), ("d", 1), ("e", 2))
            for i in range(n)]
    for k in (None, 2, 3):
        folds = oc.source_folds(rows, k=k)
        assert len(folds) == (5 if k is None else k)
        tested = [i for _, test in folds for i in test]
        assert sorted(tested) == list(range(len(rows)))      # every row in exactly one test fold
        for train, test in folds:
            assert set(train) | set(test) == set(range(len(rows))) and not set(train) & set(test)
            test_sources = {rows[i]["source"] for i in test}
            assert not test_sources & {rows[i]["source"] for i in train}   # no source on both sides
    sizes = sorted(len(t) for _, t in oc.source_folds(rows, k=2))
    assert sizes == [9, 9]                                     # 7+2 / 5+3+1
    with pytest.raises(ValueError, match="k must be"):
        oc.source_folds(rows, k=6)
    groups = oc.by_group(rows)
    assert list(groups) == ["a", "b", "c", "d", "e"] and len(groups["c"]) == 7


def test_missing_sources_are_skipped_and_reported(tmp_path):
    roots, _, written = _tree(tmp_path, with_manpages=False)
    (written / "bad.jsonl").write_text(json.dumps({"text": "Some ordinary text here.", "lang": "en",
                                                   "kind": "gossip"}) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    manifest = oc.build(out, tmp_path / "no-shared", written, roots=roots, log=lambda s: None)
    assert "man_de" not in manifest["sources"] and "manpages-de not installed" in manifest["skipped"]["man_de"]
    assert "no shared collections folder" in manifest["skipped"]["shared_*"]
    assert "field 'kind'" in manifest["skipped"]["written_ordinary_bad"]
    assert "bad.jsonl:1" in manifest["skipped"]["written_ordinary_bad"]
    assert "written_ordinary_o1" in manifest["sources"]
    report = subprocess.run([sys.executable, str(SCRIPT), "stats", str(out)], capture_output=True, text=True,
                            timeout=120, check=True).stdout
    assert "| man_de | package manpages-de not installed |" in report
    assert "| debian_reference_en | debian-reference-en | 2.100 | GPL-2+ | en | manual | 1 |" in report
    assert not (out / "man_de.jsonl").exists()


def test_cli_build_and_stats(tmp_path):
    out = tmp_path / "out"
    res = subprocess.run([sys.executable, str(SCRIPT), "build", "--out", str(out), "--per-source", "0"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "--per-source must be >= 1" in res.stderr
    res = subprocess.run([sys.executable, str(SCRIPT), "stats", str(tmp_path / "nowhere")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "no such folder" in res.stderr


def test_licence_summary():
    assert oc.summarise_licence(COPYRIGHT_DEP5.format(name="x", licence="GPL-3+")) == "GPL-3+"
    gnu = "is free software; you can redistribute it under the GNU General Public License as published by " \
          "the Free Software Foundation; either version 2 of the License, or (at your option) any later version."
    assert oc.summarise_licence(gnu) == "GPL-2+"
    assert oc.summarise_licence("License:\n\nPython License\nPSF LICENSE AGREEMENT FOR PYTHON\n"
                                "Redistribution and use in source and binary forms") == "PSF-2.0"


def test_language_check_drops_english_fallback_text():
    english = "The example below opens a newly edited dialog from a document with the Run Macro menu, and it is " \
              "then shown to the user."
    for lang in ("hi", "vi", "de", "ru", "zh"):
        assert not oc.in_language(english, lang), lang
    assert oc.in_language("उदाहरण नीचे दिया गया है और यह दस्तावेज़ से एक संवाद खोलता है, जो उपयोगकर्ता को दिखाया जाता है।", "hi")
    assert oc.in_language("Das Beispiel öffnet einen Dialog aus dem Dokument, der dann dem Benutzer gezeigt wird und "
                          "mit dem Menü geschlossen werden kann.", "de")
    assert oc.in_language("Ví dụ dưới đây mở một hộp thoại từ tài liệu và hiển thị nó cho người dùng.", "vi")
    assert oc.in_language("Sub AddEntry\n    oList.addItem(\"x\", 0)\nEnd Sub", "hi")   # code: no language's
    assert oc.in_language(english, "en")


def test_untranslated_help_pages_are_left_out(tmp_path):
    roots, shared, written = _tree(tmp_path)
    page = roots.libreoffice_help / "vi" / "text" / "swriter" / "main0200.html"
    page.write_text("<html><head><title>Macros</title></head><body><div id='DisplayArea'><h1>Macros</h1><p>The "
                    "example below opens a newly edited dialog from a document with the Run Macro menu, and it is "
                    "then shown to the user of the document.</p></div></body></html>", encoding="utf-8")
    manifest = oc.build(tmp_path / "out", None, None, roots=roots, log=lambda s: None, only=["libreoffice_help_vi"])
    rows = oc.load(tmp_path / "out")
    assert [r["origin"] for r in rows] == [str(roots.libreoffice_help / "vi" / "text" / "swriter" / "main0110.html")]
    assert manifest["sources"]["libreoffice_help_vi"]["dropped_language"] == 1


def test_examples_keep_configuration_files_only(tmp_path):
    roots, _, _ = _tree(tmp_path)
    ex = roots.doc / "frob" / "examples"
    ex.mkdir()
    (ex / "frob.conf").write_text("# frob sample configuration: copy it to /etc/frob.conf and adjust the level\n"
                                  "level = 3\nlog = /var/log/frob.log\n", encoding="utf-8")
    (ex / "drawing.ps").write_text("%!PS\n" + "159.907 412.383 DL 159.874 412.178 moveto lineto\n" * 5, encoding="utf-8")
    oc.build(tmp_path / "out", None, None, roots=roots, log=lambda s: None, only=["usr_share_doc_examples"])
    rows = oc.load(tmp_path / "out")
    assert [(r["origin"], r["kind"], r["licence"]) for r in rows] == [(str(ex / "frob.conf"), "config", "Expat")]


def test_man_rendering_strips_markup(tmp_path):
    # `man -l` where man-db is installed (the deroff fallback otherwise): the same reading either way
    page = tmp_path / "frobnicate.1.gz"
    page.write_bytes(gzip.compress(ROFF.encode("utf-8")))
    text = oc.render_man(page, use_man=oc.Roots().use_man)
    assert "BESCHREIBUNG" in text and "Frobnikationsstufe des genannten" in " ".join(text.split())
    for markup in (".TH", ".SH", ".PP", ".TP", "\\f", "\\-", "a comment", "\x08"):
        assert markup not in text, markup


def test_written_sets_kept_whole_and_rebuilt_alone(tmp_path):
    roots, shared, written = _tree(tmp_path)
    with (written / "o1.jsonl").open("a", encoding="utf-8") as fh:
        for i in range(4):
            fh.write(json.dumps({"text": f"Minutes of the canteen committee, meeting {i}: the new menu starts in "
                                 f"week {i + 10}.", "lang": "en", "kind": "minutes"}) + "\n")
    out = tmp_path / "out"
    oc.build(out, shared, written, roots=roots, per_source=2, log=lambda s: None)
    rows = _rows(out)
    assert len(rows["written_ordinary_o1"]) == 5                  # not capped by per_source
    assert len(rows["shared_xquad_vi"]) == 2
    capped = oc.build(tmp_path / "capped", shared, written, roots=roots, per_source=2, written_per_source=3,
                      log=lambda s: None)
    assert capped["sources"]["written_ordinary_o1"]["passages"] == 3
    # a later written set, rebuilt alone: the other sources stay as they were
    before = (out / "shared_xquad_vi.jsonl").read_bytes()
    (written / "o2.jsonl").write_text(json.dumps({"text": "Στο σπίτι μας το φαγητό σερβίρεται στις οκτώ το βράδυ.",
                                                  "lang": "el", "kind": "email"}, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    manifest = oc.build(out, None, written, roots=roots, per_source=2, only=["written_ordinary_*"], log=lambda s: None)
    assert (out / "shared_xquad_vi.jsonl").read_bytes() == before
    assert manifest["sources"]["shared_xquad_vi"]["passages"] == 2 and "shared_*" not in manifest["skipped"]
    assert [(r["lang"], r["kind"]) for r in _rows(out)["written_ordinary_o2"]] == [("el", "email")]
