"""Digests of the frozen versioned migration files (db/migrations/frozen.sha256).

A shipped revision never changes what it executes, but its comments may be reworded: the
digest of a file is the SHA-256 of its text with the comments taken out (``--`` and ``/* */``
in SQL, ``#`` comments and docstrings in Python) and the lines left empty dropped. A change
to a statement changes the digest; a change to a comment does not.

Run from src/kb_rerank/:

    python -m kb_rerank.db.frozen db/schema/NNNN_* db/migrations/versions/NNNN_*.py >> db/migrations/frozen.sha256
    python -m kb_rerank.db.frozen --check     # every listed file against its digest
"""

from __future__ import annotations

import hashlib
import io
import re
import sys
import tokenize
from pathlib import Path

# One SQL token that can hold "--" or "/*" without starting a comment: a quoted string
# ('...' with '' inside, E'...' with \' inside), a quoted identifier, a dollar-quote delimiter.
# Dollar-quoted bodies are read as SQL (a function body's comments are comments too).
_SQL = re.compile(r"""(?P<keep>[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|"(?:[^"]|"")*"|\$[A-Za-z_0-9]*\$)"""
                  r"""|(?P<line>--[^\n]*)|(?P<block>/\*)""", re.S)


def strip_sql(text: str) -> str:
    """``text`` without its comments (block comments nest, as in PostgreSQL)."""
    out, i = [], 0
    while (m := _SQL.search(text, i)) is not None:
        out.append(text[i:m.start()])
        if m.group("keep"):
            out.append(m.group("keep"))
            i = m.end()
        elif m.group("line"):
            i = m.end()
        else:
            depth, j = 1, m.end()
            while depth and j < len(text):
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            i = j
    out.append(text[i:])
    return "".join(out)


def strip_python(text: str) -> str:
    """``text`` without its ``#`` comments and docstrings (a string that is a whole statement)."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    spans = []
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    starts_line = True  # the previous significant token ended a logical line
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            spans.append((tok.start, tok.end))
        elif tok.type == tokenize.STRING and starts_line:
            nxt = next((t for t in tokens[k + 1:] if t.type not in (tokenize.COMMENT, tokenize.NL)), None)
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                spans.append((tok.start, tok.end))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            starts_line = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    out, pos = [], 0
    for (r0, c0), (r1, c1) in spans:
        a, b = offsets[r0 - 1] + c0, offsets[r1 - 1] + c1
        out.append(text[pos:a])
        pos = b
    out.append(text[pos:])
    return "".join(out)


def digest(path: Path) -> str:
    """SHA-256 of the file's statements: comments out, trailing spaces and empty lines dropped."""
    text = path.read_text("utf-8")
    code = strip_python(text) if path.suffix == ".py" else strip_sql(text)
    kept = [line.rstrip() for line in code.splitlines() if line.strip()]
    return hashlib.sha256("\n".join(kept).encode("utf-8")).hexdigest()


def listed(frozen: Path) -> dict[str, str]:
    """The lines of ``frozen.sha256``: relative path -> digest."""
    out: dict[str, str] = {}
    for line in frozen.read_text("utf-8").splitlines():
        value, _, rel = line.partition("  ")
        if len(value) != 64 or not rel:
            raise ValueError(f"bad line in {frozen.name}: {line!r}")
        out[rel] = value
    return out


def _main(argv: list[str]) -> int:
    if argv == ["--check"]:
        changed = [rel for rel, value in listed(Path("db/migrations/frozen.sha256")).items()
                   if digest(Path(rel)) != value]
        for rel in changed:
            print(f"{rel}: CHANGED", file=sys.stderr)
        return 1 if changed else 0
    for name in argv:
        print(f"{digest(Path(name))}  {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
