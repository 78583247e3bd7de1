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
   same way at once (a database outage costs them no second timeout).
2. **Lookup** (one tenant transaction): the tenant's injection policy when the flow keys on
   it, the cache key ``query_hash(normalised query, parameters)`` (:mod:`.query`), the
   tenant's knowledge-base generation (or the flow's fixed one) and the key's live row at
   it, in one statement (:mod:`kb_rerank.store.result_cache`). A row the flow cannot
   decode is deleted and treated as a miss. A hit writes its ``cache_hit`` audit row in the
   same transaction and is answered without the model.
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

from kb_rerank.pipeline import scoring
from kb_rerank.pipeline.limits import UNLIMITED, Limits
from kb_rerank.pipeline.query import query_hash, query_hash_key
from kb_rerank.settings import Settings
from kb_rerank.store import audit, pair_cache, record, result_cache
from kb_rerank.store.session import atenant_transaction

log = logging.getLogger(__name__)

POLICIES = ("exclude", "demote", "allow")
_POLICY_SQL = "select injection_policy from kb.tenant_policy where tenant_id = kb.current_tenant()"


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
        """Charge what the request's size already tells (before the cache read); 429 if short."""

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
                 limits: Limits | None = None) -> None:
        self.settings = settings
        # the query-hash key, read once here (app start), never per request
        self.hash_key = hash_key if hash_key is not None else query_hash_key(settings)
        self.audit_key = audit.AuditKey.from_settings(settings)  # signs audit rows; read once too
        self.limits = limits or UNLIMITED  # per-tenant costs and caps (kb_rerank.pipeline.limits)
        self.pool = pool
        self.embedder = embedder
        self.reranker = reranker
        self.embed_executor = embed_executor
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
        return await asyncio.get_running_loop().run_in_executor(self.embed_executor, fn, *args)

    def connection(self, tenant):
        """One of the tenant's pool connections (a slot of :mod:`.limits`)."""
        return self.limits.connection(self.pool, tenant)

    def score(self, tenant, source: str, query: str, texts: list[str], **kw: Any):
        """:func:`kb_rerank.pipeline.scoring.score` with this app's model, settings, metrics
        and limits; a fallback is counted under ``source`` and reloads the model."""
        return scoring.score(reranker=self.reranker, settings=self.settings, metrics=self.metrics,
                             limits=self.limits, reload_later=self.reload_model_later, query=query, texts=texts,
                             source=source, tenant=tenant, **kw)

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
        served = await self._run(flow, tenant, trace_id, t0)
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
        try:
            look = await self._lookup(flow, tenant, trace_id, t0)
            if look.hit is not None:
                return Served(look.hit, True, None, look.model or self.model_name)
            self.metrics.cache_miss(flow.source)
            outcome = await flow.compute(self, look)
            outcome.query_hash, outcome.generation = look.query_hash, look.generation
            if outcome.fallback_reason is not None:
                outcome.cacheable = False
            await self._record(flow, tenant, trace_id, outcome, t0, write=True)
            return Served(outcome.body, False, outcome, outcome.model)
        except Exception as exc:
            failure = exc
            raise
        finally:
            if self._inflight.get(key) is fut:
                del self._inflight[key]
            if not fut.done():
                fut.set_result(failure if failure is not None else outcome)  # followers get it

    async def _lookup(self, flow: Flow, tenant: uuid.UUID, trace_id: str, t0: float) -> Lookup:
        async with self.connection(tenant) as conn:
            async with atenant_transaction(conn, tenant):
                policy = "exclude"
                if flow.keyed_on_policy:
                    cur = await conn.execute(_POLICY_SQL)
                    row = await cur.fetchone()
                    policy = row[0] if row and row[0] in POLICIES else "exclude"
                params = flow.params(policy)
                qh = self.hash_query(flow.normalized, params)
                generation, entry = await result_cache.get_live(conn, qh, flow.source, decode=flow.decode,
                                                                generation=flow.fixed_generation)
                look = Lookup(tenant, policy, params, qh, generation)
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
                      write: bool, extra: str | None = None) -> None:
        parts = (out.fallback_reason, out.detail if out.detail is not None else flow.tag, extra)
        detail = ";".join(p for p in parts if p) or None
        cache = write and out.cacheable
        pairs = write and out.fallback_reason is None and self.settings.pair_cache
        # one statement, its own transaction (kb.record_outcome): all three or none
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
                pairs=out.new_pairs if pairs else None)
        log.info("request %s source=%s tenant=%s query_hash=%s candidates=%d results=%d rerank_ms=%d%s",
                 "fallback" if out.fallback_reason else "served", flow.source, tenant, out.query_hash,
                 out.candidate_count, out.returned_count, out.rerank_ms,
                 f" reason={out.fallback_reason}" if out.fallback_reason else "")
