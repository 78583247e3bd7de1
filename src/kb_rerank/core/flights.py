"""Single flight: identical misses are computed once, in this process and across processes.

In process (:class:`Flights`): ``async with flights.lead(key) as flight:`` waits for a
request already computing ``key`` (at most three in turn), then leads it. ``flight.followed``
is the answer of the leader it waited for (None when it led at once, or the leader was
cancelled); a leader that failed makes its followers fail the same way at once (a database
outage costs them no second timeout). What the block sets as ``flight.outcome`` is what the
next followers get.

Across processes (:class:`Claim`, ``KB_SHARED_SINGLE_FLIGHT``; table kb.kb_rerank_inflight,
:mod:`kb_rerank.core.inflight`): a leader that misses claims the key in its lookup's
transaction. One that finds the key claimed by another process polls until that claim is
released or expires, then reads the cache again (the other process's row is a hit) and claims
afresh when there is none. The claim is released in the statement that records the answer
(kb.record_outcome), or, when the request fails first, in the background.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from kb_rerank.core import inflight
from kb_rerank.core.session import atenant_transaction

log = logging.getLogger(__name__)


@dataclass
class Flight:
    followed: Any = None  # the outcome of the leader this request waited for
    outcome: Any = None  # set by the leader: what its followers share


class Flights:
    """The keys being computed in this process, each with the future its followers await."""

    def __init__(self) -> None:
        self._running: dict[Any, asyncio.Future] = {}

    def __len__(self) -> int:
        return len(self._running)

    @contextlib.asynccontextmanager
    async def lead(self, key: Any) -> AsyncIterator[Flight]:
        flight = Flight()
        for _ in range(3):
            pending = self._running.get(key)
            if pending is None:
                break
            flight.followed = await asyncio.shield(pending)
            if isinstance(flight.followed, Exception):
                raise flight.followed  # the leader failed: fail the same way now
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._running[key] = fut
        failure: Exception | None = None
        try:
            yield flight
        except Exception as exc:
            failure = exc
            raise
        finally:
            if self._running.get(key) is fut:
                del self._running[key]
            if not fut.done():  # cancelled: None, and the followers compute
                fut.set_result(failure if failure is not None else flight.outcome)


@dataclass
class Claim:
    """This request's claim on a missed key, shared by every process on the database."""

    source: str
    ttl_s: float  # how long a claim lives, and the longest a waiter waits
    poll_s: float
    claimant: uuid.UUID = field(default_factory=uuid.uuid4)
    held: bool = False
    contended: bool = False  # another live claim holds the key
    key: tuple[str, int] | None = None  # (query hash, generation) tried last
    deadline: float = 0.0

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.ttl_s

    async def take(self, conn, query_hash: str, generation: int) -> None:
        """Try the claim in ``conn``'s tenant transaction (the lookup's)."""
        self.key = (query_hash, generation)
        self.held = await inflight.claim(conn, query_hash, self.source, generation, self.claimant, self.ttl_s)
        self.contended = not self.held

    async def wait_released(self, connection: Callable[[], Any], tenant: Any) -> bool:
        """Poll until the other process's claim is gone (True), or False once a claim's
        lifetime has passed (then this request computes without one)."""
        assert self.key is not None
        log.info("single flight: key claimed by another process source=%s tenant=%s query_hash=%s",
                 self.source, tenant, self.key[0])
        while time.monotonic() < self.deadline:
            await asyncio.sleep(self.poll_s)
            async with connection() as conn:
                async with atenant_transaction(conn, tenant):
                    busy = await inflight.claimed(conn, self.key[0], self.source, self.key[1])
            if not busy:
                return True
        self.contended = False
        return False

    async def release(self, connection: Callable[[], Any], tenant: Any) -> None:
        """Give the key up (the request failed before recording): the others compute now."""
        if not self.held or self.key is None:
            return
        self.held = False
        try:
            async with connection() as conn:
                async with atenant_transaction(conn, tenant):
                    await inflight.release(conn, self.key[0], self.source, self.key[1], self.claimant)
        except Exception as exc:  # noqa: BLE001 - the claim expires on its own
            log.warning("could not release a single-flight claim: %s", type(exc).__name__)
