"""Claims on misses being computed, shared by every app process (kb.kb_rerank_inflight,
migration 0013): single flight across app replicas.

Within one process concurrent identical misses already wait on one future
(:class:`kb_rerank.endpoints.runner.Pipeline`); this table extends that to every process on the
database. The process about to compute a key claims it (:func:`claim`, its own short
transaction, so others see the claim at once); another process that finds the key claimed
polls (:func:`claimed`) for the claimant's cache row and serves it as a hit, and computes
itself only when the claim is released with nothing cached (a fallback, an answer that is
not cacheable, a failure) or expires. The claimant releases its claim in the transaction that
writes its cache row (:func:`release`), so a waiter sees the row and the release together.
"""

from __future__ import annotations

import uuid

# an expired claim of the key (its process died) is removed before the new claim is tried
DELETE_EXPIRED = (
    "delete from kb.kb_rerank_inflight"
    " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s and generation = %s"
    "   and expires_at <= now()"
)
CLAIM = (
    "insert into kb.kb_rerank_inflight (tenant_id, query_hash, source, generation, claimant, expires_at)"
    " values (kb.current_tenant(), %s, %s, %s, %s, now() + make_interval(secs => %s))"
    " on conflict do nothing returning claimant"
)
CLAIMED = (
    "select exists (select from kb.kb_rerank_inflight"
    " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s and generation = %s"
    "   and expires_at > now())"
)
RELEASE = (
    "delete from kb.kb_rerank_inflight"
    " where tenant_id = kb.current_tenant() and query_hash = %s and source = %s and generation = %s"
    "   and claimant = %s"
)


async def claim(conn, query_hash: str, source: str, generation: int, claimant: uuid.UUID, ttl_s: float) -> bool:
    """Claim the key for ``ttl_s`` seconds in ``conn``'s tenant transaction; True when this
    caller holds it now, False when another live claim does. (Commit promptly: a concurrent
    claim of the same key waits on this transaction.) The claim is tried first: only when the
    key is held (live or expired) is its expired claim deleted and the claim tried again, so
    the usual miss (no claim on the key) costs one statement; the outcome is the same as
    deleting first."""
    args = [query_hash, source, generation, claimant, float(ttl_s)]
    cur = await conn.execute(CLAIM, args)
    if await cur.fetchone() is not None:
        return True
    await conn.execute(DELETE_EXPIRED, [query_hash, source, generation])
    cur = await conn.execute(CLAIM, args)
    return await cur.fetchone() is not None


async def claimed(conn, query_hash: str, source: str, generation: int) -> bool:
    """Whether a live claim on the key exists."""
    cur = await conn.execute(CLAIMED, [query_hash, source, generation])
    return bool((await cur.fetchone())[0])


async def release(conn, query_hash: str, source: str, generation: int, claimant: uuid.UUID) -> None:
    await conn.execute(RELEASE, [query_hash, source, generation, claimant])
