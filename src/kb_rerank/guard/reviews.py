"""The SQL of the guard's review loop (``kb-rerank guard list / allow / block``), as the app
role inside the tenant's transaction (row-level security: a tenant sees and reviews only its
own chunks).

A review (``kb.guard_reviews``, migration 0018_guard_review) is keyed by the tenant and the
chunk text's content hash: it applies to every chunk of the tenant with that text, survives a
re-scan (``kb-rerank guard scan``) and a re-ingest that keeps the text, and a changed text is
judged afresh. The triggers of guard/sql/chunks_take_review.sql and
guard/sql/guard_reviews_apply.sql keep ``kb.chunks.injection_review`` equal to it; the update of a
reviewed chunk bumps the tenant's knowledge-base generation, so no answer cached before the
review is served after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID


POLICY_SQL = "select injection_policy from kb.tenant_policy where tenant_id = kb.current_tenant()"
DEFAULT_POLICY = "exclude"
REVIEWS = ("allow", "block")  # what a person may record of a chunk (kb.chunks.injection_review)
POLICIES = ("exclude", "demote", "allow")


def policy_of(row) -> str:
    """The tenant's injection policy from :data:`POLICY_SQL`'s row (none: the default)."""
    return row[0] if row and row[0] in POLICIES else DEFAULT_POLICY


async def atenant_policy(conn) -> str:
    """The injection policy of the transaction's tenant (``exclude`` without a row)."""
    cur = await conn.execute(POLICY_SQL)
    return policy_of(await cur.fetchone())


@dataclass(frozen=True)
class ChunkGuard:
    """One chunk as ``guard list`` shows it, and as ``guard allow / block`` marks it."""

    chunk_id: UUID
    doc_id: UUID
    doc_title: str
    source_uri: str
    position: int
    injection_flag: bool
    injection_strong: bool
    injection_score: float
    injection_reasons: list[str]
    review: str | None  # allow | block | None
    note: str | None
    reviewed_at: datetime | None
    reviewed_by: str | None


_CHUNK_COLUMNS = (
    "c.chunk_id, c.doc_id, d.title, d.source_uri, c.position, c.injection_flag, c.injection_strong,"
    " c.injection_score, c.injection_reasons, c.injection_review, r.note, r.reviewed_at, r.reviewed_by"
    " from kb.chunks c"
    " join kb.documents d on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id"
    " left join kb.guard_reviews r on r.tenant_id = c.tenant_id and r.content_hash = c.content_hash"
)

LIST_SQL = (
    "select " + _CHUNK_COLUMNS
    + " where %(all)s or c.injection_flag or c.injection_review is not null"
    " order by d.source_uri, c.position"
)


def _chunk(r) -> ChunkGuard:
    return ChunkGuard(r[0], r[1], r[2], r[3], int(r[4]), bool(r[5]), bool(r[6]), float(r[7] or 0.0),
                      list(r[8] or []), r[9], r[10], r[11], r[12])


async def list_chunks(conn, *, every: bool = False) -> list[ChunkGuard]:
    """The transaction's tenant's chunks that are flagged or reviewed (every chunk with
    ``every``), by source and position."""
    return [_chunk(r) for r in await (await conn.execute(LIST_SQL, {"all": every})).fetchall()]


class UnknownTarget(LookupError):
    """``guard allow / block`` of a document or chunk id the tenant does not have."""


TARGET_SQL = (
    "select c.content_hash, " + _CHUNK_COLUMNS
    + " where (%(doc)s::uuid is not null and c.doc_id = %(doc)s::uuid)"
    " or (%(chunk)s::uuid is not null and c.chunk_id = %(chunk)s::uuid)"
    " order by d.source_uri, c.position"
)

# One row per text (a statement cannot upsert the same key twice); its chunk and document
# as named by the person (the first chunk with that text in the target, in position order).
RECORD_SQL = (
    "insert into kb.guard_reviews as g (tenant_id, content_hash, decision, doc_id, chunk_id, note, reviewed_by)"
    " select kb.current_tenant(), t.content_hash, %(decision)s, t.doc_id, t.chunk_id, %(note)s, %(by)s"
    " from unnest(%(hashes)s::text[], %(docs)s::uuid[], %(chunks)s::uuid[]) as t(content_hash, doc_id, chunk_id)"
    " on conflict (tenant_id, content_hash) do update"
    " set decision = excluded.decision, doc_id = excluded.doc_id, chunk_id = excluded.chunk_id,"
    " note = excluded.note, reviewed_at = now(), reviewed_by = excluded.reviewed_by"
)


async def record_review(conn, decision: str, *, doc_id: UUID | str | None = None,
                  chunk_id: UUID | str | None = None, note: str | None = None,
                  reviewed_by: str | None = None) -> list[ChunkGuard]:
    """Record ``decision`` (``allow`` | ``block``) for every chunk of document ``doc_id``, or
    for chunk ``chunk_id``, of the transaction's tenant; returns the chunks marked, as they
    are now. Raises :class:`UnknownTarget` (nothing written) when the tenant has no such
    document or chunk, ValueError naming the argument for a bad decision or target."""
    if decision not in REVIEWS:
        raise ValueError(f"decision must be one of {', '.join(REVIEWS)}, got {decision!r}")
    if (doc_id is None) == (chunk_id is None):
        raise ValueError("give exactly one of doc_id, chunk_id")
    params = {"doc": None if doc_id is None else str(UUID(str(doc_id))),
              "chunk": None if chunk_id is None else str(UUID(str(chunk_id)))}
    rows = await (await conn.execute(TARGET_SQL, params)).fetchall()
    if not rows:
        what = f"document {doc_id}" if doc_id is not None else f"chunk {chunk_id}"
        raise UnknownTarget(f"no {what}")
    first: dict[str, tuple[UUID, UUID]] = {}
    for r in rows:
        first.setdefault(r[0], (r[2], r[1]))  # content_hash -> (doc_id, chunk_id)
    await conn.execute(RECORD_SQL, {"decision": decision, "note": note, "by": reviewed_by or "unknown",
                              "hashes": list(first), "docs": [d for d, _ in first.values()],
                              "chunks": [c for _, c in first.values()]})
    return [_chunk(r[1:]) for r in await (await conn.execute(TARGET_SQL, params)).fetchall()]
