"""Reads of the current tenant's documents and chunks outside the request path (``kb-rerank
eval``'s scratch tenants), inside the caller's tenant transaction."""

from __future__ import annotations

from typing import Any

from kb_rerank.candidate import Candidate, from_row

COUNT = "select count(*) from kb.documents"
SOURCES = "select doc_id, source_uri from kb.documents"
CHUNKS_OF = (
    "select c.chunk_id, c.doc_id, d.title, left(c.content, 300), c.content"
    " from kb.chunks c join kb.documents d on d.doc_id = c.doc_id and d.tenant_id = c.tenant_id"
    " where c.doc_id = any(%s) order by c.doc_id, c.position"
)


def count(conn) -> int:
    return conn.execute(COUNT).fetchone()[0]


def sources(conn) -> list[tuple[Any, str]]:
    """(doc_id, source_uri) of every document."""
    return conn.execute(SOURCES).fetchall()


def chunks_of(conn, doc_ids: list[Any]) -> list[Candidate]:
    """The chunks of these documents, in order, as candidates (no first-stage score)."""
    return [from_row(*r, 0.0) for r in conn.execute(CHUNKS_OF, [doc_ids]).fetchall()]
