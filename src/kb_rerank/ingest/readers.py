"""Reading knowledge-base documents from disk (the chunker is :mod:`kb_rerank.ingest.chunking`).

Long on purpose: Markdown, text and BEIR readers share the front-matter, decoding and
bad-file rules written here once.

Pure Python, no database and no third-party dependency.

Reading (:func:`iter_documents`)
    Accepts files and folders. Folders are walked recursively in sorted order
    (hidden files and folders, whose names start with ``.``, are skipped) and
    yield every ``*.md``, ``*.markdown`` and ``*.txt`` file plus every file
    named ``corpus.jsonl`` (a BEIR corpus, one JSON object per line). Every
    problem that concerns one file or one line (binary content, invalid UTF-8,
    empty file, unreadable file, bad JSON line, bad front matter) is yielded
    as a :class:`BadFile` and the iteration goes on with the next file.

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

__all__ = [
    "BadFile",
    "SourceDoc",
    "guess_language",
    "iter_documents",
    "parse_front_matter",
]

TEXT_SUFFIXES = frozenset({".md", ".markdown", ".txt"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
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


_FM_KEY = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)\s*:\s*(.*?)\s*$")
_FM_MAX_LINES = 100


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse_front_matter(text: str) -> tuple[dict[str, str], str]:
    """Split ``---``-delimited front matter off the top of a Markdown text.

    A deliberately tiny parser for flat ``key: value`` lines (values may be
    quoted with ``'`` or ``"``; blank lines and ``#`` comments are ignored;
    keys are lower-cased). Nested YAML, lists and multi-line values are not
    supported; such lines raise :class:`FrontMatterError`. Text that does
    not start with a ``---`` line, or whose block is not closed by another
    ``---`` (or ``...``) within the first 100 lines, has no front matter and
    is returned unchanged.
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
    meta: dict[str, str] = {}
    for lineno, line in enumerate(lines[1:end], start=2):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        m = _FM_KEY.match(stripped)
        if m is None or line[:1].isspace():
            raise FrontMatterError(f"front matter line {lineno} is not a flat 'key: value' pair: {stripped!r}")
        meta[m.group(1).lower()] = _unquote(m.group(2))
    return meta, "\n".join(lines[end + 1 :])


def _authority_from(meta: dict[str, str]) -> float:
    raw = meta.get("authority")
    if raw is None or raw == "":
        return 1.0
    try:
        value = float(raw)
    except ValueError:
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

    meta: dict[str, str] = {}
    authority = 1.0
    if path.suffix.lower() in MARKDOWN_SUFFIXES:
        try:
            meta, text = parse_front_matter(text)
            authority = _authority_from(meta)
        except FrontMatterError as exc:
            return BadFile(where, str(exc))
    body = text.strip()
    if not body:
        return BadFile(where, "no text after the front matter")

    title = _first_h1(body) or meta.get("title", "").strip() or path.stem
    language = (meta.get("language") or "").strip().lower() or guess_language(body)
    return SourceDoc(source_uri=uri, title=title, text=body, language=language, authority=authority)


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
            if lower == BEIR_CORPUS_NAME or Path(lower).suffix in TEXT_SUFFIXES:
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
    else:
        yield BadFile(str(path), f"unsupported file type {path.suffix or '(no extension)'!r}")


def iter_documents(paths: Iterable[str | Path]) -> Iterator[SourceDoc | BadFile]:
    """Yield a :class:`SourceDoc` per readable document, a :class:`BadFile` per problem.

    Each entry of *paths* is a file or a folder. Folders are walked
    recursively (sorted by relative path, hidden entries skipped) for
    ``*.md``, ``*.markdown``, ``*.txt`` and ``corpus.jsonl``; a file given
    directly is read if it has one of those suffixes (any ``*.jsonl`` given
    directly is read as a BEIR corpus).

    Markdown/text: title = first ``# `` heading, else front-matter
    ``title:``, else the file stem; ``source_uri`` = path relative to the
    given folder (posix), or the file name for a file given directly.
    Front matter (``title``, ``authority``, ``language``) is only parsed for
    Markdown files. BEIR lines: ``source_uri = 'beir:<_id>'``, ``title`` and
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




