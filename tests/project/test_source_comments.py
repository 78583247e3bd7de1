"""Comments and docstrings under src/kb_rerank, tests/ and bench/ say what the code does now;
the history of a change (which issue asked for it) belongs in CHANGELOG.md and git log. No
database."""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "kb_rerank"
ISSUE = re.compile(r"\bissues? #?\d+|\bissue-\d+", re.IGNORECASE)


def _python_prose(text: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and of every string that is a statement of its own
    (docstrings)."""
    out: list[tuple[int, str]] = []
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    starts_line = True
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and starts_line:
            nxt = next((t for t in tokens[k + 1:] if t.type not in (tokenize.COMMENT, tokenize.NL)), None)
            if nxt is None or nxt.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
                out.append((tok.start[0], tok.string))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            starts_line = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return out


def _sql_comments(text: str) -> list[tuple[int, str]]:
    """(line, text) of every ``--`` comment and ``/* */`` block (outside quoted strings)."""
    out: list[tuple[int, str]] = []
    pattern = re.compile(r"""'(?:[^']|'')*'|"(?:[^"]|"")*"|(--[^\n]*)|(/\*.*?\*/)""", re.S)
    for m in pattern.finditer(text):
        comment = m.group(1) or m.group(2)
        if comment:
            out.append((text.count("\n", 0, m.start()) + 1, comment))
    return out


def _offenders(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix not in (".py", ".sql") or "__pycache__" in path.parts:
            continue
        text = path.read_text("utf-8")
        prose = _python_prose(text) if path.suffix == ".py" else _sql_comments(text)
        for line, chunk in prose:
            for m in ISSUE.finditer(chunk):
                found.append(f"{path.relative_to(root.parent)}:{line + chunk.count(chr(10), 0, m.start())}: "
                             f"{m.group(0)}")
    return found


def test_no_issue_numbers_in_source_comments():
    """A comment or docstring under src/kb_rerank (.py and .sql) that names an issue by its number
    tells the reader why the code once changed, not what it does: say what it does and why,
    and put the history in CHANGELOG.md."""
    offenders = _offenders(SRC)
    assert offenders == [], "comments naming an issue (move the history to CHANGELOG.md):\n" + "\n".join(offenders)


def test_no_issue_numbers_in_test_and_benchmark_comments():
    """The same rule for tests/ and bench/: a test's docstring states the behaviour it checks
    (a reader of a failure has the behaviour, not the issue tracker)."""
    offenders = _offenders(ROOT / "tests") + _offenders(ROOT / "bench")
    assert offenders == [], "comments naming an issue (state the behaviour instead):\n" + "\n".join(offenders)


def test_the_scan_finds_comments_and_docstrings_only(tmp_path):
    pkg = tmp_path / "kb_rerank"
    pkg.mkdir()

    def named(text: str) -> str:  # the word put in at run time: this file names no issue itself
        return text.replace("TKT", "issue").replace("Capital", "Issue")

    (pkg / "a.py").write_text(named('"""Module (Capital 7)."""\nx = "TKT 8 in a value"  # since TKT 9\n'
                                    'def f():\n    """Function, TKT 10."""\n    return "TKT 11"\n'), "utf-8")
    (pkg / "b.sql").write_text(named("-- TKT 12: a comment\nselect 'TKT 13 in a literal';\n"
                                     "/* block\n   TKT 14 */ select 1;\n"), "utf-8")
    (pkg / "c.md").write_text(named("TKT 15\n"), "utf-8")
    (pkg / "d.py").write_text(named('# TKTs 16 and 17, TKT #18, the TKT-19 inputs\nissue = 20  # an issue tracker\n'),
                              "utf-8")
    assert _offenders(pkg) == [named(x) for x in (
        "kb_rerank/a.py:1: Capital 7", "kb_rerank/a.py:2: TKT 9", "kb_rerank/a.py:4: TKT 10",
        "kb_rerank/b.sql:1: TKT 12", "kb_rerank/b.sql:4: TKT 14", "kb_rerank/d.py:1: TKTs 16",
        "kb_rerank/d.py:1: TKT #18", "kb_rerank/d.py:1: TKT-19")]
