"""The rerank pipeline behind ``POST /v1/kb/search/rerank``.

Query normalisation (the cache key)
-----------------------------------
``normalize_query``: Unicode NFC, strip, collapse every run of (Unicode) whitespace to
one space. Nothing else: case, accents and punctuation are kept (``ERR_402`` and
``err_402`` are different keys; lexical search folds case and accents itself).
``query_hash`` = HMAC-SHA256 hex, under the server's query-hash key (``KB_QUERY_HASH_KEY``,
else ``<data_dir>/keys/query_hash.key``: :mod:`kb_rerank.keys`), of the UTF-8 of the
normalised query: the one function (:func:`query_hash`) behind every stored query hash
(audit, cache, pair scores, curation), so a stored hash cannot be matched by hashing
guesses without the key. The key is read once per service (app start), not per request.
The normalised query is what is searched and reranked; the plaintext query is never stored
or logged, only its hash.

Steps of a request (tenant ``t``, key ``(t, query_hash, source)``)
--------------------------------------------------------------------
1. Tenant transaction: read the tenant's knowledge-base generation and the live cache row
   at that generation (``expires_at > now()``), in one statement (:mod:`kb_rerank.cache`:
   a change to the tenant's documents bumps the generation, so older answers miss). The
   generation is the one every later step of the request keys on. A valid row is a
   hit: the ``cache_hit`` audit row is written in the same transaction and the cached
   results are returned (``from_cache: true``) without touching the model. A malformed
   row is deleted and treated as a miss.
2. Single flight per key, in process: a request first looks for a leader computing the same
   key. If there is none, it becomes the leader and reads the cache (step 1) once; a leader
   commits its cache row before it leaves, so finding no leader and then no row is a real
   miss. Identical requests arriving meanwhile wait for the leader, then read the cache (a
   hit) or, when the result was not cached (fallback) and the generation has not moved
   since the leader read it, share the leader's result; when the
   leader failed, they fail the same way at once (a database outage costs them no second
   timeout). So a key is computed once however requests interleave.
3. Candidates: the query is embedded on a one-thread executor (not for
   ``lexical_only``), then one tenant transaction runs kb.search_hybrid (up to
   2 x ``candidates``, deduplicated in SQL), kb.search_lexical, kb.search_semantic, or
   reads the curated list (``manual_curation``: curated order, no model call, score
   ``1 - i/(n+1)`` for the i-th (from 0) of n curated chunks: 1.0 down to above 0).
   With ``pair_cache`` on, the same transaction reads the live pair scores of the
   candidates (kb.kb_rerank_pair_scores, key ``(model, query_hash, generation, chunk_id,
   content_hash)``, content_hash = sha256 of the chunk text; :mod:`kb_rerank.pair_cache`).
4. Rerank outside any transaction (no connection held): ``reranker.ascore`` on the pairs
   the pair cache does not hold (none at all when it holds every pair: no model call, not
   even when the model is not ready); model scores are taken at ``real`` precision
   (``pair_cache.as_real``) so cached and fresh scores are bit-identical; top
   ``rerank_top_n`` by score desc then chunk_id; scores are the model's sigmoid in 0..1
   rounded to 6 decimals. When the model is not ready, raises, times out or returns a
   non-finite / out-of-range score: *fallback* -- the candidates' own order (fused order
   for hybrid), score = candidate score / best candidate score clamped to 0..1 (rank
   based ``1 - i/(n+1)`` when the best score is not positive), ``fallback: true`` with
   ``fallback_reason``, a severity-2 ``fallback`` audit row, and a background
   ``ensure_loaded_async`` so the model is (re)loaded for later requests.
5. Tenant transaction: cache write (delete the key's expired row, insert ... on conflict
   do nothing, ``expires_at = now() + cache_ttl_s``), the pairs the model scored for this
   request (same append-only write into kb.kb_rerank_pair_scores, same TTL) and the
   ``served``/``fallback`` audit row, together. Fallback results are NOT cached and write
   no pair scores, so the next request retries the model. Empty results (no candidates)
   are cached like any other served result.

Response fields: ``rerank_duration_ms`` is the time spent in the model call of this
request (0 when the model was not called: cache hit, curation, no candidates, model not
ready, every pair from the pair cache); ``candidate_count`` is the number of candidates retrieved by this request (0 on
a cache hit); ``model`` is the reranker's model name (the cached row's model on a hit,
``manual_curation`` for curated lists).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import hmac
import json
import logging
import math
import re
import time
import unicodedata
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

import msgspec

from . import audit, cache, pair_cache, scoring, search
from .db import atenant_transaction
from .keys import server_key
from .limits import UNLIMITED, Limits
from .settings import SOURCES, Settings

log = logging.getLogger("kb_rerank.service")

Source = Literal["hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation"]
DEFAULT_SOURCE = "hybrid_lexical_semantic"
CURATION_MODEL = "manual_curation"


# --------------------------------------------------------------------------- wire types


class RerankRequest(msgspec.Struct, forbid_unknown_fields=True):
    query: str
    source: Source = DEFAULT_SOURCE


class RerankResult(msgspec.Struct):
    chunk_id: str
    doc_id: str
    doc_title: str
    snippet: str
    rerank_score: float
    source: str


class RerankResponse(msgspec.Struct):
    results: list[RerankResult]
    from_cache: bool
    rerank_duration_ms: int
    trace_id: str
    model: str
    fallback: bool
    fallback_reason: str | None
    candidate_count: int


# --------------------------------------------------------------------------- query, trace id


def normalize_query(query: str) -> str:
    """NFC, strip, collapse internal whitespace. Nothing else."""
    return " ".join(unicodedata.normalize("NFC", query).split())


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def query_hash_key(settings: Settings) -> bytes:
    """The server's query-hash key: ``KB_QUERY_HASH_KEY``, else the key file under data_dir
    (created on first use). Read it once (the service does, at app start) and pass it on."""
    return server_key(settings, "query_hash", settings.query_hash_key)


def query_hash(normalized: str, key: bytes, params: Mapping[str, Any] | None = None) -> str:
    """THE hash of a query, for every stored row that names one (audit, cache, pair scores,
    curation): HMAC-SHA256 hex under ``key`` (:func:`query_hash_key`) of the UTF-8 of the
    normalised query, followed, when ``params`` is given, by ``\\x1f`` and the canonical JSON
    of the parameters that change a result (the cache key of /v1/kb/context and /v2/rerank).
    ``\\x1f`` never occurs in a normalised query (it is whitespace to ``str.split``), so the
    two forms cannot collide."""
    if not isinstance(key, (bytes, bytearray)) or not key:
        raise TypeError("query_hash needs the server's query-hash key (bytes)")
    msg = normalized if params is None else normalized + "\x1f" + canonical_json(params)
    return hmac.new(bytes(key), msg.encode("utf-8"), hashlib.sha256).hexdigest()


_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_TRACE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def trace_id_from_headers(traceparent: str | None, x_trace_id: str | None) -> str:
    """W3C ``traceparent``'s trace-id when valid, else a valid ``X-Trace-Id``
    (1..64 of ``[A-Za-z0-9_-]``), else a new uuid4 hex. Invalid values are ignored."""
    if traceparent:
        m = _TRACEPARENT.match(traceparent.strip().lower())
        if m and m.group(1) != "ff" and m.group(2) != "0" * 32 and m.group(3) != "0" * 16:
            if m.group(1) != "00" or m.group(5) is None:
                return m.group(2)
    if x_trace_id is not None:
        value = x_trace_id.strip()
        if _TRACE_ID.match(value):
            return value
    return uuid.uuid4().hex


TRACE_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("kb_rerank_trace_id", default=None)
_factory_installed = False


def install_trace_log_records() -> None:
    """Give every LogRecord a ``trace_id`` attribute (the current request's, or None),
    via the record factory, so it reaches every handler (caplog included). Idempotent."""
    global _factory_installed
    if _factory_installed:
        return
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not hasattr(record, "trace_id"):
            record.trace_id = TRACE_ID.get()
        return record

    logging.setLogRecordFactory(factory)
    _factory_installed = True


# --------------------------------------------------------------------------- metrics hooks


class PipelineMetrics:
    """What the pipeline reports; the API gives it Prometheus metrics. No-op here."""

    def cache_hit(self, source: str) -> None: ...

    def cache_miss(self, source: str) -> None: ...

    def fallback(self, source: str, reason: str) -> None: ...

    def model_call(self, seconds: float, pairs: int) -> None: ...

    def pair_scores(self, cached: int, scored: int) -> None:
        """A served (non-fallback) rerank: ``cached`` pair scores came from the pair cache,
        ``scored`` were computed by the model."""


# --------------------------------------------------------------------------- the pipeline


@dataclass
class Outcome:
    results: list[dict[str, Any]]
    candidate_count: int
    model: str
    fallback_reason: str | None = None
    rerank_ms: int = 0
    cached: bool = False
    kind: str = audit.SERVED
    # the tenant's knowledge-base generation read before the candidates: the cache and pair
    # scores of this outcome are written under it
    generation: int = 0
    # pair scores the model computed for this outcome, to write into the pair cache
    new_pairs: dict[pair_cache.PairKey, float] = field(default_factory=dict)


CURATION_SQL = (
    "select c.chunk_id, c.doc_id, d.title, left(c.content, 300), c.content"
    " from kb.kb_rerank_curation cu"
    " join kb.chunks c on c.chunk_id = cu.chunk_id and c.tenant_id = cu.tenant_id"
    " join kb.documents d on d.doc_id = c.doc_id and d.tenant_id = c.tenant_id"
    " where cu.tenant_id = kb.current_tenant() and cu.query_hash = %s"
    " order by cu.position"
    " limit %s"
)


def _round(x: float) -> float:
    return min(1.0, max(0.0, round(float(x), 6)))


def _rank_score(i: int, n: int) -> float:
    return _round(1.0 - i / (n + 1))


def _result(c: search.Candidate, score: float, source: str) -> dict[str, Any]:
    return {
        "chunk_id": str(c.chunk_id),
        "doc_id": str(c.doc_id),
        "doc_title": c.doc_title,
        "snippet": c.snippet,
        "rerank_score": score,
        "source": source,
    }


def fallback_results(candidates: list[search.Candidate], top_n: int, source: str) -> list[dict[str, Any]]:
    """Candidates in their own (fused) order; score / best score, clamped to 0..1."""
    top = candidates[:top_n]
    best = max((c.score for c in candidates if c.score is not None and math.isfinite(c.score)), default=0.0)
    out = []
    for i, c in enumerate(top):
        if best > 0 and c.score is not None and math.isfinite(c.score):
            s = _round(c.score / best)
        else:
            s = _rank_score(i, len(top))
        out.append(_result(c, s, source))
    return out


class RerankService:
    """One per app: holds the pool, the embedder, the reranker and the single-flight map."""

    def __init__(self, settings: Settings, pool, embedder, reranker, *, embed_executor=None,
                 metrics: PipelineMetrics | None = None, hash_key: bytes | None = None,
                 limits: Limits | None = None) -> None:
        self.settings = settings
        # the query-hash key, read once here (app start), never per request
        self.hash_key = hash_key if hash_key is not None else query_hash_key(settings)
        self.audit_key = audit.AuditKey.from_settings(settings)  # signs audit rows; read once too
        self.limits = limits or UNLIMITED  # per-tenant costs and caps (kb_rerank.limits)
        self.pool = pool
        self.embedder = embedder
        self.reranker = reranker
        self.embed_executor = embed_executor
        self.metrics = metrics or PipelineMetrics()
        self._inflight: dict[tuple[str, str, str], asyncio.Future] = {}
        self._background: set[asyncio.Task] = set()

    async def audit(self, conn, tenant, record: audit.AuditRecord) -> None:
        """One audit row in ``conn``'s tenant transaction, signed with this service's key."""
        await audit.append(conn, record, tenant_id=tenant, key=self.audit_key)

    def hash_query(self, normalized: str, params: Mapping[str, Any] | None = None) -> str:
        """:func:`query_hash` under this service's key."""
        return query_hash(normalized, self.hash_key, params)

    @property
    def model_name(self) -> str:
        return str(getattr(self.reranker, "model_name", None) or self.settings.reranker_model)

    # ------------------------------------------------------------------ entry point
    async def rerank(self, tenant: uuid.UUID, query: str, source: str, trace_id: str) -> RerankResponse:
        if source not in SOURCES:
            raise ValueError(f"unknown source {source!r}")
        t0 = time.perf_counter()
        normalized = normalize_query(query)
        qh = self.hash_query(normalized)
        key = (str(tenant), qh, source)
        for _attempt in range(3):
            pending = self._inflight.get(key)
            if pending is None:
                break
            # Another request computes this key: wait for it, then read the cache.
            shared: Outcome | Exception | None = await asyncio.shield(pending)
            if isinstance(shared, Exception):
                # The leader failed (the database unavailable, say): fail the same way now,
                # not after waiting out another timeout on the same cause.
                raise shared
            hit, generation = await self._cache_hit(tenant, qh, source, trace_id, t0)
            if hit is not None:
                return hit
            if shared is not None and shared.generation == generation:
                # Not cached (fallback): serve the same result, audited for this request. Only
                # at the generation the leader computed it at: after a change to the tenant's
                # documents the follower computes afresh (it may hold a deleted text).
                await self._record(tenant, qh, source, trace_id, shared, t0, write_cache=False,
                                   detail_extra="single_flight")
                return self._response(shared, trace_id, from_cache=False)
            # the leader was cancelled (its client went away), or its result belongs to an
            # older generation: compute ourselves (we may become the leader)
        # Lead first, then read the cache once: a leader commits its cache row before it
        # leaves the map, so a request that finds no leader and then no row is a real miss
        # (one cache read per request, hit or miss).
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        outcome: Outcome | None = None
        failure: Exception | None = None
        try:
            hit, generation = await self._cache_hit(tenant, qh, source, trace_id, t0)
            if hit is not None:
                return hit
            self.metrics.cache_miss(source)
            outcome = await self._compute(tenant, normalized, qh, source, generation)
            outcome.generation = generation  # its cache row and pair scores are written under it
            await self._record(tenant, qh, source, trace_id, outcome, t0,
                               write_cache=outcome.fallback_reason is None)
            return self._response(outcome, trace_id, from_cache=False)
        except Exception as exc:
            failure = exc
            raise
        finally:
            if self._inflight.get(key) is fut:
                del self._inflight[key]
            if not fut.done():
                # followers get the outcome, or the failure to raise in turn
                fut.set_result(failure if failure is not None else outcome)

    # ------------------------------------------------------------------ step 1
    async def _cache_hit(self, tenant, qh: str, source: str, trace_id: str,
                         t0: float) -> tuple[RerankResponse | None, int]:
        """(the cached response or None, the tenant's knowledge-base generation)."""
        async with self.limits.connection(self.pool, tenant) as conn:
            async with atenant_transaction(conn, tenant):
                generation, entry = await cache.get_live(conn, qh, source, max_results=self.settings.rerank_top_n)
                if entry is None:
                    return None, generation
                model = entry.model or self.model_name
                await self.audit(conn, tenant, audit.AuditRecord(
                    kind=audit.CACHE_HIT, source=source, query_hash=qh, trace_id=trace_id, model=model,
                    candidate_count=0, returned_count=len(entry.results),
                    duration_ms=(time.perf_counter() - t0) * 1000.0,
                ))
        self.metrics.cache_hit(source)
        log.info("rerank cache hit tenant=%s source=%s query_hash=%s results=%d",
                 tenant, source, qh, len(entry.results))
        outcome = Outcome(results=entry.results, candidate_count=0, model=model, cached=True,
                          kind=audit.CACHE_HIT, generation=generation)
        return self._response(outcome, trace_id, from_cache=True), generation

    # ------------------------------------------------------------------ steps 3-4
    async def _compute(self, tenant, normalized: str, qh: str, source: str, generation: int) -> Outcome:
        s = self.settings
        if source == "manual_curation":
            async with self.limits.connection(self.pool, tenant) as conn:
                async with atenant_transaction(conn, tenant):
                    cur = await conn.execute(CURATION_SQL, [qh, s.rerank_top_n])
                    rows = await cur.fetchall()
            cands = [search.Candidate(r[0], r[1], r[2], r[3], r[4], 0.0) for r in rows]
            results = [_result(c, _rank_score(i, len(cands)), source) for i, c in enumerate(cands)]
            return Outcome(results=results, candidate_count=len(cands), model=CURATION_MODEL)

        # the whole miss (query embedding, at most `max_pairs` pairs) is charged before any
        # work; the pairs not sent are given back in _rerank_candidates
        max_pairs = 2 * s.candidates if source == "hybrid_lexical_semantic" else s.candidates
        reserved = self.limits.reserve_miss(tenant, embeddings=int(source != "lexical_only"), max_pairs=max_pairs)
        embedding = None
        if source != "lexical_only":
            loop = asyncio.get_running_loop()
            # a refused embedder slot refuses the whole miss: its reservation goes back
            async with self.limits.embedding(tenant, charge=False, paid=self.limits.cost_per_embedding + reserved):
                embedding = await loop.run_in_executor(self.embed_executor, self.embedder.embed_query, normalized)
        cached: dict[pair_cache.PairKey, float] | None = None
        async with self.limits.connection(self.pool, tenant) as conn:
            async with atenant_transaction(conn, tenant):
                if source == "hybrid_lexical_semantic":
                    # fused from lists `fusion_depth` deep; the best 2 x candidates go on
                    cands = (await search.ahybrid(conn, normalized, embedding, s.fusion_depth, **s.fusion))[
                        : 2 * s.candidates]
                elif source == "lexical_only":
                    cands = await search.alexical(conn, normalized, s.candidates, k1=s.bm25_k1, b=s.bm25_b)
                else:
                    cands = await search.asemantic(conn, embedding, s.candidates)
                if s.pair_cache and cands:
                    cached = await pair_cache.get_live(
                        conn, self.model_name, qh, [pair_cache.content_key(c.chunk_id, c.content) for c in cands],
                        generation=generation)
        seen: set = set()
        unique = []
        for c in cands:
            if c.chunk_id not in seen:
                seen.add(c.chunk_id)
                unique.append(c)
        if not unique:
            self.limits.settle_pairs(tenant, reserved, 0)
            return Outcome(results=[], candidate_count=0, model=self.model_name)
        return await self._rerank_candidates(normalized, unique, source, cached=cached, tenant=tenant,
                                             reserved=reserved)

    async def _rerank_candidates(self, normalized: str, cands: list[search.Candidate], source: str, *,
                                 cached: dict[pair_cache.PairKey, float] | None = None, tenant=None,
                                 reserved: float = 0.0) -> Outcome:
        """Scores ``cands`` (:func:`kb_rerank.scoring.score`): pairs found in ``cached`` (the
        live pair scores read in the candidates' transaction; None when the pair cache is off)
        are not sent to the model; the pairs reserved with the miss are settled to those sent."""
        s = self.settings
        scored = await scoring.score(
            reranker=self.reranker, settings=s, metrics=self.metrics, limits=self.limits,
            reload_later=self.reload_model_later, query=normalized, texts=[c.content for c in cands],
            keys=[pair_cache.content_key(c.chunk_id, c.content) for c in cands], cached=cached,
            tenant=tenant, reserved=reserved, source=source)
        if scored.scores is None:
            return Outcome(results=fallback_results(cands, s.rerank_top_n, source),
                           candidate_count=len(cands), model=self.model_name,
                           fallback_reason=scored.reason, rerank_ms=scored.ms, kind=audit.FALLBACK)
        scores = scored.scores
        order = sorted(range(len(cands)), key=lambda i: (-scores[i], str(cands[i].chunk_id)))
        results = [_result(cands[i], _round(scores[i]), source) for i in order[: s.rerank_top_n]]
        return Outcome(results=results, candidate_count=len(cands), model=self.model_name, rerank_ms=scored.ms,
                       new_pairs=scored.new_pairs)

    def reload_model_later(self) -> None:
        """(Re)load the model in the background when it is not ready (after a fallback)."""
        ensure = getattr(self.reranker, "ensure_loaded_async", None)
        if ensure is None or getattr(self.reranker, "ready", False):
            return
        task = asyncio.get_running_loop().create_task(ensure())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ step 5
    async def _record(self, tenant, qh: str, source: str, trace_id: str, outcome: Outcome, t0: float, *,
                      write_cache: bool, detail_extra: str | None = None) -> None:
        detail = outcome.fallback_reason
        if detail_extra:
            detail = f"{detail};{detail_extra}" if detail else detail_extra
        async with self.limits.connection(self.pool, tenant) as conn:
            async with atenant_transaction(conn, tenant):
                if write_cache:
                    await cache.put(conn, qh, source, outcome.results, generation=outcome.generation,
                                    ttl_s=self.settings.cache_ttl_s, trace_id=trace_id, model=outcome.model)
                if write_cache and outcome.fallback_reason is None and outcome.new_pairs:
                    await pair_cache.put(conn, outcome.model, qh, outcome.new_pairs, generation=outcome.generation,
                                         ttl_s=self.settings.cache_ttl_s)
                await self.audit(conn, tenant, audit.AuditRecord(
                    kind=audit.FALLBACK if outcome.fallback_reason else audit.SERVED,
                    source=source, query_hash=qh, trace_id=trace_id, model=outcome.model,
                    candidate_count=outcome.candidate_count, returned_count=len(outcome.results),
                    duration_ms=(time.perf_counter() - t0) * 1000.0, detail=detail,
                ))
        log.info(
            "rerank %s tenant=%s source=%s query_hash=%s candidates=%d results=%d rerank_ms=%d%s",
            "fallback" if outcome.fallback_reason else "served", tenant, source, qh,
            outcome.candidate_count, len(outcome.results), outcome.rerank_ms,
            f" reason={outcome.fallback_reason}" if outcome.fallback_reason else "",
        )

    def _response(self, outcome: Outcome, trace_id: str, *, from_cache: bool) -> RerankResponse:
        results = msgspec.convert(outcome.results[: self.settings.rerank_top_n], list[RerankResult])
        return RerankResponse(
            results=results,
            from_cache=from_cache,
            rerank_duration_ms=max(0, int(outcome.rerank_ms)) if not from_cache else 0,
            trace_id=trace_id,
            model=outcome.model,
            fallback=outcome.fallback_reason is not None,
            fallback_reason=outcome.fallback_reason,
            candidate_count=outcome.candidate_count,
        )
