"""The request path every endpoint shares, written once: single flight, cache read, audit,
cache and pair-score write, metrics. Each endpoint is a :class:`Flow` (what to compute and
how its answer is stored); :meth:`Pipeline.run` does the rest.

Steps of a request (tenant ``t``, a flow of source ``s``)
--------------------------------------------------------
1. **Single flight** per ``(t, s, flight key)``, in process: the flight key is the query
   hash of the normalised query and the flow's parameters (the tenant's injection policy
   left out: it is read in step 2). A request first looks for a leader computing the same
   key. If there is none it becomes the leader and reads the cache (step 2) once; a leader
   commits its cache row before it leaves, so finding no leader and then no row is a real
   miss. Identical requests arriving meanwhile wait for the leader, then read the cache (a
   hit) or, when the answer was not cached (fallback, uninspected documents) and neither the
   generation nor the key moved since the leader read them, share the leader's answer
   (audited for themselves, detail ``single_flight``); when the leader failed they fail the
   same way at once (a database outage costs them no second timeout). Across processes
   (app replicas over one database; ``KB_SHARED_SINGLE_FLIGHT``), a leader that misses
   claims the key in ``kb.kb_rerank_inflight`` (:mod:`kb_rerank.store.inflight`) before it
   computes; a leader that finds the key claimed by another process polls for that
   process's cache row and serves it as a hit (audited ``cache_hit``), and computes only when
   the claim is released with nothing cached or expires. The claim is released in the
   record step's statement (kb.record_outcome), with the cache row.
2. **Lookup** (one tenant transaction): the tenant's injection policy when the flow keys on
   it, the cache key ``query_hash(normalised query, parameters)`` (:mod:`.query`), the
   tenant's knowledge-base generation (or the flow's fixed one) and the key's live row at
   it, in one statement (:mod:`kb_rerank.store.result_cache`). A row the flow cannot
   decode is deleted and treated as a miss. A hit writes its ``cache_hit`` audit row in the
   same transaction and is answered without the model.
   A leader's miss claims the key (``KB_SHARED_SINGLE_FLIGHT``, step 1) in the same
   transaction, committed with it.
3. **Compute** (the flow's own steps: candidates, guard policy, scoring with the pair cache
   and fallback through :meth:`Pipeline.score`, diversification, composition). Every cache
   row and pair score of the answer is keyed by the generation read in step 2, before any
   candidate was read.
4. **Record** (one statement, its own transaction: kb.record_outcome through
   :mod:`kb_rerank.store.record`, one round trip): the cache row (unless the answer is not
   cacheable: a fallback, or documents the guard had no time to inspect), the pairs the model
   scored (not on fallback) and the ``served`` / ``fallback`` audit row, signed with the app's
   key; all three or none.

Metrics (:class:`PipelineMetrics`, labelled with the flow's ``source``): cache hits and
misses, fallbacks by reason, model calls, pair-cache hits, latency of served requests.
No Litestar import: the HTTP layer maps exceptions to statuses.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from kb_rerank.pipeline import scoring, timing
from kb_rerank.pipeline.limits import UNLIMITED, Limits
from kb_rerank.pipeline.query import query_hash, query_hash_key
from kb_rerank.settings import Settings
from kb_rerank.store import audit, inflight, pair_cache, record, result_cache
from kb_rerank.store.guard_reviews import DEFAULT_POLICY, POLICIES, POLICY_SQL, policy_of  # noqa: F401 (eval reads them here)
from kb_rerank.store.session import atenant_transaction

log = logging.getLogger(__name__)



class PipelineMetrics:
    """What the pipeline reports; the HTTP layer gives it Prometheus metrics. No-op here."""

    def cache_hit(self, source: str) -> None: ...

    def cache_miss(self, source: str) -> None: ...

    def fallback(self, source: str, reason: str) -> None: ...

    def model_call(self, seconds: float, pairs: int) -> None: ...

    def pair_scores(self, cached: int, scored: int) -> None:
        """A served (non-fallback) answer: ``cached`` pair scores came from the pair cache,
        ``scored`` were computed by the model."""

    def served(self, source: str, seconds: float) -> None:
        """A request of ``source`` answered (hit or miss) in ``seconds``."""


@dataclass
class Lookup:
    """What step 2 read, and what the miss computes under."""

    tenant: uuid.UUID
    policy: str
    params: Mapping[str, Any] | None
    query_hash: str  # the cache key (audit rows name it)
    generation: int
    hit: Any = None  # the decoded cached body
    model: str | None = None  # the model the cached body was computed with
    # the single-flight claim tried in the lookup's transaction on a miss (``claim_as``):
    # True when taken, False when another process holds the key, None when not tried
    claimed: bool | None = None


@dataclass
class Outcome:
    """A computed answer: ``body`` is what the cache stores (encoded by the flow) and what
    the flow's response is built from."""

    body: Any
    candidate_count: int
    returned_count: int
    model: str
    fallback_reason: str | None = None
    rerank_ms: int = 0
    cacheable: bool = True  # False also when the answer is a fallback
    detail: str | None = None  # audit detail beside the fallback reason (default: the flow's tag)
    new_pairs: dict[pair_cache.PairKey, float] = field(default_factory=dict)
    # set by the runner: the lookup the answer was computed under
    query_hash: str = ""
    generation: int = 0


class Flow(Protocol):
    """One endpoint's computation and storage rules (see :mod:`.rerank`, :mod:`.context`,
    :mod:`.caller_documents`)."""

    source: str  # cache / audit / metrics source
    tag: str | None  # audit detail of its rows (None for the search endpoint)
    fixed_generation: int | None  # None: the tenant's knowledge-base generation
    keyed_on_policy: bool  # whether the tenant's injection policy enters the key
    normalized: str

    def admit(self, pipe: Pipeline, tenant: uuid.UUID) -> None:
        """Charge what the request's size already tells (before the cache read); 429 if short.
        A flow may also define ``settle(pipe, tenant)``, called once when the request ends
        (however it ends), to charge work whose size is known only once it is done
        (/v2/rerank's guard spans, as a debt)."""

    def params(self, policy: str | None) -> Mapping[str, Any] | None:
        """The parameters that change the answer (None: the query alone keys it)."""

    def encode(self, body: Any) -> Any:
        """The cache row's JSON for an answer."""

    def decode(self, payload: Any) -> Any | None:
        """The answer stored in a cache row, None when the row is malformed."""

    def returned(self, body: Any) -> int:
        """How many results ``body`` returns (audit)."""

    async def compute(self, pipe: Pipeline, look: Lookup) -> Outcome:
        """The answer of a miss."""

    def answer(self, served: Served, trace_id: str) -> Any:
        """The response (a dict the HTTP layer converts to the route's response Struct)."""


class StoredResponse:
    """Cache rows of a flow whose answer is a JSON object: ``{"kind": cache_kind, "response"}``
    (the context and caller-documents flows; the search flow stores its results list)."""

    cache_kind: str

    def encode(self, body: dict[str, Any]) -> dict[str, Any]:
        return {"kind": self.cache_kind, "response": body}

    def decode(self, payload: Any) -> dict[str, Any] | None:
        if (isinstance(payload, dict) and payload.get("kind") == self.cache_kind
                and isinstance(payload.get("response"), dict)):
            return payload["response"]
        return None

    def returned(self, body: dict[str, Any]) -> int:
        return len(body.get("results", []))


@dataclass
class Served:
    body: Any
    from_cache: bool
    outcome: Outcome | None  # None on a hit
    model: str


class Pipeline:
    """One per app: the pool, the models, the keys, the limits, the metrics and the
    single-flight map; :meth:`run` serves a flow."""

    def __init__(self, settings: Settings, pool, embedder, reranker, *, embed_executor=None,
                 metrics: PipelineMetrics | None = None, hash_key: bytes | None = None,
                 limits: Limits | None = None, replicas=None) -> None:
        self.settings = settings
        # the query-hash key, read once here (app start), never per request
        self.hash_key = hash_key if hash_key is not None else query_hash_key(settings)
        self.audit_key = audit.AuditKey.from_settings(settings)  # signs audit rows; read once too
        self.limits = limits or UNLIMITED  # per-tenant costs and caps (kb_rerank.pipeline.limits)
        self.pool = pool
        self.embedder = embedder
        self.reranker = reranker
        self.embed_executor = embed_executor
        self.replicas = replicas  # kb_rerank.store.replicas.ReadReplicas, or None: reads on the primary
        self.metrics = metrics or PipelineMetrics()
        self._inflight: dict[tuple[str, str, str], asyncio.Future] = {}
        self._background: set[asyncio.Task] = set()

    # ------------------------------------------------------------------ services to flows
    @property
    def model_name(self) -> str:
        return str(getattr(self.reranker, "model_name", None) or self.settings.reranker_model)

    @property
    def inflight(self) -> int:
        """Keys being computed now (single flight)."""
        return len(self._inflight)

    def hash_query(self, normalized: str, params: Mapping[str, Any] | None = None) -> str:
        """:func:`~kb_rerank.pipeline.query.query_hash` under this app's key."""
        return query_hash(normalized, self.hash_key, params)

    async def audit(self, conn, tenant, record: audit.AuditRecord) -> None:
        """One audit row in ``conn``'s tenant transaction, signed with this app's key."""
        await audit.append(conn, record, tenant_id=tenant, key=self.audit_key)

    async def embed(self, fn, *args: Any) -> Any:
        """An embedder call on the embedder's executor (off the event loop)."""
        with timing.stage("embed"):
            return await asyncio.get_running_loop().run_in_executor(self.embed_executor, fn, *args)

    def connection(self, tenant):
        """One of the tenant's pool connections (a slot of :mod:`.limits`)."""
        return self.limits.connection(self.pool, tenant)

    async def read(self, tenant, work):
        """``work(conn, on_primary)`` for a read-only step (candidate retrieval): on a healthy
        standby when read replicas are configured, else (or when the standby fails) on the
        primary; within the tenant's share of either pool."""
        if self.replicas is None:
            async with self.connection(tenant) as conn:
                return await work(conn, True)
        return await self.replicas.run(work, lambda pool: self.limits.connection(pool, tenant), self.pool)

    async def score(self, tenant, source: str, query: str, texts: list[str], **kw: Any):
        """:func:`kb_rerank.pipeline.scoring.score` with this app's model, settings, metrics
        and limits; a fallback is counted under ``source`` and reloads the model."""
        with timing.stage("rerank"):
            return await scoring.score(reranker=self.reranker, settings=self.settings, metrics=self.metrics,
                                       limits=self.limits, reload_later=self.reload_model_later, query=query,
                                       texts=texts, source=source, tenant=tenant, **kw)

    def reload_model_later(self) -> None:
        """(Re)load the model in the background when it is not ready (after a fallback)."""
        ensure = getattr(self.reranker, "ensure_loaded_async", None)
        if ensure is None or getattr(self.reranker, "ready", False):
            return
        task = asyncio.get_running_loop().create_task(ensure())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ the runner
    async def run(self, flow: Flow, tenant: uuid.UUID, trace_id: str) -> Served:
        t0 = time.perf_counter()
        flow.admit(self, tenant)
        try:
            served = await self._run(flow, tenant, trace_id, t0)
        finally:
            # a flow charges the work it could not price at admission, whether the request was
            # served, failed or was cancelled (optional: /v2/rerank's guard spans, as a debt)
            settle = getattr(flow, "settle", None)
            if settle is not None:
                settle(self, tenant)
        self.metrics.served(flow.source, time.perf_counter() - t0)
        return served

    async def _run(self, flow: Flow, tenant: uuid.UUID, trace_id: str, t0: float) -> Served:
        key = (str(tenant), flow.source, self.hash_query(flow.normalized, flow.params(None)))
        for _attempt in range(3):
            pending = self._inflight.get(key)
            if pending is None:
                break
            shared: Outcome | Exception | None = await asyncio.shield(pending)
            if isinstance(shared, Exception):
                raise shared  # the leader failed (database down, say): fail the same way now
            look = await self._lookup(flow, tenant, trace_id, t0)
            if look.hit is not None:
                return Served(look.hit, True, None, look.model or self.model_name)
            if (shared is not None and shared.generation == look.generation
                    and shared.query_hash == look.query_hash):
                # not cached (fallback, uninspected documents): serve the same answer, audited
                # for this request; only at the generation the leader computed it at (after a
                # change to the tenant's documents the follower computes afresh)
                await self._record(flow, tenant, trace_id, shared, t0, write=False, extra="single_flight")
                return Served(shared.body, False, shared, shared.model)
            # the leader was cancelled (its client went away), or its answer belongs to an
            # older generation or another key: compute ourselves (we may become the leader)
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        outcome: Outcome | None = None
        failure: Exception | None = None
        claim: list = []  # [(lookup, claimant)] while this process holds the key's shared claim
        # the shared claim is tried in the lookup's own transaction when it misses (one
        # connection and transaction fewer per miss than claiming apart)
        me = uuid.uuid4() if self.settings.shared_single_flight else None
        try:
            look = await self._lookup(flow, tenant, trace_id, t0, claim_as=me)
            if look.hit is not None:
                return Served(look.hit, True, None, look.model or self.model_name)
            other = await self._claim(flow, tenant, trace_id, t0, look, claim, me=me)
            if isinstance(other, Served):
                return other  # another process computed it meanwhile: its cache row, as a hit
            look = other
            self.metrics.cache_miss(flow.source)
            outcome = await flow.compute(self, look)
            outcome.query_hash, outcome.generation = look.query_hash, look.generation
            if outcome.fallback_reason is not None:
                outcome.cacheable = False
            await self._record(flow, tenant, trace_id, outcome, t0, write=True,
                               claimant=claim[0][1] if claim else None)
            claim.clear()  # released in the record's transaction
            return Served(outcome.body, False, outcome, outcome.model)
        except Exception as exc:
            failure = exc
            raise
        finally:
            if self._inflight.get(key) is fut:
                del self._inflight[key]
            if not fut.done():
                fut.set_result(failure if failure is not None else outcome)  # followers get it
            if claim:
                # failed or cancelled before recording: let the other processes compute now.
                # In the background: with the database down the release waits a pool timeout,
                # and the failed request must still fail fast (the claim expires anyway)
                task = asyncio.get_running_loop().create_task(self._release(flow, tenant, *claim[0]))
                self._background.add(task)
                task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ across processes
    def _claim_ttl_s(self) -> float:
        """How long a claim lives (and a waiter waits at most): the model's budget, plus the
        cap on a /v2/rerank guard's embeddings (``guard_embed_timeout_s``, spent before the
        model), plus room for the query embedding, the SQL and the writes."""
        return float(self.settings.rerank_timeout_s) + float(self.settings.guard_embed_timeout_s) + 10.0

    async def _claim(self, flow: Flow, tenant, trace_id: str, t0: float, look: Lookup, held: list,
                     me: uuid.UUID | None = None):
        """Single flight across processes (:mod:`kb_rerank.store.inflight`): claim the missed
        key and return the lookup to compute with (``held`` gets the claim), or, when another
        process holds the claim, wait for its cache row and return it as a hit
        (:class:`Served`). A claim released with nothing cached (a fallback, an uncacheable
        answer, a failure) or expired, or a wait past the claim's lifetime, lets this process
        compute; a moved generation is a new key, claimed afresh. ``me``: the claimant the
        lookup already tried to claim the key as (``look.claimed``), if it did."""
        if not self.settings.shared_single_flight:
            return look
        me = me or uuid.uuid4()
        ttl = self._claim_ttl_s()
        deadline = time.monotonic() + ttl
        while True:
            if look.claimed is not None:
                got = look.claimed  # tried in the lookup's transaction (committed with it)
            else:
                async with self.connection(tenant) as conn:
                    async with atenant_transaction(conn, tenant):
                        got = await inflight.claim(conn, look.query_hash, flow.source, look.generation, me, ttl)
            if got:
                held.append((look, me))
                return look
            log.info("single flight: key claimed by another process source=%s tenant=%s query_hash=%s",
                     flow.source, tenant, look.query_hash)
            while time.monotonic() < deadline:
                await asyncio.sleep(self.settings.single_flight_poll_s)
                async with self.connection(tenant) as conn:
                    async with atenant_transaction(conn, tenant):
                        busy = await inflight.claimed(conn, look.query_hash, flow.source, look.generation)
                if busy:
                    continue
                again = await self._lookup(flow, tenant, trace_id, t0)  # audits a hit
                if again.hit is not None:
                    return Served(again.hit, True, None, again.model or self.model_name)
                look = again
                break  # released without a row, or the generation moved: claim (again)
            else:
                return look  # waited as long as a claim lives: compute without one

    async def _release(self, flow: Flow, tenant, look: Lookup, claimant: uuid.UUID) -> None:
        try:
            async with self.connection(tenant) as conn:
                async with atenant_transaction(conn, tenant):
                    await inflight.release(conn, look.query_hash, flow.source, look.generation, claimant)
        except Exception as exc:  # noqa: BLE001 - the claim expires on its own
            log.warning("could not release a single-flight claim: %s", type(exc).__name__)

    async def _lookup(self, flow: Flow, tenant: uuid.UUID, trace_id: str, t0: float, *,
                      claim_as: uuid.UUID | None = None) -> Lookup:
        with timing.stage("cache"):
            return await self._lookup_timed(flow, tenant, trace_id, t0, claim_as=claim_as)

    async def _lookup_timed(self, flow: Flow, tenant: uuid.UUID, trace_id: str, t0: float, *,
                            claim_as: uuid.UUID | None = None) -> Lookup:
        """Step 2. ``claim_as``: on a miss, claim the key for single flight across processes
        as this claimant in the same transaction (:mod:`kb_rerank.store.inflight`, the
        statements :meth:`_claim` would run in a transaction of their own; committed with the
        lookup, so other processes see the claim as promptly); ``look.claimed`` tells."""
        async with self.connection(tenant) as conn:
            async with atenant_transaction(conn, tenant):
                policy = DEFAULT_POLICY
                if flow.keyed_on_policy:
                    cur = await conn.execute(POLICY_SQL)
                    policy = policy_of(await cur.fetchone())
                params = flow.params(policy)
                qh = self.hash_query(flow.normalized, params)
                generation, entry = await result_cache.get_live(conn, qh, flow.source, decode=flow.decode,
                                                                generation=flow.fixed_generation)
                look = Lookup(tenant, policy, params, qh, generation)
                if entry is None and claim_as is not None:
                    look.claimed = await inflight.claim(conn, qh, flow.source, generation, claim_as,
                                                        self._claim_ttl_s())
                if entry is not None:
                    look.hit, look.model = entry.body, entry.model or self.model_name
                    await self.audit(conn, tenant, audit.AuditRecord(
                        kind=audit.CACHE_HIT, source=flow.source, query_hash=qh, trace_id=trace_id,
                        model=look.model, candidate_count=0, returned_count=flow.returned(entry.body),
                        duration_ms=(time.perf_counter() - t0) * 1000.0, detail=flow.tag,
                    ))
        if look.hit is not None:
            self.metrics.cache_hit(flow.source)
            log.info("request cache hit source=%s tenant=%s query_hash=%s", flow.source, tenant, qh)
        return look

    async def _record(self, flow: Flow, tenant, trace_id: str, out: Outcome, t0: float, *,
                      write: bool, extra: str | None = None, claimant: uuid.UUID | None = None) -> None:
        with timing.stage("record"):
            await self._record_timed(flow, tenant, trace_id, out, t0, write=write, extra=extra, claimant=claimant)

    async def _record_timed(self, flow: Flow, tenant, trace_id: str, out: Outcome, t0: float, *,
                            write: bool, extra: str | None = None, claimant: uuid.UUID | None = None) -> None:
        parts = (out.fallback_reason, out.detail if out.detail is not None else flow.tag, extra)
        detail = ";".join(p for p in parts if p) or None
        cache = write and out.cacheable
        pairs = write and out.fallback_reason is None and self.settings.pair_cache
        # one statement, its own transaction (kb.record_outcome): all of it or none
        async with self.connection(tenant) as conn:
            await record.write(
                conn, tenant, audit.AuditRecord(
                    kind=audit.FALLBACK if out.fallback_reason else audit.SERVED, source=flow.source,
                    query_hash=out.query_hash, trace_id=trace_id, model=out.model,
                    candidate_count=out.candidate_count, returned_count=out.returned_count,
                    duration_ms=(time.perf_counter() - t0) * 1000.0, detail=detail,
                ), self.audit_key, generation=out.generation, ttl_s=self.settings.cache_ttl_s,
                payload=flow.encode(out.body) if cache else None,
                # the pair cache is keyed by the query alone: shared by every flow
                pair_query_hash=self.hash_query(flow.normalized) if pairs else None,
                pairs=out.new_pairs if pairs else None,
                # released with the cache row: a waiting process sees both at once
                claimant=claimant)
        log.info("request %s source=%s tenant=%s query_hash=%s candidates=%d results=%d rerank_ms=%d%s",
                 "fallback" if out.fallback_reason else "served", flow.source, tenant, out.query_hash,
                 out.candidate_count, out.returned_count, out.rerank_ms,
                 f" reason={out.fallback_reason}" if out.fallback_reason else "")
