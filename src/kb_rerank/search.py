"""Python side of the search functions: one call each to kb.search_lexical,
kb.search_semantic and kb.search_hybrid, inside the caller's tenant transaction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import UUID

import numpy as np


@dataclass(frozen=True)
class Candidate:
    chunk_id: UUID
    doc_id: UUID
    doc_title: str
    snippet: str
    content: str
    score: float  # fused score (hybrid) or the list's own score
    lexical_rank: int | None = None
    semantic_rank: int | None = None
    lexical_score: float | None = None
    semantic_score: float | None = None


LEXICAL_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, score, rank"
    " from kb.search_lexical(%s, %s, %s, %s)"
)
SEMANTIC_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, score, rank"
    " from kb.search_semantic(%s::vector, %s)"
)
HYBRID_SQL = (
    "select chunk_id, doc_id, doc_title, snippet, content, lexical_rank, semantic_rank,"
    " lexical_score, semantic_score, score"
    " from kb.search_hybrid(%s, %s::vector, %s, %s, %s, %s, %s)"
)


def _lexical_rows(rows) -> list[Candidate]:
    return [Candidate(r[0], r[1], r[2], r[3], r[4], r[5], lexical_rank=r[6], lexical_score=r[5]) for r in rows]


def _semantic_rows(rows) -> list[Candidate]:
    return [Candidate(r[0], r[1], r[2], r[3], r[4], r[5], semantic_rank=r[6], semantic_score=r[5]) for r in rows]


def _hybrid_rows(rows) -> list[Candidate]:
    return [Candidate(r[0], r[1], r[2], r[3], r[4], r[9], r[5], r[6], r[7], r[8]) for r in rows]


def _vec(embedding: Any) -> np.ndarray:
    return np.asarray(embedding, dtype=np.float32).reshape(-1)


def lexical(conn, query: str, k: int = 20, *, k1: float = 1.2, b: float = 0.75) -> list[Candidate]:
    return _lexical_rows(conn.execute(LEXICAL_SQL, [query, k, k1, b]).fetchall())


def semantic(conn, embedding, k: int = 20) -> list[Candidate]:
    return _semantic_rows(conn.execute(SEMANTIC_SQL, [_vec(embedding), k]).fetchall())


def hybrid(conn, query: str, embedding, k: int = 20, *, rrf_k: int = 60, fusion: str = "rrf",
           lexical_weight: float = 1.0, semantic_weight: float = 1.0) -> list[Candidate]:
    return _hybrid_rows(
        conn.execute(HYBRID_SQL, [query, _vec(embedding), k, rrf_k, fusion, lexical_weight, semantic_weight]).fetchall()
    )


async def alexical(conn, query: str, k: int = 20, *, k1: float = 1.2, b: float = 0.75) -> list[Candidate]:
    cur = await conn.execute(LEXICAL_SQL, [query, k, k1, b])
    return _lexical_rows(await cur.fetchall())


async def asemantic(conn, embedding, k: int = 20) -> list[Candidate]:
    cur = await conn.execute(SEMANTIC_SQL, [_vec(embedding), k])
    return _semantic_rows(await cur.fetchall())


async def ahybrid(conn, query: str, embedding, k: int = 20, *, rrf_k: int = 60, fusion: str = "rrf",
                  lexical_weight: float = 1.0, semantic_weight: float = 1.0) -> list[Candidate]:
    cur = await conn.execute(HYBRID_SQL, [query, _vec(embedding), k, rrf_k, fusion, lexical_weight, semantic_weight])
    return _hybrid_rows(await cur.fetchall())
