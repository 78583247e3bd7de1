"""Ingestion of real files (HTML, PDF, DOCX, YAML front matter), bad files
reported without stopping the batch, `kb-rerank delete` and `kb-rerank ingest --sync`.

The PDF and DOCX fixtures are built here at runtime (a one-page PDF with exact xref offsets,
a minimal WordprocessingML zip), then read by the product's readers (markitdown's
converters). Database tests run as the app role through the real migrations; the cache
tests go through the real HTTP app (fixtures of tests/cache/test_cache_invalidation.py).
"""

from __future__ import annotations

import io
import sys
import uuid
import zipfile
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from kb_rerank.cli import main as cli
from kb_rerank.ingest.loader import delete_documents, ingest_paths, sync_folder, SyncRefused
from kb_rerank.ingest.readers import BadFile, SourceDoc, iter_documents, parse_front_matter
from kb_rerank.retrieval import store as search
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.session import run

from tests.endpoints.test_rerank_route import reranker, tiny_model_dir  # noqa: F401 - module fixtures
from tests.cache.test_cache_invalidation import api, ask, counting, texts  # noqa: F401 - module fixtures
from tests.ingest.test_ingest import _stats_are_exact


# --------------------------------------------------------------------------- fixture files


def make_pdf(lines: list[str], title: str | None = None) -> bytes:
    """A one-page PDF (Helvetica, one text line per entry) with an exact cross-reference table;
    ``title``: its document-information Title."""
    def lit(s: str) -> str:
        return "(" + s.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") + ")"

    content = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"{lit(x)} '" for x in lines) + " ET"
    objs = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R"
        " /Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(content.encode('latin-1'))} >>\nstream\n{content}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    if title is not None:
        objs.append(f"<< /Title {lit(title)} >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, o in enumerate(objs, 1):
        offsets.append(out.tell())
        out.write(f"{i} 0 obj\n{o}\nendobj\n".encode("latin-1"))
    xref = out.tell()
    out.write(f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    info = f" /Info {len(objs)} 0 R" if title is not None else ""
    out.write(f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R{info} >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


_W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
_PKG = "http://schemas.openxmlformats.org/package/2006"
_OD = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"


def make_docx(paragraphs: list[tuple[str | None, str]]) -> bytes:
    """A minimal .docx: (paragraph style or None, text) per paragraph; style Heading1 exists."""
    body = "".join("<w:p>" + (f'<w:pPr><w:pStyle w:val="{st}"/></w:pPr>' if st else "")
                   + f"<w:r><w:t>{escape(t)}</w:t></w:r></w:p>" for st, t in paragraphs)
    head = '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>'
    parts = {
        "[Content_Types].xml": f'{head}<Types xmlns="{_PKG}/content-types">'
        '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
        '<Default Extension="xml" ContentType="application/xml"/>'
        '<Override PartName="/word/document.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/>'
        '<Override PartName="/word/styles.xml" ContentType="application/'
        'vnd.openxmlformats-officedocument.wordprocessingml.styles+xml"/></Types>',
        "_rels/.rels": f'{head}<Relationships xmlns="{_PKG}/relationships"><Relationship Id="rId1" '
        f'Type="{_OD}/officeDocument" Target="word/document.xml"/></Relationships>',
        "word/_rels/document.xml.rels": f'{head}<Relationships xmlns="{_PKG}/relationships"><Relationship Id="rId1" '
        f'Type="{_OD}/styles" Target="styles.xml"/></Relationships>',
        "word/styles.xml": f'{head}<w:styles xmlns:w="{_W}"><w:style w:type="paragraph" w:styleId="Heading1">'
        '<w:name w:val="heading 1"/></w:style></w:styles>',
        "word/document.xml": f'{head}<w:document xmlns:w="{_W}"><w:body>{body}</w:body></w:document>',
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, xml in parts.items():
            z.writestr(name, xml)
    return buf.getvalue()


HTML = ("<!doctype html><html><head><title>Brambleton opening hours</title><style>p {color: red}</style>"
        "<script>var trackingMarker = 1;</script></head><body><nav>Home</nav><h1>Opening hours</h1>"
        "<p>The Brambleton office is open from 9 to 17 on weekdays.</p><ul><li>Closed on holidays</li></ul>"
        "</body></html>")


def write_kb(folder: Path) -> Path:
    """One good file per format (each with a word of its own) and two corrupt ones."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manual.pdf").write_bytes(make_pdf(["Zephyrine gasket manual",
                                                  "Tighten the zephyrine gasket to twelve newton metres."]))
    (folder / "export.docx").write_bytes(make_docx([("Heading1", "Quillwort export"),
                                                    (None, "Export quillwort reports as CSV from the Reports page.")]))
    (folder / "hours.html").write_text(HTML, encoding="utf-8")
    (folder / "old" / "legacy.htm").parent.mkdir(exist_ok=True)
    (folder / "old" / "legacy.htm").write_text("<p>Marmalith legacy page without a title.</p>", encoding="utf-8")
    (folder / "tagged.md").write_text("---\ntitle: Tagged page\nauthority: 2\ntags:\n  - billing\n  - invoices\n"
                                      "aliases: [bills, receipts]\n---\nThe vellichor billing page.\n", encoding="utf-8")
    (folder / "notes.txt").write_text("Plain note about the grommetry settings.\n", encoding="utf-8")
    (folder / "broken.pdf").write_bytes(b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog\ntruncated here")
    (folder / "broken.docx").write_bytes(b"PK\x03\x04 this is not a zip archive")
    return folder


GOOD = {"manual.pdf", "export.docx", "hours.html", "old/legacy.htm", "tagged.md", "notes.txt"}


# --------------------------------------------------------------------------- readers


def test_each_format_is_read_and_corrupt_files_are_reported(tmp_path):
    items = list(iter_documents([write_kb(tmp_path / "kb")]))
    docs = {d.source_uri: d for d in items if isinstance(d, SourceDoc)}
    bad = {Path(b.path).name: b.reason for b in items if isinstance(b, BadFile)}
    assert set(docs) == GOOD
    assert set(bad) == {"broken.pdf", "broken.docx"}
    assert bad["broken.pdf"].startswith("cannot read PDF: ")
    assert bad["broken.docx"].startswith("cannot read DOCX: ")

    pdf = docs["manual.pdf"]
    assert "Tighten the zephyrine gasket to twelve newton metres." in pdf.text
    assert pdf.title == "Zephyrine gasket manual" and pdf.language == "en"  # no metadata Title: its first line
    docx = docs["export.docx"]
    assert docx.title == "Quillwort export"
    assert docx.text.startswith("# Quillwort export")  # heading kept as Markdown: the chunker splits there
    assert "Export quillwort reports as CSV" in docx.text
    html = docs["hours.html"]
    assert html.title == "Brambleton opening hours"  # <title>
    assert "# Opening hours" in html.text and "open from 9 to 17" in html.text and "Closed on holidays" in html.text
    assert "trackingMarker" not in html.text and "color: red" not in html.text  # script and style dropped
    assert docs["old/legacy.htm"].title == "legacy"
    tagged = docs["tagged.md"]
    assert (tagged.title, tagged.authority, tagged.text) == ("Tagged page", 2.0, "The vellichor billing page.")


def test_without_the_files_extra_a_pdf_is_a_bad_file_naming_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "markitdown", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "markitdown.converters", None)
    (tmp_path / "manual.pdf").write_bytes(make_pdf(["text"]))
    (tmp_path / "a.md").write_text("# A\n\nstill read\n", encoding="utf-8")
    bad, good = iter_documents([tmp_path])  # sorted: a.md, manual.pdf
    bad, good = (good, bad) if isinstance(bad, SourceDoc) else (bad, good)
    assert isinstance(good, SourceDoc) and good.source_uri == "a.md"
    assert isinstance(bad, BadFile) and "pip install 'kb-rerank[files]'" in bad.reason


def test_yaml_front_matter_lists_nesting_and_errors(tmp_path):
    meta, body = parse_front_matter("---\ntitle: Lists\ntags:\n  - a\n  - b\nmeta:\n  owner: ops\n---\n# Body\n")
    assert meta == {"title": "Lists", "tags": ["a", "b"], "meta": {"owner": "ops"}} and body == "# Body\n"
    (tmp_path / "bad-yaml.md").write_text("---\ntitle: [unclosed\n---\nbody\n", encoding="utf-8")
    (tmp_path / "list-top.md").write_text("---\n- just\n- a list\n---\nbody\n", encoding="utf-8")
    (tmp_path / "list-title.md").write_text("---\ntitle: [a, b]\n---\nbody\n", encoding="utf-8")
    (tmp_path / "ok.md").write_text("---\ntags: [x, y]\nlanguage: VI\n---\nXin chào\n", encoding="utf-8")
    items = {Path(getattr(i, "path", None) or i.source_uri).name: i for i in iter_documents([tmp_path])}
    assert isinstance(items["bad-yaml.md"], BadFile) and "not valid YAML" in items["bad-yaml.md"].reason
    assert isinstance(items["list-top.md"], BadFile) and "mapping" in items["list-top.md"].reason
    assert isinstance(items["list-title.md"], BadFile) and "title" in items["list-title.md"].reason
    ok = items["ok.md"]
    assert isinstance(ok, SourceDoc) and (ok.title, ok.language, ok.text) == ("ok", "vi", "Xin chào")


# --------------------------------------------------------------------------- ingestion


def _uris(conn, tenant) -> set[str]:
    with tenant_transaction(conn, tenant):
        return {r[0] for r in conn.execute("select source_uri from kb.documents")}


def _lexical_uris(conn, tenant, query) -> set[str]:
    with tenant_transaction(conn, tenant):
        rows = run(conn, search.alexical, query, 10)
        ids = [r.doc_id for r in rows]
        return {r[0] for r in conn.execute("select source_uri from kb.documents where doc_id = any(%s)", [ids])}


def test_corrupt_files_are_reported_and_the_rest_of_the_batch_is_ingested(app_conn, tenant, embedder, settings,
                                                                          tmp_path):
    report = ingest_paths(app_conn, tenant, [write_kb(tmp_path / "kb")], embedder, settings)
    assert report.added == len(GOOD)
    assert sorted(Path(b.path).name for b in report.bad_files) == ["broken.docx", "broken.pdf"]
    assert "2 failed: " in report.summary() and "broken.pdf: cannot read PDF" in report.summary()
    assert _uris(app_conn, tenant) == GOOD
    # the converted text is searchable: each format's own word finds its document
    assert _lexical_uris(app_conn, tenant, "zephyrine gasket") == {"manual.pdf"}
    assert _lexical_uris(app_conn, tenant, "quillwort") == {"export.docx"}
    assert _lexical_uris(app_conn, tenant, "brambleton") == {"hours.html"}
    assert _lexical_uris(app_conn, tenant, "vellichor") == {"tagged.md"}
    _stats_are_exact(app_conn, tenant)


@pytest.fixture
def cli_env(monkeypatch, settings):
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    if settings.app_password:
        monkeypatch.setenv("KB_APP_PASSWORD", settings.app_password)


def test_cli_ingest_exit_status_counts_failed_files(cli_env, capsys, app_conn, tenant, tmp_path):
    kb = write_kb(tmp_path / "kb")
    assert cli.main(["ingest", str(kb), "--tenant", str(tenant), "--quiet"]) == 1
    out = capsys.readouterr()
    assert f"{len(GOOD)} added" in out.out and "2 failed" in out.out
    assert "failed " + str(kb / "broken.pdf") + ": cannot read PDF" in out.err
    assert "2 file(s) failed, the rest was ingested" in out.err
    assert _uris(app_conn, tenant) == GOOD
    for name in ("broken.pdf", "broken.docx"):
        (kb / name).unlink()
    assert cli.main(["ingest", str(kb), "--tenant", str(tenant), "--quiet"]) == 0  # all good: 0
    assert f"0 added, 0 updated, {len(GOOD)} unchanged" in capsys.readouterr().out


# --------------------------------------------------------------------------- delete


def _chunks_of(conn, tenant, doc_id) -> int:
    with tenant_transaction(conn, tenant):
        return conn.execute("select count(*) from kb.chunks where doc_id = %s", [doc_id]).fetchone()[0]


def _doc_id(conn, tenant, uri):
    with tenant_transaction(conn, tenant):
        row = conn.execute("select doc_id from kb.documents where source_uri = %s", [uri]).fetchone()
    return None if row is None else row[0]


@pytest.mark.parametrize("by", ["id", "source"])
def test_cli_delete_removes_chunks_statistics_and_cached_answers(by, api, cli_env, capsys, app_conn, embedder,
                                                                 settings, tmp_path):
    tenant = uuid.uuid4()
    kb = tmp_path / "kb"
    (kb / "guides").mkdir(parents=True)
    (kb / "guides" / "valve.md").write_text("# Valve\n\nThe quokkaflux valve reset procedure: press RESET-A "
                                            "for ten seconds.\n", encoding="utf-8")
    (kb / "billing.md").write_text("# Billing\n\nInvoices are emailed monthly.\n", encoding="utf-8")
    (kb / "login.md").write_text("# Login\n\nReset your password from the sign-in page.\n", encoding="utf-8")
    assert not ingest_paths(app_conn, tenant, [kb], embedder, settings).bad_files
    doc_id = _doc_id(app_conn, tenant, "guides/valve.md")
    assert _chunks_of(app_conn, tenant, doc_id) >= 1
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select df from kb.term_stats where term = 'quokkaflux'").fetchone() == (1,)

    assert "RESET-A" in texts(ask(api, tenant))
    assert ask(api, tenant)["from_cache"] is True  # cached before the delete

    target = str(doc_id) if by == "id" else "guides/valve.md"
    assert cli.main(["delete", "--tenant", str(tenant), f"--{by}", target]) == 0
    out = capsys.readouterr().out
    assert f"deleted {doc_id} guides/valve.md (" in out and "1 document(s) deleted" in out

    assert _doc_id(app_conn, tenant, "guides/valve.md") is None
    assert _chunks_of(app_conn, tenant, doc_id) == 0
    assert _uris(app_conn, tenant) == {"billing.md", "login.md"}
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select count(*) from kb.term_stats where term = 'quokkaflux'").fetchone()[0] == 0
    _stats_are_exact(app_conn, tenant)
    after = ask(api, tenant)
    assert after["from_cache"] is False  # the cached answer is not served after the delete
    assert "RESET-A" not in texts(after) and "quokkaflux" not in texts(after)
    assert str(doc_id) not in {r["doc_id"] for r in after["results"]}


def test_cli_delete_reports_what_it_did_not_find(cli_env, capsys, app_conn, embedder, settings, tmp_path):
    tenant, other = uuid.uuid4(), uuid.uuid4()
    (tmp_path / "a.md").write_text("# A\n\ntext a\n", encoding="utf-8")
    ingest_paths(app_conn, tenant, [tmp_path / "a.md"], embedder, settings)
    ingest_paths(app_conn, other, [tmp_path / "a.md"], embedder, settings)
    other_id = _doc_id(app_conn, other, "a.md")
    # another tenant's document id matches nothing (RLS), a missing path neither: exit 1, nothing deleted
    assert cli.main(["delete", "--tenant", str(tenant), "--id", str(other_id)]) == 1
    assert cli.main(["delete", "--tenant", str(tenant), "--source", "nope.md"]) == 1
    err = capsys.readouterr().err
    assert f"not found for tenant {tenant}: {other_id}" in err and "nope.md" in err
    assert _uris(app_conn, tenant) == {"a.md"} and _uris(app_conn, other) == {"a.md"}
    assert delete_documents(app_conn, tenant, source_uris=["a.md"])[0].source_uri == "a.md"
    assert _uris(app_conn, tenant) == set() and _uris(app_conn, other) == {"a.md"}
    with pytest.raises(SystemExit):  # --id and --source are exclusive, one is required
        cli.main(["delete", "--tenant", str(tenant)])
    with pytest.raises(SystemExit):
        cli.main(["delete", "--tenant", str(tenant), "--id", "not-a-uuid"])


# --------------------------------------------------------------------------- sync


def test_cli_ingest_sync_deletes_documents_whose_file_is_gone(cli_env, capsys, app_conn, embedder, settings,
                                                              tmp_path):
    tenant = uuid.uuid4()
    kb = tmp_path / "kb"
    (kb / "sub").mkdir(parents=True)
    (kb / "keep.md").write_text("# Keep\n\nThe pellucid keep page.\n", encoding="utf-8")
    (kb / "sub" / "gone.md").write_text("# Gone\n\nThe evanescent page about zorblat.\n", encoding="utf-8")
    (kb / "page.html").write_text(HTML, encoding="utf-8")
    (kb / "flaky.txt").write_text("A file that later fails to read.\n", encoding="utf-8")
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"_id": "d1", "title": "Beir", "text": "A BEIR line, not a file."}\n', encoding="utf-8")
    assert cli.main(["ingest", str(kb), str(corpus), "--tenant", str(tenant), "--quiet"]) == 0
    assert _uris(app_conn, tenant) == {"keep.md", "sub/gone.md", "page.html", "flaky.txt", "beir:d1"}
    gone_id = _doc_id(app_conn, tenant, "sub/gone.md")
    capsys.readouterr()

    (kb / "sub" / "gone.md").unlink()
    (kb / "flaky.txt").write_bytes(b"caf\xe9 latin-1 now")  # still there, unreadable: its document stays
    (kb / "keep.md").write_text("# Keep\n\nThe pellucid keep page, revised.\n", encoding="utf-8")
    assert cli.main(["ingest", "--sync", str(kb), "--dry-run", "--tenant", str(tenant)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "would update keep.md", "would delete sub/gone.md",
        "0 document(s) would be added, 1 updated, 1 deleted, 1 unchanged (dry run: nothing written)"]
    assert "sub/gone.md" in _uris(app_conn, tenant)

    assert cli.main(["ingest", "--sync", str(kb), "--tenant", str(tenant), "--quiet"]) == 1  # flaky.txt failed
    out = capsys.readouterr()
    assert "1 deleted (file gone)" in out.out and "deleted sub/gone.md (file gone)" in out.err
    assert _uris(app_conn, tenant) == {"keep.md", "page.html", "flaky.txt", "beir:d1"}  # BEIR never synced away
    assert _chunks_of(app_conn, tenant, gone_id) == 0
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select count(*) from kb.term_stats where term = 'zorblat'").fetchone()[0] == 0
    _stats_are_exact(app_conn, tenant)

    # a missing or empty folder would delete everything: refused, nothing deleted
    empty = tmp_path / "empty"
    empty.mkdir()
    assert cli.main(["ingest", "--sync", str(empty), "--tenant", str(tenant), "--quiet"]) == 2
    assert cli.main(["ingest", "--sync", str(tmp_path / "missing"), "--tenant", str(tenant), "--quiet"]) == 2
    assert cli.main(["ingest", "--sync", str(kb), str(empty), "--tenant", str(tenant), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "refusing to sync" in err and "is not one" in err and "exactly one FOLDER" in err
    assert _uris(app_conn, tenant) == {"keep.md", "page.html", "flaky.txt", "beir:d1"}
    with pytest.raises(SyncRefused):
        sync_folder(app_conn, tenant, empty, embedder, settings)


# --------------------------------------------------------------------------- progress


def test_term_blocks_shows_progress_unless_quiet(cli_env, capsys, app_conn, embedder, settings, tmp_path):
    tenant = uuid.uuid4()
    (tmp_path / "a.md").write_text("# A\n\nzebra crossing\n", encoding="utf-8")
    ingest_paths(app_conn, tenant, [tmp_path / "a.md"], embedder, settings)
    assert cli.main(["term-blocks", "--tenant", str(tenant)]) == 0
    err = capsys.readouterr().err
    assert "term-blocks: rebuilding over 1 chunks" in err
    assert cli.main(["term-blocks", "--tenant", str(tenant), "--quiet"]) == 0
    out = capsys.readouterr()
    assert out.err == "" and f"rebuilt for tenant {tenant}" in out.out
