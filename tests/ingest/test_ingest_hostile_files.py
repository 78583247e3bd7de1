"""Hostile files in a folder given to ingestion: what the readers refuse, and what one bad file
may cost.

Part 1, links and special files: a folder holding symbolic links out of it (to a key file, to
/etc/passwd), hard links, FIFOs and sockets, and files swapped for links between the walk and the
open. Part 2, converters: DOCX zip bombs (ratio, expanded size, member count), a DOCX and an HTML
file that keep the converter busy past its timeout, a PDF whose stream inflates past the memory
limit, text past the character limit. Every hostile file is built here, in tmp_path; each must
become one bad file with its reason, in bounded time, while the rest of the batch is read.
"""

from __future__ import annotations

import io
import os
import socket
import threading
import time
import zipfile
import zlib
from pathlib import Path

import pytest

from kb_rerank.ingest import readers
from kb_rerank.ingest.loader import ingest_documents, sync_folder
from kb_rerank.ingest.readers import BadFile, ReadLimits, SourceDoc, iter_documents, list_source_files

from tests.ingest.test_ingest_files import GOOD, _lexical_uris, _uris, make_docx, write_kb

SECRET = "zorblaxkeymaterial"  # a word only the files outside the folder hold


def _within(seconds: float, fn):
    """fn() run in a thread; fails the test when it has not returned after *seconds* (opening a
    FIFO for reading blocks until a writer comes: a reader that opens one never returns)."""
    out: dict[str, object] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"reading did not finish within {seconds} s (blocked opening a FIFO?)")
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out["value"]


def _split(items):
    items = list(items)
    docs = {d.source_uri: d for d in items if isinstance(d, SourceDoc)}
    bad = {Path(b.path).name: b.reason for b in items if isinstance(b, BadFile)}
    return docs, bad


def _outside(tmp_path: Path) -> Path:
    """A folder next to the one ingested, standing for the data dir: a key file, a secret page."""
    out = tmp_path / "data"
    (out / "keys").mkdir(parents=True)
    (out / "keys" / "audit.key").write_text(f"{SECRET} 3f9a0c\n", encoding="utf-8")
    (out / "pages").mkdir()
    (out / "pages" / "secret.md").write_text(f"# Secret\n\n{SECRET} page\n", encoding="utf-8")
    return out


# --------------------------------------------------------------------------- links


def test_links_out_of_the_folder_are_reported_and_never_read(tmp_path):
    out = _outside(tmp_path)
    kb = tmp_path / "kb"
    (kb / "sub").mkdir(parents=True)
    (kb / "good.md").write_text("# Good\n\nThe grommetry page.\n", encoding="utf-8")
    (kb / "sub" / "inner.md").write_text("# Inner\n\ninner page\n", encoding="utf-8")
    (kb / ".private").mkdir()
    (kb / ".private" / "hidden.md").write_text(f"# Hidden\n\n{SECRET}\n", encoding="utf-8")
    (kb / "config.yaml").write_text(f"token: {SECRET}\n", encoding="utf-8")
    os.symlink(out / "keys" / "audit.key", kb / "leak.txt")  # the review's two links
    os.symlink("/etc/passwd", kb / "passwd.md")
    os.symlink("../../data/pages/secret.md", kb / "sub" / "relative.md")  # relative, still outside
    os.symlink("sub/inner.md", kb / "alias.md")  # inside the folder: followed, under its own name
    os.symlink("alias.md", kb / "alias2.md")  # a chain inside the folder: followed to its end
    os.symlink(".private/hidden.md", kb / "peek.md")  # inside, but to a file the walk skips
    os.symlink("config.yaml", kb / "config.md")  # inside, but to a file that is not a document
    os.symlink("loop-b.md", kb / "loop-a.md")
    os.symlink("loop-a.md", kb / "loop-b.md")
    os.symlink(out / "pages", kb / "pages")  # a folder outside: reported, not walked
    os.symlink("sub", kb / "sub-again")  # a folder inside: skipped, its files are read through sub/

    docs, bad = _split(_within(60, lambda: list(iter_documents([kb]))))

    assert set(docs) == {"good.md", "sub/inner.md", "alias.md", "alias2.md"}
    assert docs["alias.md"].text == docs["sub/inner.md"].text == "# Inner\n\ninner page"
    assert all(SECRET not in d.text and "root:" not in d.text for d in docs.values())
    outside = "symbolic link to a file outside the folder given: not read"
    assert bad == {
        "leak.txt": outside,
        "passwd.md": outside,
        "relative.md": outside,
        "peek.md": bad["peek.md"],
        "config.md": bad["config.md"],
        "loop-a.md": "symbolic link loop: not read",
        "loop-b.md": "symbolic link loop: not read",
        "pages": "symbolic link to a folder outside the folder given: not followed",
    }
    for name in ("peek.md", "config.md"):
        assert bad[name].startswith("symbolic link to a hidden or non-document path: not read")


def test_a_file_named_directly_may_be_a_link_but_never_a_fifo(tmp_path):
    out = _outside(tmp_path)
    named = tmp_path / "named.md"
    os.symlink(out / "pages" / "secret.md", named)  # the caller chose this file: read where it is
    fifo = tmp_path / "pipe.md"
    os.mkfifo(fifo)
    items = _within(30, lambda: list(iter_documents([named, fifo])))
    assert isinstance(items[0], SourceDoc) and items[0].source_uri == "named.md" and SECRET in items[0].text
    assert isinstance(items[1], BadFile) and items[1].reason == "not a regular file (a FIFO): not opened"


def test_hard_links_fifos_and_sockets_in_a_folder_are_refused_without_opening(tmp_path, monkeypatch):
    out = _outside(tmp_path)
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "good.txt").write_text("a plain note\n", encoding="utf-8")
    os.link(out / "pages" / "secret.md", kb / "hard.md")  # one file, two names: one of them outside
    os.mkfifo(kb / "pipe.md")
    monkeypatch.chdir(kb)  # a relative socket path: AF_UNIX paths are limited to 107 bytes
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("sock.md")
    try:
        docs, bad = _split(_within(30, lambda: list(iter_documents([kb]))))
    finally:
        sock.close()
    assert set(docs) == {"good.txt"}
    assert bad["hard.md"].startswith("hard link (2 names for one file): not read")
    assert bad["pipe.md"] == "not a regular file (a FIFO): not opened"
    assert bad["sock.md"] == "not a regular file (a socket): not opened"
    assert set(bad) == {"hard.md", "pipe.md", "sock.md"}


@pytest.mark.parametrize("swap", ["file-to-link", "folder-to-link", "file-to-fifo"])
def test_a_file_swapped_after_the_checks_is_not_followed(tmp_path, monkeypatch, swap):
    """The race the open guards against: the walk looked at sub/page.md, then, before the open,
    the file (or its folder) is replaced by a link out of the folder, or by a FIFO. Every
    component is opened with O_NOFOLLOW (and O_NONBLOCK), then checked again with fstat."""
    out = _outside(tmp_path)
    kb = tmp_path / "kb"
    (kb / "sub").mkdir(parents=True)
    (kb / "sub" / "page.md").write_text("# Page\n\nan ordinary page\n", encoding="utf-8")
    real_locate = readers._locate

    def locate_then_swap(real_root, parts):
        found = real_locate(real_root, parts)
        if swap == "file-to-link":
            (kb / "sub" / "page.md").unlink()
            os.symlink(out / "pages" / "secret.md", kb / "sub" / "page.md")
        elif swap == "folder-to-link":
            (kb / "sub").rename(tmp_path / "moved")
            (out / "pages" / "page.md").write_text(f"# Page\n\n{SECRET}\n", encoding="utf-8")
            os.symlink(out / "pages", kb / "sub")
        else:
            (kb / "sub" / "page.md").unlink()
            os.mkfifo(kb / "sub" / "page.md")
        return found

    monkeypatch.setattr(readers, "_locate", locate_then_swap)
    (item,) = _within(30, lambda: list(iter_documents([kb])))
    assert isinstance(item, BadFile), item
    if swap == "file-to-fifo":
        assert item.reason == "not a regular file (a FIFO): not opened"
    else:
        assert item.reason == "changed while being read (a path component became a symbolic link): not read"


def test_sync_lists_only_files_of_the_folder(tmp_path):
    """`ingest --sync` deletes documents whose file is not in list_source_files: refused entries
    are not files of the folder; a broken link (an error, not a rule) still is one."""
    out = _outside(tmp_path)
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "good.md").write_text("# Good\n\ntext\n", encoding="utf-8")
    os.symlink(out / "keys" / "audit.key", kb / "leak.txt")
    os.link(out / "pages" / "secret.md", kb / "hard.md")
    os.mkfifo(kb / "pipe.md")
    os.symlink("gone.md", kb / "dangling.md")
    assert list_source_files(kb) == ["dangling.md", "good.md"]


def test_sync_reports_the_links_and_deletes_what_an_older_version_read_through_them(
        app_conn, tenant, embedder, settings, tmp_path):
    out = _outside(tmp_path)
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "good.md").write_text("# Good\n\nThe grommetry page.\n", encoding="utf-8")
    os.symlink(out / "keys" / "audit.key", kb / "leak.txt")
    os.symlink("/etc/passwd", kb / "passwd.md")
    (kb / "bomb.docx").write_bytes(docx_bomb(30 * MIB, distinct=1))
    # what the readers before this rule made of the folder: the key file as a document
    ingest_documents(app_conn, tenant, [SourceDoc("leak.txt", "leak", f"{SECRET} 3f9a0c", "en")], embedder, settings)
    assert _lexical_uris(app_conn, tenant, SECRET) == {"leak.txt"}

    report = sync_folder(app_conn, tenant, kb, embedder, settings)

    assert {Path(b.path).name: b.reason.split(":")[0] for b in report.bad_files} == {
        "leak.txt": "symbolic link to a file outside the folder given",
        "passwd.md": "symbolic link to a file outside the folder given",
        "bomb.docx": "too large when expanded"}
    assert report.deleted == ["leak.txt"]
    assert _uris(app_conn, tenant) == {"good.md"}
    assert _lexical_uris(app_conn, tenant, SECRET) == set()
    assert _lexical_uris(app_conn, tenant, "root") == set()


# --------------------------------------------------------------------------- converters

MIB = 1024 * 1024


def docx_bomb(xml_bytes: int, *, distinct: int) -> bytes:
    """make_docx's document with a word/document.xml of about *xml_bytes* of paragraphs, cycling
    through *distinct* different ones: 1 compresses about 700 times, 10**6 about 25 times."""
    base = zipfile.ZipFile(io.BytesIO(make_docx([(None, "seed")])))
    para = "<w:p><w:r><w:t>quarterly report line %d of the appendix</w:t></w:r></w:p>"
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in base.infolist():
            data = base.read(info.filename)
            if info.filename == "word/document.xml":
                head, tail = data.decode().split("<w:body>")
                n = xml_bytes // len(para % 10**5)
                data = (head + "<w:body>" + "".join(para % (i % distinct) for i in range(n)) + tail).encode()
            z.writestr(info.filename, data)
    return out.getvalue()


def docx_with(extra: dict[str, bytes]) -> bytes:
    """make_docx's document plus extra members (stored as given, deflated)."""
    base = zipfile.ZipFile(io.BytesIO(make_docx([(None, "Quillwort extra members")])))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
        for info in base.infolist():
            z.writestr(info.filename, base.read(info.filename))
        for name, data in extra.items():
            z.writestr(name, data)
    return out.getvalue()


def pdf_inflating_to(n_bytes: int) -> bytes:
    """A one-page PDF whose content stream is a FlateDecode stream of *n_bytes* ("0 0 0 ..."),
    compressed here in pieces: the file is a few hundred KiB, pdfminer inflates it whole."""
    comp = zlib.compressobj(9)
    piece = b"0 " * (MIB // 2)
    stream = b"".join(comp.compress(piece) for _ in range(n_bytes // MIB)) + comp.flush()
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R >>",
            b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream"]
    pdf = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, obj in enumerate(objs, 1):
        offsets.append(len(pdf))
        pdf += b"%d 0 obj\n" % i + obj + b"\nendobj\n"
    xref = len(pdf)
    pdf += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    pdf += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    pdf += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(pdf)


def spinning_html() -> str:
    """8 MiB of small elements: html.parser and markdownify take minutes over it."""
    return "<html><body>" + "<div><b>x</b> <i>y</i></div>" * 300_000 + "</body></html>"


@pytest.fixture
def no_conversion(monkeypatch):
    """Fails the test when a file reaches the converter: the checks before it must refuse it."""
    def refuse(self, kind, extension, data):
        raise AssertionError(f"a {kind} file reached the converter")
    monkeypatch.setattr(readers.Sandbox, "convert", refuse)


def test_docx_zip_bombs_are_refused_before_conversion(tmp_path, no_conversion):
    kb = tmp_path / "kb"
    kb.mkdir()
    # the review's file: tens of MB of repeated XML, compressed to a few dozen KiB
    (kb / "ratio.docx").write_bytes(docx_bomb(30 * MIB, distinct=1))
    (kb / "wide.docx").write_bytes(docx_with({f"word/media/part{i}.xml": b"<x/>" for i in range(40)}))
    (kb / "big.docx").write_bytes(docx_with({"word/media/image1.png": os.urandom(3 * MIB)}))  # ratio 1
    (kb / "note.md").write_text("# Note\n\nstill read\n", encoding="utf-8")
    limits = ReadLimits(max_zip_members=30, max_expanded_bytes=2 * MIB)
    assert len((kb / "ratio.docx").read_bytes()) < 100 * 1024

    t0 = time.perf_counter()
    docs, bad = _split(iter_documents([kb], limits))
    assert time.perf_counter() - t0 < 10

    assert set(docs) == {"note.md"}
    assert bad["ratio.docx"].startswith("too large when expanded: member 'word/document.xml' expands ")
    assert "KB_INGEST_MAX_ZIP_RATIO" in bad["ratio.docx"]
    assert bad["wide.docx"] == "too many members in the archive: 45 (limit 30, KB_INGEST_MAX_ZIP_MEMBERS)"
    assert bad["big.docx"].startswith("too large when expanded: 3.0 MiB in 6 members (limit 2 MiB")


def test_one_hostile_file_per_converter_costs_one_bad_file_and_the_batch_goes_on(tmp_path):
    """A DOCX that passes the zip checks (8 MiB of XML, compressed 25 times) but keeps the
    converter busy, 8 MiB of HTML, and a 0.3 MiB PDF whose stream inflates to 256 MiB: each is
    killed at its limit, reported with it, and the ordinary fixtures around them convert."""
    kb = write_kb(tmp_path / "kb")
    (kb / "slow.docx").write_bytes(docx_bomb(8 * MIB, distinct=10**6))
    (kb / "spin.html").write_text(spinning_html(), encoding="utf-8")
    (kb / "inflate.pdf").write_bytes(pdf_inflating_to(256 * MIB))
    limits = ReadLimits(convert_timeout_s=5, convert_memory_mb=96)

    t0 = time.perf_counter()
    docs, bad = _split(iter_documents([kb], limits))
    elapsed = time.perf_counter() - t0

    assert set(docs) == GOOD
    assert "Export quillwort reports as CSV" in docs["export.docx"].text
    assert "Tighten the zephyrine gasket" in docs["manual.pdf"].text
    assert docs["hours.html"].title == "Brambleton opening hours"
    timed_out = "timed out after 5 s converting (KB_INGEST_CONVERT_TIMEOUT_S)"
    out_of_memory = "out of memory: the conversion needed more than 96 MB (KB_INGEST_CONVERT_MEMORY_MB)"
    # the two busy converters grow while they spin: which limit stops them first depends on the
    # machine's speed (a fast one reaches 96 MB within the 5 s); either is the kill at a limit
    busy = {name: bad.get(name) for name in ("slow.docx", "spin.html")}
    assert all(reason in (timed_out, out_of_memory) for reason in busy.values()), busy
    assert bad == {"broken.pdf": bad["broken.pdf"], "broken.docx": bad["broken.docx"], **busy,
                   "inflate.pdf": out_of_memory}
    # the helper's start (markitdown's import), two timeouts of 5 s and the ordinary files
    assert elapsed < 60


def test_text_over_the_limits_is_a_bad_file(tmp_path):
    kb = tmp_path / "kb"
    kb.mkdir()
    (kb / "long.md").write_text("# Long\n\n" + "word " * 400, encoding="utf-8")
    (kb / "huge.txt").write_bytes(b"x" * (MIB + 1))
    (kb / "long.html").write_text("<p>" + "word " * 400 + "</p>", encoding="utf-8")
    (kb / "short.md").write_text("# Short\n\nfine\n", encoding="utf-8")
    docs, bad = _split(iter_documents([kb], ReadLimits(max_chars=1000, max_file_bytes=MIB)))
    assert set(docs) == {"short.md"}
    assert bad == {
        "long.md": "text too long: 2008 characters (limit 1000, KB_INGEST_MAX_CHARS)",
        "huge.txt": "too large: more than 1 MiB (KB_INGEST_MAX_FILE_MB)",
        "long.html": "converted text too long: more than 1000 characters (KB_INGEST_MAX_CHARS)",
    }
