"""Reads on hot standbys (``KB_READ_DATABASE_URL``).

Candidate retrieval (the search functions, chunk details, curated lists) only reads, so it may
run on a streaming standby; the result cache, the pair scores and the audit stay on the
primary (they are written, or read to decide a write). RLS and the tenant setting work the
same on a standby: a request's read is one read-only transaction with ``auth.tenant_id`` set
locally, as on the primary.

A standby serves reads while it is reachable, in recovery, and no more than
``KB_MAX_REPLICA_LAG_S`` behind the primary. Lag is measured by WAL position, not by the time
of the last replayed transaction (which grows on an idle primary although nothing is
missing): every ``KB_REPLICA_CHECK_INTERVAL_S`` the checker samples the primary's
``pg_current_wal_lsn()`` and keeps the samples of the last few lag windows; a standby's lag is
the age of the newest sample that its ``pg_last_wal_replay_lsn()`` has reached (0 when it has
reached the one just taken). A standby that fails a check, or a read, serves nothing until a
later check finds it healthy; the read that failed is run again on the primary, so a client
never sees a standby's failure.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import psycopg

log = logging.getLogger(__name__)

_PRIMARY_LSN = "select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
_STANDBY_LSN = ("select pg_is_in_recovery(),"
                " pg_wal_lsn_diff(coalesce(pg_last_wal_replay_lsn(), '0/0'), '0/0')::bigint")

# Errors after which a read is retried on the primary: the standby's connection or server
# failed (OperationalError, which includes a cancelled statement), the pool had no connection
# in time, or replay cancelled the query (a recovery conflict is a serialization failure).
try:
    from psycopg_pool import PoolTimeout
except ImportError:  # pragma: no cover - psycopg_pool is a dependency of the app
    PoolTimeout = TimeoutError  # type: ignore[misc,assignment]
RETRY_ON_PRIMARY = (psycopg.OperationalError, psycopg.errors.SerializationFailure, PoolTimeout)


class StandbyBehind(Exception):
    """Raised by a read that finds the standby has not replayed what it needs yet (the
    tenant's generation the request was keyed on): the read runs on the primary instead,
    and the standby stays in service."""


GENERATION = "select coalesce((select generation from kb.kb_generation where tenant_id = kb.current_tenant()), 0)"


async def replayed_generation(conn) -> int:
    """The tenant's knowledge-base generation as this server (a standby) has replayed it."""
    return (await (await conn.execute(GENERATION)).fetchone())[0]


def label(url: str) -> str:
    """A standby's name for logs and /readyz: host (or socket folder), port and database,
    never the credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if not host:
        from urllib.parse import parse_qs

        host = (parse_qs(parts.query).get("host") or [""])[0]
    return f"{host}:{parts.port or 5432}{parts.path}"


@dataclass
class Standby:
    url: str
    name: str
    pool: Any
    healthy: bool = False
    lag_s: float | None = None
    error: str | None = None
    caught_up_at: float | None = None  # monotonic time of the newest primary sample replayed

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "healthy": self.healthy,
                "lag_s": None if self.lag_s is None else round(self.lag_s, 3), "error": self.error}


@dataclass
class ReadReplicas:
    """The standbys, their health, and the choice of where a read runs."""

    standbys: list[Standby]
    primary_pool: Any
    max_lag_s: float
    interval_s: float
    check_timeout_s: float = 2.0
    _samples: collections.deque = field(default_factory=collections.deque)  # (monotonic, primary lsn)
    _next: itertools.count = field(default_factory=itertools.count)
    _task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        for s in self.standbys:
            await s.pool.open(wait=False)
        await self.check()
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="kb-rerank-replica-check")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
        for s in self.standbys:
            await s.pool.close()

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the next check tries again
                log.warning("replica check failed: %s", type(exc).__name__)

    # ------------------------------------------------------------------ health
    async def check(self) -> None:
        """Sample the primary's WAL position, then each standby's replay position and state."""
        now = time.monotonic()
        try:
            async with self.primary_pool.connection(timeout=self.check_timeout_s) as conn:
                primary_lsn = (await (await conn.execute(_PRIMARY_LSN)).fetchone())[0]
        except Exception as exc:  # noqa: BLE001 - without the primary's position no lag is known
            for s in self.standbys:
                s.healthy, s.error = False, f"primary position unknown ({type(exc).__name__})"
            return
        self._samples.append((now, int(primary_lsn)))
        horizon = now - max(3 * self.max_lag_s, 3 * self.interval_s)
        while len(self._samples) > 1 and self._samples[0][0] < horizon:
            self._samples.popleft()
        await asyncio.gather(*(self._check_one(s, now) for s in self.standbys))

    async def _check_one(self, s: Standby, now: float) -> None:
        try:
            async with s.pool.connection(timeout=self.check_timeout_s) as conn:
                in_recovery, replayed = await (await conn.execute(_STANDBY_LSN)).fetchone()
        except Exception as exc:  # noqa: BLE001 - down, refusing, or timed out: no reads
            s.healthy, s.lag_s, s.error = False, None, type(exc).__name__
            return
        if not in_recovery:
            # a promoted standby is a primary of its own: its reads may miss the primary's writes
            s.healthy, s.lag_s, s.error = False, None, "not in recovery"
            return
        reached = [t for t, lsn in self._samples if lsn <= replayed]
        if reached:
            s.caught_up_at = max(reached[-1], s.caught_up_at or reached[-1])
        if s.caught_up_at is None:
            # has not reached any position sampled so far: how far behind is not known yet
            s.healthy, s.lag_s, s.error = False, now - self._samples[0][0], "catching up"
            return
        s.lag_s = now - s.caught_up_at
        s.healthy = s.lag_s <= self.max_lag_s
        s.error = None if s.healthy else f"lag {s.lag_s:.1f} s"

    @property
    def reads_on(self) -> str:
        return "replica" if any(s.healthy for s in self.standbys) else "primary"

    def describe(self) -> dict[str, Any]:
        return {"reads": self.reads_on, "max_lag_s": self.max_lag_s,
                "standbys": [s.describe() for s in self.standbys]}

    def pick(self) -> Standby | None:
        """A healthy standby, round robin; None when none is."""
        healthy = [s for s in self.standbys if s.healthy]
        if not healthy:
            return None
        return healthy[next(self._next) % len(healthy)]

    def failed(self, s: Standby, exc: BaseException) -> None:
        """A read on ``s`` failed (:data:`RETRY_ON_PRIMARY`): no reads there until a check
        finds it healthy again; the caller reads on the primary."""
        s.healthy, s.error = False, type(exc).__name__
        log.warning("read on standby %s failed (%s): served by the primary", s.name, type(exc).__name__)


def standby_urls(settings) -> list[str]:
    """The configured standbys' URLs for the app role (see the module docstring)."""
    from kb_rerank.db.database import replace_url

    out = []
    for raw in (settings.read_database_url or "").split(","):
        url = raw.strip()
        if not url:
            continue
        if not urlsplit(url).username:
            url = replace_url(url, user=settings.app_role, password=settings.app_password or "")
        out.append(url)
    return out
