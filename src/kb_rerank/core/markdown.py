"""Markdown line helpers shared by reading and chunking: ATX headings, fenced code blocks,
newline and Unicode (NFC) normalisation."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*$")


def heading(line: str) -> tuple[int, str] | None:
    """(level, text) when *line* is an ATX heading, else None."""
    m = _HEADING.match(line)
    if m is None:
        return None
    title = (m.group(2) or "").strip()
    # optional closing sequence: "## Title ##"
    title = re.sub(r"(?:^|[ \t]+)#+$", "", title).strip()
    return len(m.group(1)), title


def iter_lines_outside_fences(lines: list[str]) -> Iterator[tuple[int, str, bool]]:
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


def normalise(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return unicodedata.normalize("NFC", text)
