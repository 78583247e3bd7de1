"""Limits and fairness: one tenant (or one client address) cannot starve the others.

Three mechanisms, in process memory (per server process). Each process takes its share of the
service's bucket sizes and rates, divided by ``KB_APP_REPLICAS`` x ``KB_WORKERS``
(:meth:`Limits.from_settings`), so they hold in total when the load balancer spreads requests
evenly (docs/scaling.md says why the buckets are not kept in PostgreSQL).

1. **Cost-based token buckets per tenant** (:class:`RateLimiter`, ``rate_limit_per_minute``
   refill, ``rate_limit_burst`` size). A token is the cost of a cache hit: every
   authenticated request pays :data:`REQUEST_COST` in the auth guard, before its body is
   read. What a request's further work costs (documents, embeddings, pairs) is computed from
   what its flow declares, in :mod:`kb_rerank.core.costs`. A charge larger than the whole
   bucket passes only when the bucket was full before the request, and leaves it in debt;
   work done beyond what was paid is debited after the fact (never refused). A tenant in
   debt is refused until the refill pays it back, so a large request is never refused
   forever and never pays less than it costs. The prices and how they were measured:
   docs/tuning.md.
2. **Per-tenant caps on concurrent work** (:class:`Slots`): a tenant holds at most
   ``tenant_model_slots`` calls of the cross-encoder and as many of the embedder (queued or
   running) and at most ``tenant_pool_slots`` database connections (0: half the pool) at
   once; while the service is shared (below), at most ``tenant_retrieval_slots`` retrieval
   statements (a search, its filter) at once, so that one tenant's searches cannot hold every
   core of the database. A tenant at its cap waits up to ``tenant_wait_s`` in FIFO order for
   one of its own slots, then gets 429 ``tenant_busy``; the other tenants never wait behind
   more than the cap of each busy tenant. One client's requests one after another hold one
   slot at a time and never wait.
3. **Per-address token bucket before authentication** (``address_rate_limit_per_minute`` /
   ``address_rate_limit_burst``): every guarded request pays 1 for its client address (the
   TCP peer, never a forwarded header) before the JWT is verified, so floods of bad tokens
   are bounded too. Behind a reverse proxy every client shares the proxy's address: raise
   the limit or set it to 0 there, and limit at the proxy.

**Work-conserving prices** (:meth:`Limits.prices`): the work a request does beyond its token
(documents, embeddings, pairs, a search filter's terms) is charged at the prices of
:mod:`kb_rerank.core.costs` only while the service is shared: another tenant sent a request
within ``SHARED_WINDOW_S``. A tenant alone pays one token a request, since the model, the
embedder and the database it would wait for are idle otherwise: one person's ordinary use
(searches typed one after another, a few ``/v2/rerank`` calls) is never refused for work
nobody else wanted. As soon as another tenant is served, every tenant's next requests pay the
full prices, its retrieval statements are capped, and the per-tenant caps (2.) bound what
the first one still has in flight, so a tenant that floods delays another's request by at
most the bounded unit, as before.
(``KB_RATE_WORK_CONSERVING=false``: the full prices always.)

Refusals are 429 with ``Retry-After`` and a JSON body ``{"error": "rate_limited" |
"tenant_busy", "scope" | "resource": ..., "retry_after_s": ...}``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import time
from typing import Any, AsyncIterator, Callable

# What every authenticated request pays in the auth guard: the whole cost of a cache hit.
REQUEST_COST = 1.0
# How recently another tenant must have sent a request for the service to count as shared
# (work-conserving prices, above): ten seconds, several of anyone's typed searches
SHARED_WINDOW_S = 10.0


class Prices:
    """What a unit of work costs one request (tokens): fixed for the request's life."""

    def __init__(self, per_pair: float = 0.0, per_document: float = 0.0, per_embedding: float = 0.0,
                 per_filter_kdoc: float = 0.0) -> None:
        self.cost_per_pair, self.cost_per_document, self.cost_per_embedding = per_pair, per_document, per_embedding
        self.cost_per_filter_kdoc = per_filter_kdoc


FREE = Prices()


class LimitExceeded(Exception):
    """A 429 answered as ``payload`` (JSON) with ``Retry-After`` by the HTTP layer's error
    handler (:mod:`kb_rerank.http.errors`); a plain exception, so the pipeline stays free of
    Litestar."""

    status_code = 429

    def __init__(self, payload: dict[str, Any], retry_after_s: float) -> None:
        retry = max(1, math.ceil(retry_after_s))
        self.payload = {**payload, "retry_after_s": retry}
        self.headers = {"Retry-After": str(retry)}
        super().__init__(str(payload.get("error")))


class RateLimiter:
    """Token buckets keyed by tenant (or address): ``per_minute`` tokens per minute refill a
    bucket of ``burst`` tokens (at least 1); ``acquire(key, cost)`` takes ``cost`` tokens.
    ``per_minute <= 0`` disables. At most ``max_tenants`` buckets are kept: full ones are
    dropped first (a full bucket is the same as none), then the least recently used."""

    def __init__(self, per_minute: float, burst: float, *, max_tenants: int = 100_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = max(0.0, float(per_minute)) / 60.0
        self.capacity = float(max(1, int(burst)))
        self.max_tenants = max_tenants
        self.clock = clock
        self._buckets: collections.OrderedDict[Any, tuple[float, float]] = collections.OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def _level(self, tokens: float, stamp: float, now: float) -> float:
        return min(self.capacity, tokens + (now - stamp) * self.rate)

    def acquire(self, key: Any, cost: float = 1.0, *, paid: float = 0.0) -> float:
        """Take ``cost`` tokens for ``key``: 0.0 when allowed, else the seconds until the
        bucket holds enough (nothing is taken then). A cost above the bucket's size needs a
        full bucket and leaves it in debt (negative), which later requests wait out.
        ``paid``: what the same request took already (its first token, in the auth guard),
        so that "a full bucket" means full before the request. The wait counts ``paid`` again:
        the retry pays its first token too, so a client that waits as told is let through
        (a wait without it would leave the retry one token short, refused again and again)."""
        if not self.enabled or cost <= 0:
            return 0.0
        now = self.clock()
        tokens, stamp = self._buckets.pop(key, (self.capacity, now))
        tokens = self._level(tokens, stamp, now)
        need = max(0.0, min(float(cost) + paid, self.capacity) - paid)
        if tokens >= need - 1e-9:
            self._buckets[key] = (tokens - float(cost), now)
            self._prune(now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (need + paid - tokens) / self.rate

    def debit(self, key: Any, cost: float) -> None:
        """Take ``cost`` tokens for work already done (never refused): the bucket may go
        negative, a debt that ``key``'s later requests wait out (as for a cost above the
        bucket's size in :meth:`acquire`). An absent bucket starts full, less ``cost``."""
        if not self.enabled or cost <= 0:
            return
        now = self.clock()
        tokens, stamp = self._buckets.pop(key, (self.capacity, now))
        self._buckets[key] = (self._level(tokens, stamp, now) - float(cost), now)
        self._prune(now)

    def refund(self, key: Any, cost: float) -> None:
        """Give back ``cost`` tokens taken for work that was then refused (never above the size)."""
        if not self.enabled or cost <= 0 or key not in self._buckets:
            return
        now = self.clock()
        tokens, stamp = self._buckets[key]
        self._buckets[key] = (min(self.capacity, self._level(tokens, stamp, now) + float(cost)), now)

    def level(self, key: Any) -> float:
        """Tokens ``key`` holds now (the bucket's size when it has none)."""
        now = self.clock()
        tokens, stamp = self._buckets.get(key, (self.capacity, now))
        return self._level(tokens, stamp, now)

    def _prune(self, now: float) -> None:
        if len(self._buckets) <= self.max_tenants:
            return
        for k in [k for k, (t, st) in self._buckets.items() if self._level(t, st, now) >= self.capacity]:
            del self._buckets[k]
        while len(self._buckets) > self.max_tenants:
            self._buckets.popitem(last=False)

    def __len__(self) -> int:
        return len(self._buckets)


class Slots:
    """At most ``cap`` holders per key at once (``cap <= 0``: no limit). A caller over the
    cap waits in FIFO order up to ``wait_s`` for a slot of its own key (a released slot
    passes straight to the first waiter), then :class:`LimitExceeded` (429 ``tenant_busy``).
    Keys with no holder and no waiter are forgotten, so memory follows the busy keys only."""

    def __init__(self, cap: int, wait_s: float, resource: str) -> None:
        self.cap = int(cap)
        self.wait_s = max(0.0, float(wait_s))
        self.resource = resource
        self._held: dict[Any, int] = {}
        self._waiters: dict[Any, collections.deque[asyncio.Future]] = {}

    def held(self, key: Any) -> int:
        return self._held.get(key, 0)

    def waiting(self, key: Any) -> int:
        return len(self._waiters.get(key, ()))

    def busy_keys(self) -> int:
        return len(self._held)

    def _refuse(self) -> LimitExceeded:
        return LimitExceeded({"error": "tenant_busy", "resource": self.resource,
                              "detail": f"this tenant already uses {self.cap} {self.resource} slots"},
                             max(1.0, self.wait_s))

    async def acquire(self, key: Any, *, bounded: bool = True) -> None:
        """``bounded=False``: held at once, beyond the cap if need be (counted, so that the
        holders past the cap release theirs before a waiter is let in)."""
        if self.cap <= 0:
            return
        n = self._held.get(key, 0)
        if not bounded or (n < self.cap and not self._waiters.get(key)):
            self._held[key] = n + 1
            return
        if self.wait_s <= 0:
            raise self._refuse()
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        queue = self._waiters.setdefault(key, collections.deque())
        queue.append(fut)
        try:
            await asyncio.wait_for(fut, self.wait_s)
        except BaseException as exc:
            with contextlib.suppress(ValueError):
                queue.remove(fut)
            if not queue and self._waiters.get(key) is queue:
                del self._waiters[key]
            if fut.done() and not fut.cancelled():
                self.release(key)  # the slot was handed over as we gave up: pass it on
            if isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
                raise self._refuse() from None
            raise
        # the releasing holder handed its slot over: the held count did not change

    def release(self, key: Any) -> None:
        if self.cap <= 0:
            return
        n = self._held.get(key, 0) - 1
        queue = self._waiters.get(key) if n < self.cap else None  # holders past the cap: none handed over
        while queue:
            fut = queue.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        if not self._waiters.get(key):
            self._waiters.pop(key, None)
        if n > 0:
            self._held[key] = n
        else:
            self._held.pop(key, None)

    @contextlib.asynccontextmanager
    async def hold(self, key: Any) -> AsyncIterator[None]:
        await self.acquire(key)
        try:
            yield
        finally:
            self.release(key)


class Limits:
    """One per app: the buckets, the caps and the costs (see the module docstring).
    ``on_reject(reason)`` is told of each refusal (the API counts them in its metrics)."""

    def __init__(self, *, tenant_rate: RateLimiter | None = None, address_rate: RateLimiter | None = None,
                 model_slots: int = 0, pool_slots: int = 0, retrieval_slots: int = 0, wait_s: float = 0.0,
                 cost_per_pair: float = 0.0,
                 cost_per_document: float = 0.0, cost_per_embedding: float = 0.0,
                 cost_per_filter_kdoc: float = 0.0, cost_per_model_second: float = 0.0, shared_window_s: float = 0.0,
                 on_reject: Callable[[str], None] | None = None) -> None:
        # (`is None`: an empty RateLimiter is falsy, it has a length)
        self.tenant_rate = tenant_rate if tenant_rate is not None else RateLimiter(0, 1)
        self.address_rate = address_rate if address_rate is not None else RateLimiter(0, 1)
        self.model = Slots(model_slots, wait_s, "model")
        self.embedder = Slots(model_slots, wait_s, "embedder")
        self.pool = Slots(pool_slots, wait_s, "database")
        self.retrieval = Slots(retrieval_slots, wait_s, "retrieval")
        self.fixed_cost_per_pair = max(0.0, float(cost_per_pair))
        self.cost_per_document = max(0.0, float(cost_per_document))
        self.cost_per_embedding = max(0.0, float(cost_per_embedding))
        self.cost_per_filter_kdoc = max(0.0, float(cost_per_filter_kdoc))
        self.cost_per_model_second = max(0.0, float(cost_per_model_second))
        self.pair_cost: Any = None  # the model's ForwardCost (kb_rerank.models.forward_cost), once it is loaded
        self.on_reject = on_reject or (lambda reason: None)
        # work-conserving prices: 0 charges the full prices always
        self.shared_window_s = max(0.0, float(shared_window_s))
        self._recent: collections.OrderedDict[Any, float] = collections.OrderedDict()  # tenant -> last request

    def shared(self, tenant: Any) -> bool:
        """Whether another tenant than ``tenant`` sent a request within ``shared_window_s``
        (always, when that window is 0: the service counts as shared)."""
        if self.shared_window_s <= 0:
            return True
        horizon = time.monotonic() - self.shared_window_s
        while self._recent and next(iter(self._recent.values())) < horizon:
            self._recent.popitem(last=False)
        return not all(k == tenant for k in itertools.islice(self._recent, 2))

    def prices(self, tenant: Any) -> Prices:
        """The prices of ``tenant``'s request now: :data:`FREE` while it is alone (no other
        tenant sent a request within ``shared_window_s``), else the full prices."""
        if not self.shared(tenant):
            return FREE
        return Prices(self.cost_per_pair, self.cost_per_document, self.cost_per_embedding, self.cost_per_filter_kdoc)

    def _arrived(self, tenant: Any) -> None:
        if self.shared_window_s > 0:
            self._recent.pop(tenant, None)
            self._recent[tenant] = time.monotonic()  # oldest first
            while len(self._recent) > 100_000:
                self._recent.popitem(last=False)

    @property
    def cost_per_pair(self) -> float:
        """A pair's price: ``cost_per_model_second`` times the model's measured seconds per pair
        (calibrated at load, kept current from live batches), never below the fixed price
        (``KB_RATE_COST_PER_PAIR``); the fixed price alone when no measure is given."""
        cost = self.pair_cost
        if cost is None or not self.cost_per_model_second or not getattr(cost, "calibrated", False):
            return self.fixed_cost_per_pair
        return max(self.fixed_cost_per_pair, cost.ms_per_pair() / 1000.0 * self.cost_per_model_second)

    @classmethod
    def from_settings(cls, settings, *, on_reject: Callable[[str], None] | None = None) -> "Limits":
        pool_slots = settings.tenant_pool_slots or max(1, settings.pool_max // 2)
        # this process's share of each bucket: the limits are for the whole service, and every
        # process (KB_APP_REPLICAS x KB_WORKERS) keeps its own buckets
        share = 1.0 / (max(1, int(settings.app_replicas)) * max(1, int(settings.workers)))
        return cls(
            tenant_rate=RateLimiter(settings.rate_limit_per_minute * share, settings.rate_limit_burst * share),
            address_rate=RateLimiter(settings.address_rate_limit_per_minute * share,
                                     settings.address_rate_limit_burst * share),
            model_slots=settings.tenant_model_slots, pool_slots=pool_slots,
            retrieval_slots=settings.tenant_retrieval_slots, wait_s=settings.tenant_wait_s,
            cost_per_pair=settings.rate_cost_per_pair, cost_per_document=settings.rate_cost_per_document,
            cost_per_embedding=settings.rate_cost_per_embedding, cost_per_filter_kdoc=settings.rate_cost_per_filter_kdoc,
            cost_per_model_second=settings.rate_cost_per_model_second,
            shared_window_s=SHARED_WINDOW_S if settings.rate_work_conserving else 0.0,
            on_reject=on_reject,
        )

    # ------------------------------------------------------------------ buckets
    def _charge(self, bucket: RateLimiter, key: Any, cost: float, scope: str, paid: float = 0.0) -> None:
        wait_s = bucket.acquire(key, cost, paid=paid)
        if wait_s > 0:
            if paid:
                # a refusal costs nothing: the request's first token (the auth guard's) back, so
                # that a tenant's many clients retrying together cannot keep its bucket below the
                # price of its next request for ever (each retry's first token spent on a
                # refusal, none ever let through): it is slowed down to its rate, not shut out
                bucket.refund(key, REQUEST_COST)
            reason = "rate_limited" if scope == "tenant" else f"{scope}_rate_limited"
            self.on_reject(reason)
            raise LimitExceeded({"error": "rate_limited", "scope": scope, "cost": round(float(cost), 3)}, wait_s)

    def charge_address(self, address: Any) -> None:
        """1 token of the client address's bucket (before authentication)."""
        self._charge(self.address_rate, address, 1.0, "address")

    def charge(self, tenant: Any, cost: float = REQUEST_COST, *, paid: float = 0.0) -> None:
        """``cost`` tokens of the tenant's bucket; ``paid``: what the request paid already.
        The request's first charge (``paid`` 0) marks the tenant as active (:meth:`prices`)."""
        if not paid:
            self._arrived(tenant)
        self._charge(self.tenant_rate, tenant, cost, "tenant", paid)

    # ------------------------------------------------------------------ caps
    async def _take(self, slots: Slots, tenant: Any) -> None:
        try:
            await slots.acquire(tenant)
        except LimitExceeded:
            self.on_reject("tenant_busy")
            raise

    @contextlib.asynccontextmanager
    async def model_slot(self, tenant: Any) -> AsyncIterator[None]:
        """One of the tenant's cross-encoder slots (429 ``tenant_busy`` past the wait)."""
        await self._take(self.model, tenant)
        try:
            yield
        finally:
            self.model.release(tenant)

    @contextlib.asynccontextmanager
    async def embedder_slot(self, tenant: Any) -> AsyncIterator[None]:
        """One of the tenant's embedder slots (429 ``tenant_busy`` past the wait)."""
        await self._take(self.embedder, tenant)
        try:
            yield
        finally:
            self.embedder.release(tenant)

    @contextlib.asynccontextmanager
    async def retrieval_slot(self, tenant: Any) -> AsyncIterator[None]:
        """One of the tenant's retrieval statements (429 ``tenant_busy`` past the wait); capped
        only while the service is shared: a tenant alone may use every core it finds idle."""
        if self.shared(tenant):
            await self._take(self.retrieval, tenant)
        else:
            await self.retrieval.acquire(tenant, bounded=False)
        try:
            yield
        finally:
            self.retrieval.release(tenant)

    @contextlib.asynccontextmanager
    async def connection(self, pool, tenant: Any) -> AsyncIterator[Any]:
        """``pool.connection()`` within the tenant's share of the pool."""
        await self._take(self.pool, tenant)
        try:
            async with pool.connection() as conn:
                yield conn
        finally:
            self.pool.release(tenant)


UNLIMITED = Limits()
