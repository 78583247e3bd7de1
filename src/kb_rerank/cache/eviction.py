"""Eviction of expired cache rows of every tenant (``kb.evict_expired_cache``, owned by
kb_maint): ``kb-rerank evict`` and the app's eviction task. Runs as the maintenance role or
the owner, outside any tenant transaction; the app role may not run it."""

from __future__ import annotations

EVICT = "select kb.evict_expired_cache(%s)"


def evict_expired(conn, batch: int) -> int:
    """Delete up to ``batch`` expired rows; returns how many went."""
    return conn.execute(EVICT, [batch]).fetchone()[0] or 0


EVICT_DEFAULT = "select kb.evict_expired_cache()"


async def aevict_expired(conn) -> int:
    """The app's eviction task: the function's default batch; returns how many went."""
    return (await (await conn.execute(EVICT_DEFAULT)).fetchone())[0] or 0
