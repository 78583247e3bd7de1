"""Reading knowledge-base documents from disk (the chunker is :mod:`kb_rerank.ingest.chunking`).

Long on purpose: Markdown, text, converted (HTML, PDF, DOCX) and BEIR readers share the
front-matter, decoding and bad-file rules written here once.

No database. Front matter is YAML (PyYAML); HTML, PDF and DOCX are converted to Markdown by
markitdown's converters (the ``files`` extra), imported only when such a file is read.

Reading (:func:`iter_documents`)
    Accepts files and folders. Folders are walked recursively in sorted order
    (hidden files and folders, whose names start with ``.``, are skipped) and
    yield every ``*.md``, ``*.markdown``, ``*.txt``, ``*.html``, ``*.htm``,
    ``*.pdf`` and ``*.docx`` file plus every file named ``corpus.jsonl`` (a
    BEIR corpus, one JSON object per line). The reader is chosen by the
    extension. Every problem that concerns one file or one line (binary
    content, invalid UTF-8, empty file, unreadable file, corrupt PDF/DOCX, no
    text extracted, bad JSON line, bad front matter, the ``files`` extra not
    installed) is yielded as a :class:`BadFile` and the iteration goes on with
    the next file.

Language guess (:func:`guess_language`)
    ``'vi'`` when letters that only Vietnamese uses (ă â đ ê ô ơ ư and the
    precomposed tone-marked vowels such as ạ ả ấ ề ộ ữ ỳ ...) make up at least
    2 % of the letters of the text, otherwise ``'en'``. Vietnamese prose has
    roughly a quarter of its letters in that set, English prose none, so a
    Vietnamese place name inside an English article ("Hà Nội") does not flip
    the guess. A front-matter ``language:`` always wins over the guess.
"""

from __future__ import annotations

import json
import math
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "BadFile",
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
    """

    source_uri: str
    title: str
    text: str
    language: str | None
    authority: float = 1.0


@dataclass(frozen=True)
class BadFile:
    """A file (or ``file:line`` of a corpus.jsonl) that could not be read."""

    path: str
    reason: str


# --------------------------------------------------------------------------
# language guess

# Letters used by Vietnamese and (practically) by no language we expect next
# to it in a help centre: the base letters ă â đ ê ô ơ ư and every
# precomposed vowel of the Latin Extended Additional block U+1EA0..U+1EF9
# (ạ ả ấ ầ ẩ ẫ ậ ắ ... ỳ ỵ ỷ ỹ). Plain à á è é ì í ò ó ù ú ý ã õ are left out
# on purpose: French, Spanish and Portuguese use them too.
_VI_LETTERS = frozenset(
    "ăâđêôơưĂÂĐÊÔƠƯ"
    + "".join(chr(c) for c in range(0x1EA0, 0x1EFA))
    + "ĩũĨŨ"  # i/u with tilde: Vietnamese ngã tone, not used in French/Spanish
)
_VI_MIN_SHARE = 0.02


def guess_language(text: str) -> str:
    """Return ``'vi'`` or ``'en'`` (see the module docstring for the rule)."""
    text = unicodedata.normalize("NFC", text)
    letters = 0
    vi = 0
    for ch in text:
        if ch.isalpha():
            letters += 1
            if ch in _VI_LETTERS:
                vi += 1
    if vi and vi >= _VI_MIN_SHARE * letters:
        return "vi"
    return "en"


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
# Markdown helpers shared by reading and chunking

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")


def _heading(line: str) -> tuple[int, str] | None:
    """(level, text) when *line* is an ATX heading, else None."""
    m = _HEADING.match(line)
    if m is None:
        return None
    title = (m.group(2) or "").strip()
    # optional closing sequence: "## Title ##"
    title = re.sub(r"(?:^|[ \t]+)#+$", "", title).strip()
    return len(m.group(1)), title


def _iter_lines_outside_fences(lines: list[str]) -> Iterator[tuple[int, str, bool]]:
    """Yield (index, line, inside_fence) for each line; fence lines count as inside."""
    fence: str | None = None
    for i, line in enumerate(lines):
        m = _FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
                yield i, line, True
                continue
            yield i, line, False
        else:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip()[len(m.group(1)) :].strip():
                fence = None
            yield i, line, True


def _first_h1(text: str) -> str | None:
    lines = text.split("\n")
    for _, line, inside in _iter_lines_outside_fences(lines):
        if inside:
            continue
        h = _heading(line)
        if h and h[0] == 1 and h[1]:
            return h[1]
    return None


def _normalise(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)


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


def _read_text_file(path: Path, uri: str) -> SourceDoc | BadFile:
    where = str(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return BadFile(where, f"unreadable: {exc.strerror or exc}")
    if b"\x00" in data[:BINARY_SNIFF_BYTES]:
        return BadFile(where, "binary file (NUL byte in the first 8 KiB)")
    try:
        text = _decode(data)
    except UnicodeDecodeError as exc:
        return BadFile(where, _utf8_reason(exc))
    text = _normalise(text)
    if not text.strip():
        return BadFile(where, "empty or whitespace-only file")

    meta: dict[str, Any] = {}
    authority = 1.0
    fm_title = fm_language = ""
    if path.suffix.lower() in MARKDOWN_SUFFIXES:
        try:
            meta, text = parse_front_matter(text)
            authority = _authority_from(meta)
            fm_title = _meta_str(meta, "title")
            fm_language = _meta_str(meta, "language").lower()
        except FrontMatterError as exc:
            return BadFile(where, str(exc))
    body = text.strip()
    if not body:
        return BadFile(where, "no text after the front matter")

    title = _first_h1(body) or fm_title or path.stem
    language = fm_language or guess_language(body)
    return SourceDoc(source_uri=uri, title=title, text=body, language=language, authority=authority)


_CONVERTERS: dict[str, Any] = {}


def _converter(kind: str):
    """markitdown's converter for ``kind`` (html, pdf, docx), built once. Called directly rather
    than through ``MarkItDown.convert``: that one falls back to reading a corrupt PDF as plain text."""
    conv = _CONVERTERS.get(kind)
    if conv is None:
        from kb_rerank.extras import require

        converters = require("markitdown.converters", "files", f"reading {kind.upper()} files")
        conv = {"html": converters.HtmlConverter, "pdf": converters.PdfConverter,
                "docx": converters.DocxConverter}[kind]()
        _CONVERTERS[kind] = conv
    return conv


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."


def _read_converted(path: Path, uri: str, kind: str) -> SourceDoc | BadFile:
    """An HTML, PDF or DOCX file, converted to Markdown (headings kept, so the chunker can
    split at them); title = the HTML ``<title>``, else the first ``# `` heading, else the stem."""
    where = str(path)
    try:
        conv = _converter(kind)
    except ImportError as exc:  # MissingExtra: names the extra to install
        return BadFile(where, str(exc))
    try:
        data = path.read_bytes()
    except OSError as exc:
        return BadFile(where, f"unreadable: {exc.strerror or exc}")
    if not data.strip():
        return BadFile(where, "empty file")
    import io

    from markitdown import StreamInfo

    try:
        result = conv.convert(io.BytesIO(data), StreamInfo(extension=path.suffix.lower(), local_path=where))
    except Exception as exc:  # noqa: BLE001 - a corrupt file makes the parsers raise anything; reported, batch goes on
        return BadFile(where, f"cannot read {kind.upper()}: {type(exc).__name__}: {_short(exc)}")
    body = _normalise(result.markdown or "").strip()
    if not body:
        reason = "no text extracted" + (" (a scanned PDF without a text layer?)" if kind == "pdf" else "")
        return BadFile(where, reason)
    title = " ".join((getattr(result, "title", None) or "").split()) or _first_h1(body) or path.stem
    return SourceDoc(source_uri=uri, title=title, text=body, language=guess_language(body))


def _read_beir_corpus(path: Path) -> Iterator[SourceDoc | BadFile]:
    where = str(path)
    try:
        fh = path.open("rb")
    except OSError as exc:
        yield BadFile(where, f"unreadable: {exc.strerror or exc}")
        return
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
            yield from _parse_beir_line(raw, f"{where}:{lineno}", first=lineno == 1)


def _parse_beir_line(raw: bytes, where: str, *, first: bool) -> Iterator[SourceDoc | BadFile]:
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
        language=guess_language(f"{title}\n{text}"),
    )


def _is_hidden(name: str) -> bool:
    return name.startswith(".")


def _walk(root: Path) -> list[Path]:
    found: list[tuple[tuple[str, ...], Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not _is_hidden(d))
        base = Path(dirpath)
        for name in filenames:
            if _is_hidden(name):
                continue
            lower = name.lower()
            if lower == BEIR_CORPUS_NAME or Path(lower).suffix in DOCUMENT_SUFFIXES:
                p = base / name
                found.append((p.relative_to(root).parts, p))
    found.sort(key=lambda item: item[0])
    return [p for _, p in found]


def _read_one(path: Path, uri: str, *, explicit: bool) -> Iterator[SourceDoc | BadFile]:
    lower = path.name.lower()
    if lower == BEIR_CORPUS_NAME or (explicit and lower.endswith(".jsonl")):
        yield from _read_beir_corpus(path)
    elif path.suffix.lower() in TEXT_SUFFIXES:
        yield _read_text_file(path, uri)
    elif path.suffix.lower() in CONVERTED_SUFFIXES:
        yield _read_converted(path, uri, CONVERTED_SUFFIXES[path.suffix.lower()])
    else:
        yield BadFile(str(path), f"unsupported file type {path.suffix or '(no extension)'!r}")


def iter_documents(paths: Iterable[str | Path]) -> Iterator[SourceDoc | BadFile]:
    """Yield a :class:`SourceDoc` per readable document, a :class:`BadFile` per problem.

    Each entry of *paths* is a file or a folder. Folders are walked
    recursively (sorted by relative path, hidden entries skipped) for
    ``*.md``, ``*.markdown``, ``*.txt``, ``*.html``, ``*.htm``, ``*.pdf``,
    ``*.docx`` and ``corpus.jsonl``; a file given directly is read if it has
    one of those suffixes (any ``*.jsonl`` given directly is read as a BEIR
    corpus).

    Markdown/text: title = first ``# `` heading, else front-matter
    ``title:``, else the file stem; ``source_uri`` = path relative to the
    given folder (posix), or the file name for a file given directly.
    Front matter (YAML; ``title``, ``authority``, ``language`` are used, other
    keys such as ``tags: [a, b]`` are accepted and ignored) is only parsed for
    Markdown files. HTML/PDF/DOCX: converted to Markdown, same ``source_uri``
    rule. BEIR lines: ``source_uri = 'beir:<_id>'``, ``title`` and
    ``text`` taken as they are; a line with neither title nor text is bad.
    """
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
            for file in _walk(path):
                yield from _read_one(file, file.relative_to(path).as_posix(), explicit=False)
        else:
            yield from _read_one(path, path.name, explicit=True)


def list_source_files(folder: str | Path) -> list[str]:
    """The ``source_uri`` of every file :func:`iter_documents` would read from *folder*
    (posix paths relative to it, the same walk), readable or not; BEIR corpora excluded
    (their documents are ``beir:<_id>``, not files)."""
    root = Path(folder)
    return [p.relative_to(root).as_posix() for p in _walk(root) if p.name.lower() != BEIR_CORPUS_NAME]
