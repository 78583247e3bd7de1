"""Cutting a document's text into chunks (:func:`chunk_text`): heading- and paragraph-aware
packing, see the function's docstring. Pure Python."""

from __future__ import annotations

import bisect

from kb_rerank.core.markdown import heading as _heading, iter_lines_outside_fences as _iter_lines_outside_fences, normalise as _normalise


_SENTENCE_END = frozenset(".!?。")


def _check_args(max_chars: int, overlap: int) -> None:
    if max_chars < 100:
        raise ValueError(f"max_chars must be >= 100, got {max_chars}")
    if overlap < 0:
        raise ValueError(f"overlap must be >= 0, got {overlap}")
    if overlap >= max_chars:
        raise ValueError(f"overlap must be smaller than max_chars ({max_chars}), got {overlap}")


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """Split into (heading_line, body_lines); the preamble has heading ''."""
    lines = text.split("\n")
    sections: list[tuple[str, list[str]]] = [("", [])]
    for _, line, inside in _iter_lines_outside_fences(lines):
        if not inside and _heading(line) is not None:
            sections.append((line.strip(), []))
        else:
            sections[-1][1].append(line)
    return sections


def _paragraphs(lines: list[str]) -> list[str]:
    """Blank-line separated blocks; blank lines inside code fences do not split."""
    paras: list[str] = []
    current: list[str] = []
    for _, line, inside in _iter_lines_outside_fences(lines):
        if not inside and not line.strip():
            if current:
                paras.append("\n".join(current).strip("\n"))
                current = []
        else:
            current.append(line.rstrip())
    if current:
        paras.append("\n".join(current).strip("\n"))
    return [p for p in (q.strip() for q in paras) if p]


def _break_points(p: str) -> tuple[list[int], list[int]]:
    """Word-end positions e (p[e-1] not space, p[e] space): (strong, all).

    Strong breaks end a sentence (., !, ?, 。 before whitespace) or a line.
    """
    strong: list[int] = []
    weak: list[int] = []
    n = len(p)
    for e in range(1, n):
        if p[e].isspace() and not p[e - 1].isspace():
            weak.append(e)
            if p[e - 1] in _SENTENCE_END or p[e] == "\n":
                strong.append(e)
    return strong, weak


def _last_in(points: list[int], lo: int, hi: int) -> int | None:
    """Largest point with lo < point <= hi (points sorted)."""
    i = bisect.bisect_right(points, hi)
    if i and points[i - 1] > lo:
        return points[i - 1]
    return None


def _split_long(p: str, budget: int, overlap: int) -> list[str]:
    """Cut one paragraph into pieces of at most *budget* characters.

    Cuts at the last sentence/line end that keeps the piece at least a
    quarter full, else at the last whitespace, else (a single "word" longer
    than the budget, e.g. a huge URL) hard at the budget. Each next piece
    starts with at most *overlap* characters copied from the end of the
    previous one, beginning at a word start; the overlap is dropped when
    keeping it would force a cut inside a word.
    """
    strong, weak = _break_points(p)
    word_starts = [i for i in range(len(p)) if not p[i].isspace() and (i == 0 or p[i - 1].isspace())]

    def skip_space(i: int) -> int:
        while i < len(p) and p[i].isspace():
            i += 1
        return i

    pieces: list[str] = []
    start = 0
    prev_end = 0
    while start < len(p):
        if len(p) - start <= budget:
            pieces.append(p[start:].strip())
            break
        hi = start + budget
        lo = max(start, prev_end)  # the piece must bring something new
        end = _last_in(strong, max(lo, start + budget // 4), hi) or _last_in(weak, lo, hi)
        if end is None and start < prev_end:
            # keeping the overlap would cut the next word: drop the overlap
            start = skip_space(prev_end)
            continue
        if end is None:
            end = hi  # one unbreakable run longer than the budget
        pieces.append(p[start:end].strip())
        prev_end = end
        nxt = skip_space(end)
        if overlap > 0 and end < len(p):
            j = bisect.bisect_left(word_starts, end - overlap)
            if j < len(word_starts) and start < word_starts[j] < end:
                nxt = word_starts[j]
        start = nxt
    return [x for x in pieces if x]


def chunk_text(text: str, max_chars: int = 1200, overlap: int = 150) -> list[str]:
    """Cut *text* (Markdown or plain) into retrieval chunks of at most *max_chars*.

    * ``''`` / whitespace gives ``[]``; a text of at most *max_chars*
      (stripped) gives exactly ``[text.strip()]``.
    * Otherwise the text is split into sections at ATX headings (``#`` to
      ``######``, not inside code fences). Every chunk of a section starts
      with the section's heading line, so it carries its heading context; a
      heading with no body of its own (e.g. the ``# Title`` right before the
      first ``##``) is carried into the next section's chunks. A heading
      context longer than half of *max_chars* is not repeated; it then
      becomes ordinary text.
    * Whole paragraphs (blank-line separated; code fences stay whole) are
      packed greedily into chunks.
    * A paragraph that does not fit in a chunk on its own is cut at sentence
      ends (``.``, ``!``, ``?``, ``。`` followed by whitespace) or line ends,
      failing that at whitespace; each piece after the first repeats up to
      *overlap* characters from the end of the previous piece, starting at a
      word boundary. Only a single run of non-space characters longer than
      the available room is ever cut inside.

    Deterministic; never returns an empty chunk.

    Raises ValueError unless ``max_chars >= 100`` and ``0 <= overlap < max_chars``.
    """
    _check_args(max_chars, overlap)
    stripped = text.strip()
    if not stripped:
        return []
    if len(stripped) <= max_chars:
        return [stripped]

    chunks: list[str] = []
    pending: list[str] = []  # heading lines still waiting for body text
    for heading, lines in _sections(_normalise(stripped)):
        if heading:
            pending.append(heading)
        paras = _paragraphs(lines)
        if not paras:
            continue
        context = "\n\n".join(pending)
        pending = []
        if len(context) > max_chars // 2:
            paras = _paragraphs(context.split("\n")) + paras
            context = ""
        chunks.extend(_pack_section(context, paras, max_chars, overlap))
    if pending:
        # headings at the very end with no body: keep their text
        chunks.extend(_pack_section("", ["\n\n".join(pending)], max_chars, overlap))
    return [c for c in (c.strip() for c in chunks) if c]


def _pack_section(context: str, paras: list[str], max_chars: int, overlap: int) -> list[str]:
    """Greedy paragraph packing of one section; every chunk starts with *context*."""
    prefix = f"{context}\n\n" if context else ""
    budget = max_chars - len(prefix)
    piece_overlap = min(overlap, budget // 2)
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for para in paras:
        if len(para) > budget:
            if current:
                chunks.append(prefix + "\n\n".join(current))
                current, size = [], 0
            chunks.extend(prefix + piece for piece in _split_long(para, budget, piece_overlap))
            continue
        added = len(para) + (2 if current else 0)
        if current and size + added > budget:
            chunks.append(prefix + "\n\n".join(current))
            current, size = [para], len(para)
        else:
            current.append(para)
            size += added
    if current:
        chunks.append(prefix + "\n\n".join(current))
    return chunks
