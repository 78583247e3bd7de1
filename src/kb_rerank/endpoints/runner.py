"""The request path every endpoint shares: :meth:`Pipeline.run` is one fixed sequence,

    lookup -> admit -> embed -> retrieve -> (inspect) -> score -> compose -> record

and an endpoint is a :class:`Flow`: the data and pure functions that make its answer (its key
parameters, its work, a retrieval spec or its own candidates, ``select`` and ``compose``,
encode / decode of its cache row), with one async hook, ``inspect``, where caller documents
need the guard. No flow calls back into the runner.

1. **Admit**: the work the body tells is charged before anything else, and what a miss may do
   is reserved when it starts (:mod:`.costs`); the bill is settled when the request ends.
2. **Single flight** (:mod:`.flights`): identical requests wait for one leader in process;
   across processes a missed key is claimed in the lookup's transaction.
3. **Lookup** (one tenant transaction: :mod:`kb_rerank.cache.store`): the tenant's
   injection policy, the cache key (:func:`cache_key`: the query, the flow's parameters and
   every setting that changes an answer), the tenant's knowledge-base generation and the key's
   live row. A hit writes its ``cache_hit`` audit row in the same transaction.
4. **Compute** a miss: the query embedding (when the retrieval spec needs one; a hybrid read's
   lexical list is read meanwhile, in a transaction of its own), the candidates (on a standby
   when read replicas are set, else on the primary, with their pair scores in the same
   snapshot), the flow's ``inspect`` and ``select``, the cross-encoder (:mod:`.scoring`), the
   flow's ``compose``.
5. **Record** (one statement, kb.record_outcome): the cache row unless the answer is a
   fallback or not cacheable, the pair scores the model computed, the audit row signed with
   the app's key, and the release of the shared claim: all or none.

Stage timings (``Server-Timing``, :mod:`.timing`): cache, embed, retrieve, guard, rerank,
record. Metrics (:class:`PipelineMetrics`) are labelled with the flow's ``source``. No
Litestar import: the HTTP layer maps exceptions to statuses.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Awaitable, Callable, Mapping, Protocol

import msgspec
import numpy as np

from kb_rerank.core.candidate import Candidate
from kb_rerank.guard import classifier as guard_classifier, verdict
from kb_rerank.models import CrossEncoder
from kb_rerank.filters import grammar as filters
from kb_rerank.rerank import scoring
from kb_rerank.core import timing
from kb_rerank.core.costs import Bill, Work
from kb_rerank.core.embedding import EmbedPool
from kb_rerank.core.flights import Claim, Flights
from kb_rerank.core.limits import UNLIMITED, Limits
from kb_rerank.core.metrics import PipelineMetrics
from kb_rerank.core.query import query_hash, query_hash_key
from kb_rerank.retrieval.spec import HYBRID, LexicalList, RetrievalSpec, pair_keys, read as read_spec, read_lexical
from kb_rerank.core.settings import Settings
from kb_rerank.audit import store as audit, record
from kb_rerank.endpoints.documents import store as documents
from kb_rerank.rerank import pair_cache
from kb_rerank.db import replicas as replica_reads
from kb_rerank.cache import store as result_cache
from kb_rerank.guard.reviews import DEFAULT_POLICY, atenant_policy
from kb_rerank.core.session import atenant_transaction

log = logging.getLogger(__name__)


def answer_config(settings: Settings, model: str, guard_version: str | None) -> dict[str, Any]:
    """Every setting that changes an answer, for the cache key of every flow: after a change
    of any of them the cached answers of the old configuration are not served."""
    s = settings
    return {
        "candidates": s.candidates, "fusion_depth": s.fusion_depth, **s.fusion,
        "bm25": [s.bm25_k1, s.bm25_b], "rerank_top_n": s.rerank_top_n,
        "rerank_max_candidates": s.rerank_max_candidates, "gate_min_similarity": s.gate_min_similarity,
        "tiers": [s.tier_high, s.tier_medium], "demote_factor": s.demote_factor,
        "chunking": [s.chunk_max_chars, s.chunk_overlap], "model": model,
        "guard_classifier": [guard_version, s.guard_classifier_threshold],
        "guard_voters": verdict.voters_for(s).version,
    }


@dataclass
class Lookup:
    """What the lookup read, and what a miss computes under."""

    tenant: uuid.UUID
    policy: str
    query_hash: str  # the cache key (audit rows name it)
    generation: int
    hit: Any = None  # the decoded cached body
    model: str | None = None  # the model the cached body was computed with


@dataclass
class Selection:
    """What a flow's ``select`` hands to the model and to its ``compose``."""

    candidates: list[Candidate]  # every candidate the flow had
    chosen: list[Candidate]  # those the cross-encoder scores, in order
    kept: list[Candidate] = field(default_factory=list)  # after the guard policy
    filtered: list[dict[str, Any]] = field(default_factory=list)  # the policy's report
    note: dict[str, Any] = field(default_factory=dict)  # the flow's own (the gate)


@dataclass
class Outcome:
    """A computed answer: ``body`` is what the cache stores (encoded by the flow)."""

    body: Any  # the flow's response Struct (the cache row is encoded from it)
    candidate_count: int
    returned_count: int
    model: str | None  # the model that scored at least one result (compose.answer_model), else None
    fallback_reason: str | None = None
    rerank_ms: int = 0
    cacheable: bool = True  # False also when the answer is a fallback
    detail: str | None = None  # audit detail beside the fallback reason (default: the flow's tag)
    new_pairs: dict[pair_cache.PairKey, float] = field(default_factory=dict)
    # set by the runner from the score step: candidates with a model score, and why not all had one
    reranked_count: int = 0
    partial: str | None = None  # "budget": a partial answer (never cached)
    query_hash: str = ""  # the lookup it was computed under (set by the runner)
    generation: int = 0


@dataclass
class Served:
    body: Any
    from_cache: bool
    outcome: Outcome | None  # None on a hit
    model: str | None  # the answer's model: the cache row's on a hit


@dataclass(frozen=True)
class GuardTools:
    """What ``Flow.inspect`` may use: the embedder (the classifier it fits) and its calls,
    charged to the request (:meth:`kb_rerank.core.costs.Bill.embedder`)."""

    embedder: Any
    embed_passages: Callable[[list[str]], Awaitable[np.ndarray]]


class Flow(Protocol):
    """One endpoint (:mod:`.rerank`, :mod:`.context`, :mod:`.caller_documents`)."""

    source: str  # cache / audit / metrics source
    tag: str | None  # audit detail of its rows (None for the search endpoint)
    fixed_generation: int | None  # None: the tenant's knowledge-base generation
    keyed_on_policy: bool  # whether the tenant's injection policy enters the key
    normalized: str  # the normalised query
    admission: Work  # charged before the cache read
    miss: Work  # the most a miss does, reserved when it starts
    retrieval: RetrievalSpec | None  # None: the flow's own candidates

    def params(self, policy: str | None) -> Mapping[str, Any]:
        """The request's parameters that change the answer."""

    def candidates(self) -> list[Candidate]:
        """The flow's own candidates (when ``retrieval`` is None)."""

    async def inspect(self, tools: GuardTools, cands: list[Candidate]) -> None:
        """The guard over caller documents (a no-op for knowledge-base chunks, judged at ingestion)."""

    def select(self, cands: list[Candidate], policy: str) -> Selection:
        """Which candidates the model scores (pure)."""

    def compose(self, look: Lookup, sel: Selection, scored: scoring.Scored) -> Outcome:
        """The answer (pure); ``scored.scores`` is None on a fallback."""

    def encode(self, body: Any) -> Any: ...

    def decode(self, payload: Any) -> Any | None:
        """The answer stored in a cache row, None when the row is malformed."""

    def returned(self, body: Any) -> int: ...

    def answer(self, served: Served, trace_id: str) -> Any:
        """The response Struct the route returns: ``served.body`` with the request's own fields."""


class StoredResponse:
    """Cache rows of a flow whose answer is its whole response Struct: ``{"kind": cache_kind,
    "response": <the Struct as msgspec builtins>}``, decoded back into ``response_type`` (a
    row of another kind, or one that does not convert, is malformed: a miss). A new kind
    whenever the Struct changes shape, so that older rows miss once."""

    cache_kind: str
    response_type: type

    def encode(self, body: Any) -> dict[str, Any]:
        return {"kind": self.cache_kind, "response": msgspec.to_builtins(body)}

    def decode(self, payload: Any) -> Any | None:
        if not (isinstance(payload, dict) and payload.get("kind") == self.cache_kind):
            return None
        try:
            return msgspec.convert(payload.get("response"), self.response_type)
        except msgspec.ValidationError:
            return None

    def returned(self, body: Any) -> int:
        return len(body.results)


class FilterCharge:
    """A request's search filter charge (:meth:`Bill.filter`: its terms over the tenant's
    documents; 429 when short), paid once, before the request's first retrieval statement:
    before a connection is taken when the tenant's document count at the request's
    generation is known (:meth:`before`), else in the first retrieval transaction
    (:meth:`within`)."""

    def __init__(self, pipeline: "Pipeline", look: Lookup, spec: RetrievalSpec, bill: Bill | None) -> None:
        self.pipeline, self.look = pipeline, look
        self.terms = filters.terms(spec.filter)
        self.bill = bill if self.terms and bill is not None else None  # None: nothing (left) to pay

    def before(self) -> None:
        known = self.pipeline._documents.get(self.look.tenant)
        if self.bill is not None and known is not None and self.look.generation is not None \
                and known[0] == self.look.generation:
            self._pay(known[1])  # refused before any statement

    async def within(self, conn) -> None:
        if self.bill is None:
            return
        n = await documents.count(conn)
        if self.look.generation is not None:
            self.pipeline.note_documents(self.look.tenant, self.look.generation, n)
        self._pay(n)

    def _pay(self, n: int) -> None:
        bill, self.bill = self.bill, None  # paid once, even when refused
        assert bill is not None
        bill.filter(self.terms, n)


class Pipeline:
    """One per app: the pool, the models, the keys, the limits, the metrics and the flights;
    :meth:`run` serves a flow."""

    def __init__(self, settings: Settings, pool, embedder, reranker, *,
                 metrics: PipelineMetrics | None = None, hash_key: bytes | None = None,
                 limits: Limits | None = None, replicas=None) -> None:
        self.settings = settings
        self.hash_key = hash_key if hash_key is not None else query_hash_key(settings)  # read once, at start
        self.audit_key = audit.AuditKey.from_settings(settings)  # signs audit rows
        self.limits = limits or UNLIMITED
        self.pool = pool
        # the embedder's calls are shared fairly by tenants (an EmbedPool of one worker when a
        # single embedder is given)
        if embedder is None or isinstance(embedder, EmbedPool):
            self.embedding: EmbedPool | None = embedder
        else:
            self.embedding = EmbedPool([embedder], unit_chars=settings.embed_unit_chars)
        self.embedder = self.embedding.embedders[0] if self.embedding is not None else None
        self.reranker: CrossEncoder | None = reranker
        if self.limits is not UNLIMITED:  # a pair's price follows the model's measured cost
            self.limits.pair_cost = getattr(reranker, "cost", None)
        self.replicas = replicas  # kb_rerank.db.replicas.ReadReplicas, or None: reads on the primary
        self.metrics = metrics or PipelineMetrics()
        self.flights = Flights()
        # tenant -> (knowledge-base generation, documents): what a search filter can touch, known
        # before a connection is taken while the generation holds (bounded: the busy tenants)
        self._documents: collections.OrderedDict[uuid.UUID, tuple[Any, int]] = collections.OrderedDict()
        # the learned injection detector, when its weights fit the embedder and it may vote
        self.classifier = (verdict.guard_classifier(self.embedder)
                           if self.embedder is not None and settings.guard_classifier_threshold < 1.0 else None)
        self.config = answer_config(settings, self.model_name, guard_classifier.load_shipped().version)
        self._background: set[asyncio.Task] = set()

    @property
    def model_name(self) -> str:
        return self.reranker.model_name if self.reranker is not None else self.settings.reranker_model

    @property
    def inflight(self) -> int:
        """Keys being computed now in this process."""
        return len(self.flights)

    def flow(self, kind: Callable[..., Flow], req: Any) -> Flow:
        """The flow ``kind`` of ``req`` under this app's settings, model and classifier."""
        return kind(req, self.settings, self.model_name, self.classifier)

    def hash_query(self, normalized: str, params: Mapping[str, Any] | None = None) -> str:
        """:func:`~kb_rerank.core.query.query_hash` under this app's key."""
        return query_hash(normalized, self.hash_key, params)

    def cache_key(self, flow: Flow, policy: str | None) -> str:
        return self.hash_query(flow.normalized, {**flow.params(policy), "config": self.config})

    def connection(self, tenant):
        """One of the tenant's pool connections (a slot of :mod:`.limits`)."""
        return self.limits.connection(self.pool, tenant)

    # ------------------------------------------------------------------ the sequence
    async def run(self, flow: Flow, tenant: uuid.UUID, trace_id: str) -> Served:
        t0 = time.perf_counter()
        bill = Bill(self.limits, tenant)
        bill.admit(flow.admission)
        try:
            served = await self._serve(flow, bill, trace_id, t0)
        finally:
            bill.settle()  # served, failed or cancelled
        self.metrics.served(flow.source, time.perf_counter() - t0)
        return served

    async def _serve(self, flow: Flow, bill: Bill, trace_id: str, t0: float) -> Served:
        tenant = bill.tenant
        async with self.flights.lead((str(tenant), flow.source, self.cache_key(flow, None))) as flight:
            claim = self._claim(flow) if flight.followed is None else None
            look = await self.lookup(flow, tenant, trace_id, t0, claim)
            while look.hit is None and claim is not None and claim.contended:
                # another process computes this key: its cache row, once it is released
                if not await claim.wait_released(lambda: self.connection(tenant), tenant):
                    break  # waited as long as a claim lives: compute without one
                look = await self.lookup(flow, tenant, trace_id, t0, claim)
            if look.hit is not None:
                return Served(look.hit, True, None, look.model)
            shared = flight.followed
            if (isinstance(shared, Outcome) and shared.generation == look.generation
                    and shared.query_hash == look.query_hash):
                # the leader's answer was not cached (fallback, uninspected documents): the same
                # answer, audited for this request, at the generation the leader read
                flight.outcome = shared
                await self.record(flow, tenant, trace_id, shared, t0, write=False, extra="single_flight")
                return Served(shared.body, False, shared, shared.model)
            try:
                outcome = await self.compute(flow, bill, look)
                await self.record(flow, tenant, trace_id, outcome, t0, write=True, claim=claim)
            except BaseException:
                if claim is not None and claim.held:
                    # let the other processes compute now; in the background, as with the
                    # database down the release waits a pool timeout and this must fail fast
                    self._later(claim.release(lambda: self.connection(tenant), tenant))
                raise
            flight.outcome = outcome
            return Served(outcome.body, False, outcome, outcome.model)

    def _claim(self, flow: Flow) -> Claim | None:
        """A claim across processes (``KB_SHARED_SINGLE_FLIGHT``). It lives as long as a miss
        may take: the model's budget, the guard's embedding cap, and room for the rest."""
        s = self.settings
        if not s.shared_single_flight:
            return None
        ttl = float(s.rerank_timeout_s) + float(s.guard_embed_timeout_s) + 10.0
        return Claim(flow.source, ttl, s.single_flight_poll_s)

    async def lookup(self, flow: Flow, tenant: uuid.UUID, trace_id: str, t0: float,
                     claim: Claim | None) -> Lookup:
        """One tenant transaction: the policy, the key, the generation, the live row (a hit is
        audited here); on a miss, ``claim`` is tried in the same transaction."""
        with timing.stage("cache"):
            async with self.connection(tenant) as conn:
                async with atenant_transaction(conn, tenant):
                    policy = await atenant_policy(conn) if flow.keyed_on_policy else DEFAULT_POLICY
                    qh = self.cache_key(flow, policy if flow.keyed_on_policy else None)
                    generation, entry = await result_cache.get_live(conn, qh, flow.source, decode=flow.decode,
                                                                    generation=flow.fixed_generation)
                    look = Lookup(tenant, policy, qh, generation)
                    if entry is None:
                        if claim is not None:
                            await claim.take(conn, qh, generation)
                        return look
                    look.hit, look.model = entry.body, entry.model
                    await audit.append(conn, audit.AuditRecord(
                        kind=audit.CACHE_HIT, source=flow.source, query_hash=qh, trace_id=trace_id,
                        model=look.model, candidate_count=0, returned_count=flow.returned(entry.body),
                        duration_ms=(time.perf_counter() - t0) * 1000.0, detail=flow.tag,
                    ), tenant_id=tenant, key=self.audit_key)
        self.metrics.cache_hit(flow.source)
        log.info("request cache hit source=%s tenant=%s query_hash=%s", flow.source, tenant, qh)
        return look

    async def compute(self, flow: Flow, bill: Bill, look: Lookup) -> Outcome:
        """A miss, start to end: reserve, embed, retrieve, inspect, select, score, compose."""
        self.metrics.cache_miss(flow.source)
        bill.reserve(self._within_budget(flow.miss))
        spec, cached = flow.retrieval, None
        if spec is None:
            cands = flow.candidates()
        else:
            embedding, lexical = None, None
            charge = FilterCharge(self, look, spec, bill)
            if spec.needs_embedding:
                embedding, lexical = await self._embed_query(flow, bill, look, spec, charge)
            cands, cached = await self.retrieve(look, spec, flow.normalized, embedding, bill,
                                                lexical=lexical, charge=charge)
        await flow.inspect(GuardTools(self.embedder, lambda texts: self._embed(bill, texts)), cands)
        sel = flow.select(cands, look.policy)
        scored = await self.score(flow, bill, look, sel.chosen, cached)
        out = flow.compose(look, sel, scored)
        out.query_hash, out.generation = look.query_hash, look.generation
        out.reranked_count, out.partial = scored.reranked, scored.partial
        if out.fallback_reason is not None or out.partial is not None:
            # a partial answer is not cached: its pair scores are, so the next request for it
            # starts where this one stopped and ranks more of the candidates
            out.cacheable = False
        return out

    async def _embed_query(self, flow: Flow, bill: Bill, look: Lookup, spec: RetrievalSpec,
                           charge: "FilterCharge") -> tuple[Any, tuple[LexicalList, Any] | None]:
        """The query's embedding and, for a hybrid read, its lexical list read meanwhile
        (:meth:`retrieve_lexical`, a task): the list needs no embedding, so the embedding's
        time hides the list's. The request still holds one connection at most: the embedding
        holds none (it runs in a worker thread), and the list's connection goes back to the
        pool when its task ends, before the read takes one. If the embedding fails or the
        request is cancelled, the task is cancelled and waited for (its connection released);
        if the task fails, its error is the miss's, as the same statement's in the read."""
        task = (asyncio.get_running_loop().create_task(self.retrieve_lexical(look, spec, flow.normalized, charge))
                if spec.source == HYBRID else None)
        try:
            embedding = (await self._embed(bill, [flow.normalized], query=True))[0]
            return embedding, (await task if task is not None else None)
        finally:
            if task is not None:
                if not task.done():
                    task.cancel()
                    await asyncio.wait([task])
                if not task.cancelled():
                    task.exception()  # retrieved: raised above, or superseded by the embedding's error

    def _within_budget(self, work: Work) -> Work:
        """A miss's most work: no more pairs than the budget lets the model score."""
        cap = scoring.budget_pairs(self.reranker, self.settings.rerank_budget_ms)
        return work if cap is None or work.pairs <= cap else replace(work, pairs=cap)

    async def _embed(self, bill: Bill, texts: list[str], *, query: bool = False) -> np.ndarray:
        """Embeddings of ``texts`` (rows), in one of the tenant's embedder slots, scheduled
        fairly between tenants (:mod:`.embedding`)."""
        assert self.embedding is not None
        async with bill.embedder(len(texts)):
            with timing.stage("embed"):
                if query:
                    return (await self.embedding.embed_query(bill.tenant, texts[0])).reshape(1, -1)
                return await self.embedding.embed_passages(bill.tenant, texts, dropped=bill.unrun)

    async def retrieve(self, look: Lookup, spec: RetrievalSpec, query: str,
                       embedding: Any, bill: Bill | None = None, *,
                       lexical: tuple[LexicalList, Any] | None = None,
                       charge: "FilterCharge | None" = None) -> tuple[list[Candidate], dict | None]:
        """The candidates and, read on the primary, their live pair scores: on a healthy
        standby when read replicas are set (the primary when none is, it is behind the
        request's generation, or it fails), within the tenant's share of either pool and one
        of its retrieval slots (:meth:`Limits.retrieval_slot`). A search filter is paid for
        first (:class:`FilterCharge`). ``lexical``: the hybrid read's lexical list and where
        it was read (:meth:`retrieve_lexical`); the read fuses it when it runs there too (the
        same standby, or the primary), else reads the list again."""
        tenant = look.tenant
        charge = charge if charge is not None else FilterCharge(self, look, spec, bill)
        given, given_at = lexical if lexical is not None else (None, None)

        async def read(conn, standby, **kw):
            await charge.within(conn)
            return await read_spec(conn, spec, query, embedding, on_primary=standby is None,
                                   lexical=given if standby is given_at else None, **kw)

        query_key = self.hash_query(query)  # the query alone: its curated list and its pair scores
        pairs = (self.model_name, query_key) if self.settings.pair_cache else None
        args = dict(generation=look.generation, query_hash=query_key, pairs=pairs)
        with timing.stage("retrieve"):
            async with self.limits.retrieval_slot(tenant):
                charge.before()
                return await self._read_where(read, tenant, args, prefer=given_at)

    async def retrieve_lexical(self, look: Lookup, spec: RetrievalSpec, query: str,
                               charge: "FilterCharge") -> tuple[LexicalList, Any]:
        """A hybrid read's lexical list (:func:`kb_rerank.retrieval.spec.read_lexical`) and
        where it was read (the standby, or None: the primary), under the same rules as
        :meth:`retrieve`: the filter paid first, one of the tenant's retrieval slots, its
        share of the pool, a healthy standby that has replayed the request's generation
        when read replicas are set."""
        async def read(conn, standby, generation):
            await charge.within(conn)
            return await read_lexical(conn, spec, query, generation=generation, on_primary=standby is None), standby

        with timing.stage("lexical"):
            async with self.limits.retrieval_slot(look.tenant):
                charge.before()
                return await self._read_where(read, look.tenant, {"generation": look.generation})

    async def _read_where(self, read, tenant, args, prefer=None):
        """``read(conn, standby, **args)`` on a healthy standby (``prefer`` when it still is),
        else on the primary (``standby`` None)."""
        standby = None
        if self.replicas is not None:
            standby = prefer if prefer is not None and prefer.healthy else self.replicas.pick()
        if standby is not None:
            try:
                async with self.limits.connection(standby.pool, tenant) as conn:
                    async with atenant_transaction(conn, tenant):
                        return await read(conn, standby, **args)
            except replica_reads.StandbyBehind:
                log.debug("standby %s behind the request's generation: read on the primary", standby.name)
            except replica_reads.RETRY_ON_PRIMARY as exc:
                self.replicas.failed(standby, exc)
        async with self.connection(tenant) as conn:
            async with atenant_transaction(conn, tenant):
                return await read(conn, None, **args)

    def note_documents(self, tenant: uuid.UUID, generation: int, n: int) -> None:
        """The tenant's document count at ``generation`` (bounded: the busy tenants)."""
        self._documents.pop(tenant, None)
        self._documents[tenant] = (generation, n)
        while len(self._documents) > 10_000:
            self._documents.popitem(last=False)

    async def score(self, flow: Flow, bill: Bill, look: Lookup, chosen: list[Candidate],
                    cached: dict | None) -> scoring.Scored:
        """The cross-encoder over ``chosen`` (pairs the pair cache holds are not sent); a
        fallback is counted under the flow's source and reloads the model in the background."""
        if not chosen:
            return scoring.Scored([])
        keys = pair_keys(chosen)
        if cached is None and self.settings.pair_cache:
            # not read with the candidates (caller documents, or candidates from a standby)
            async with self.connection(look.tenant) as conn:
                async with atenant_transaction(conn, look.tenant):
                    cached = await pair_cache.get_live(conn, self.model_name, self.hash_query(flow.normalized),
                                                       keys, generation=look.generation)
        with timing.stage("rerank"):
            scored = await scoring.score(self.reranker, flow.normalized, [c.content for c in chosen], keys, cached,
                                         timeout_s=self.settings.rerank_timeout_s,
                                         budget_ms=self.settings.rerank_budget_ms, slot=bill.model)
        bill.scored(scored.sent)
        if scored.partial:
            self.metrics.partial(flow.source, scored.partial)
        if scored.sent:
            self.metrics.model_call(scored.ms / 1000.0, scored.sent)
        if scored.reason is not None:
            self.metrics.fallback(flow.source, scored.reason)
            self._reload_model()
        else:
            self.metrics.pair_scores(scored.cached, scored.sent)
        if not self.settings.pair_cache:
            scored.new_pairs = {}
        return scored

    async def record(self, flow: Flow, tenant, trace_id: str, out: Outcome, t0: float, *, write: bool,
                     extra: str | None = None, claim: Claim | None = None) -> None:
        """One statement, its own transaction (kb.record_outcome): all of it or none."""
        parts = (out.fallback_reason, out.detail if out.detail is not None else flow.tag, extra)
        detail = ";".join(p for p in parts if p) or None
        cache = write and out.cacheable
        # pair scores are keyed by the answer's model: none when it names none
        pairs = write and out.fallback_reason is None and out.model is not None and self.settings.pair_cache
        with timing.stage("record"):
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
                    claimant=claim.claimant if claim is not None and claim.held else None)
        if claim is not None:
            claim.held = False
        log.info("request %s source=%s tenant=%s query_hash=%s candidates=%d results=%d rerank_ms=%d%s",
                 "fallback" if out.fallback_reason else "served", flow.source, tenant, out.query_hash,
                 out.candidate_count, out.returned_count, out.rerank_ms,
                 f" reason={out.fallback_reason}" if out.fallback_reason else "")

    # ------------------------------------------------------------------ background work
    def _reload_model(self) -> None:
        """(Re)load the model in the background when it is not ready (after a fallback)."""
        if self.reranker is not None and not self.reranker.ready:
            self._later(self.reranker.ensure_loaded_async())

    def _later(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
