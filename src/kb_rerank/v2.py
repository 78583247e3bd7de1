"""``POST /v1/kb/context`` and ``POST /v2/rerank``: context ranking with guardrails.

Both routes sit behind the same guard as ``POST /v1/kb/search/rerank`` (Bearer JWT ->
tenant, per-tenant rate limit, trace id from ``traceparent`` / ``X-Trace-Id``), answer
errors as ``{"error", "field", "detail"}`` (400 invalid JSON, 422 naming the field, 413
too large; bodies decoded by :mod:`kb_rerank.body`, as the rerank route's) and write a
hash-chained audit row per served request. ``api.create_app`` registers the two handlers
inside its guarded router, each with its body limit (``max_body_bytes`` for the context
route, ``v2_max_body_bytes`` for ``/v2/rerank``), enforced while the body is read.

POST /v1/kb/context
-------------------
Body ``{"query": str, "top_n"?: int, "lambda"?: 0..1, "recency_weight"?: >=0,
"half_life_days"?: >0, "authority_weight"?: >=0, "explain"?: bool}``.

1. Tenant transaction: read the tenant's ``kb.tenant_policy`` (default ``exclude``), its
   knowledge-base generation and the live cache row at that generation (bumped by every
   change to the tenant's documents: :mod:`kb_rerank.cache`). The key's ``query_hash`` is
   ``service.query_hash`` (HMAC-SHA256 under the server's query-hash key) of the normalised
   query + ``"\\x1f"`` + the canonical JSON of every parameter that changes the result: the
   request parameters with their defaults filled in, the injection policy, and the settings
   used (candidates, cut-off, gate, tiers, demote factor, model name); source
   ``hybrid_lexical_semantic``. The cache row and the pair scores are written under the
   generation read here, before any candidate is read.
   A hit writes a ``cache_hit`` audit row and returns the stored response.
2. Miss: embed the query; tenant transaction: ``kb.search_hybrid`` (``candidates`` per
   list), then the candidates' embeddings, guard flags and document metadata
   (source_uri, authority, updated_at).
3. Gate ("nothing relevant"), separate from fusion: best semantic similarity below
   ``gate_min_similarity`` and no lexical hit -> ``answerable: false``, no results, the
   model is not called.
4. Guard: chunks flagged for prompt injection at ingestion are excluded / demoted /
   allowed per the tenant policy; keyword-stuffed chunks are always demoted (relevance x
   ``demote_factor``). Each is reported in ``filtered: [{chunk_id, reason, action}]``.
5. Cut-off: at most ``rerank_max_candidates`` by fused score (desc, chunk_id) go to the
   cross-encoder. Model failure -> fallback scores (fused score / best), as the rerank
   endpoint does; a fallback result is not cached.
   Pair cache (``pair_cache``, :mod:`kb_rerank.pair_cache`): the live pair scores of the
   candidates are read in step 2's transaction (key: model, ``service.query_hash`` of the
   normalised query -- shared with ``/v1/kb/search/rerank`` --, generation, chunk id, sha256
   of the chunk text); only the other pairs go to the model, and their scores are written in
   step 7's transaction (not on fallback).
6. MMR + composite (:mod:`kb_rerank.ranking`) over the reranked candidates, tiers from
   ``tier_high`` / ``tier_medium``, top ``top_n`` assembled by :mod:`kb_rerank.context`.
7. Tenant transaction: cache write (not on fallback) and the audit row.

POST /v2/rerank
---------------
Cohere v2 rerank shape: ``{model?, query, documents: [str | {text, id?, scores?: {bm25?,
cosine?}, metadata?: {source?, authority?, updated_at?}}], top_n?, max_tokens_per_doc?,
return_documents?}`` plus our ``lambda``, ``recency_weight``, ``half_life_days``,
``authority_weight``, ``explain``. Response ``{id, results: [{index, relevance_score,
document?: {text}, tier, final_score, mmr: {penalty, max_sim}}], meta: {...}}``;
``relevance_score`` is the cross-encoder's score (0..1) and results come in final order.
No database search: at most ``v2_max_documents`` documents of at most
``v2_max_document_chars`` characters (422 ``documents`` / ``documents[i].text``
otherwise), body up to ``v2_max_body_bytes`` (413, refused while reading). ``max_tokens_per_doc`` truncates each
document to that many whitespace-separated tokens before scoring. When more than
``rerank_max_candidates`` documents are given, the best by caller scores (RRF of the bm25
and cosine ranks when given, else input order) are scored and the rest are dropped
(``meta.cut_off``). MMR uses ``embedder.embed_passages`` of the scored documents. Guard
detectors run on each document (injection -> tenant policy, stuffing -> demoted;
``meta.filtered``). Cached under source ``caller_documents`` keyed on the whole
normalised request. Pair cache: each scored (truncated) document is keyed by the zero
uuid (``pair_cache.NO_CHUNK``) and the sha256 of its text, with ``service.query_hash`` of
the normalised query; the live pairs are read in a tenant transaction of their own before
scoring and the new ones written with the audit row (not on fallback). This route reads no
knowledge-base document (only the tenant's injection policy, which is in the cache key),
so its cached answers and pair scores are keyed by generation 0
(``pair_cache.CALLER_DOCUMENTS_GENERATION``), not the tenant's generation: an ingest does
not evict them, and they can hold no knowledge-base text.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, Awaitable

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.datastructures import State

from . import audit, cache, context, guard, pair_cache, ranking, scoring, search
from .body import ApiError  # the app's error type (its auth guard runs in api.create_app's router)
from .body import decode as _decode  # the one body decoder of every JSON route
from .body import invalid as _invalid
from .db import atenant_transaction
from .limits import LimitExceeded
from .scoring import Scored
from .schemas import ERROR_RESPONSES, ContextResponse, V2Response, body_operation, to_response
from .service import TRACE_ID, canonical_json, normalize_query  # noqa: F401 - canonical_json re-exported
from .settings import Settings

log = logging.getLogger("kb_rerank.v2")

CONTEXT_PATH = "/v1/kb/context"
V2_RERANK_PATH = "/v2/rerank"
CONTEXT_SOURCE = "hybrid_lexical_semantic"
V2_SOURCE = "caller_documents"
CACHE_KIND_CONTEXT = "kb_context_v1"
CACHE_KIND_V2 = "kb_v2_rerank_v1"
POLICIES = ("exclude", "demote", "allow")

Lambda = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
PosInt = Annotated[int, msgspec.Meta(ge=1)]
# Caller-supplied numbers that enter the composite score are bounded, so no arithmetic on them
# overflows to inf/NaN (a recency weight of 1.6e308 did: a 500 found by the schema fuzzer).
Weight = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]  # relevance is in 0..1: 100 already swamps it
HalfLife = Annotated[float, msgspec.Meta(gt=0.0, le=36500.0)]  # days: at most 100 years
Authority = Annotated[float, msgspec.Meta(ge=0.0, le=1e6)]  # enters as a / (1 + a)
CallerScore = Annotated[float, msgspec.Meta(ge=-1e12, le=1e12)]  # finite; only ranks are used
_QUERY_DOC = {"query": {"minLength": 1, "description": "search text; NFC, trimmed, whitespace collapsed"}}  # OpenAPI


# --------------------------------------------------------------------------- wire types


class ContextRequest(msgspec.Struct, forbid_unknown_fields=True, rename={"lam": "lambda"}):
    query: str
    top_n: PosInt | None = None
    lam: Lambda | None = None
    recency_weight: Weight = 0.0
    half_life_days: HalfLife = 30.0
    authority_weight: Weight = 0.0
    explain: bool = False


class V2Scores(msgspec.Struct, forbid_unknown_fields=True):
    bm25: CallerScore | None = None
    cosine: CallerScore | None = None


class V2Metadata(msgspec.Struct, forbid_unknown_fields=True):
    source: str | None = None
    authority: Authority | None = None
    updated_at: datetime | None = None


class V2Document(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    id: str | None = None
    scores: V2Scores | None = None
    metadata: V2Metadata | None = None


class V2Request(msgspec.Struct, forbid_unknown_fields=True, rename={"lam": "lambda"}):
    query: str
    documents: list[str | V2Document]
    model: str | None = None
    top_n: PosInt | None = None
    max_tokens_per_doc: PosInt | None = None
    return_documents: bool = False
    lam: Lambda | None = None
    recency_weight: Weight = 0.0
    half_life_days: HalfLife = 30.0
    authority_weight: Weight = 0.0
    explain: bool = False


# --------------------------------------------------------------------------- parsing


def _check_query(q: str, settings: Settings) -> None:
    if "\x00" in q:
        raise _invalid("query", "query must not contain NUL characters")
    if not q.strip():
        raise _invalid("query", "query must not be empty or whitespace only")
    if len(q) > settings.max_query_chars:
        raise _invalid("query", f"query is longer than {settings.max_query_chars} characters")


def parse_context_request(raw: bytes, settings: Settings) -> ContextRequest:
    req: ContextRequest = _decode(raw, ContextRequest)
    _check_query(req.query, settings)
    if req.top_n is not None and req.top_n > settings.context_max_top_n:
        raise _invalid("top_n", f"top_n must be between 1 and {settings.context_max_top_n}")
    return req


def parse_v2_request(raw: bytes, settings: Settings) -> V2Request:
    # The body limit (v2_max_body_bytes) is the route's request_max_body_size: a larger body
    # was refused with 413 while it was read, before it reached here.
    req: V2Request = _decode(raw, V2Request)
    _check_query(req.query, settings)
    n = len(req.documents)
    if n == 0:
        raise _invalid("documents", "documents must not be empty")
    if n > settings.v2_max_documents:
        raise _invalid("documents", f"at most {settings.v2_max_documents} documents per request, got {n}")
    for i, d in enumerate(req.documents):
        text = d if isinstance(d, str) else d.text
        where = f"documents[{i}]" if isinstance(d, str) else f"documents[{i}].text"
        if not text.strip():
            raise _invalid(where, "document text must not be empty")
        if "\x00" in text:
            raise _invalid(where, "document text must not contain NUL characters")
        if len(text) > settings.v2_max_document_chars:
            raise _invalid(where, f"document text is longer than {settings.v2_max_document_chars} characters")
        if not isinstance(d, str):
            # echoed in the answer and stored with it (jsonb refuses NUL): a 500 found by the fuzzer
            for name, value in (("id", d.id), ("metadata.source", d.metadata and d.metadata.source)):
                if value and "\x00" in value:
                    raise _invalid(f"documents[{i}].{name}", f"{name} must not contain NUL characters")
    if req.model and "\x00" in req.model:
        raise _invalid("model", "model must not contain NUL characters")
    # `model` is accepted (Cohere clients always send one) and echoed in meta.requested_model;
    # the deployment's cross-encoder serves (meta.model).
    return req


# --------------------------------------------------------------------------- shared pieces


def _model_name_for(settings: Settings, reranker) -> str:
    return str(getattr(reranker, "model_name", None) or settings.reranker_model)


def _hash(state: State, normalized: str, params: dict[str, Any] | None = None) -> str:
    """``service.query_hash`` under the key the app's service read at start."""
    return state.service.hash_query(normalized, params)


def _r(x: float | None, nd: int = 6) -> float | None:
    if x is None:
        return None
    x = float(x)
    return round(x, nd) if math.isfinite(x) else None


async def _tenant_policy(conn) -> str:
    cur = await conn.execute("select injection_policy from kb.tenant_policy where tenant_id = kb.current_tenant()")
    row = await cur.fetchone()
    return row[0] if row and row[0] in POLICIES else "exclude"


async def _cache_read(conn, qh: str, source: str, kind: str, *,
                      generation: int | None = None) -> tuple[int, dict[str, Any] | None]:
    """(generation, cached response or None): the tenant's knowledge-base generation (or the
    one given) and the key's live row at it."""
    gen, row = await cache.lookup(conn, qh, source, generation=generation)
    if row is None:
        return gen, None
    payload = row[1]
    if not (isinstance(payload, dict) and payload.get("kind") == kind and isinstance(payload.get("response"), dict)):
        log.warning("cache row %s (%s) is malformed: deleted, treated as a miss", row[0], source)
        await conn.execute(cache.DELETE_ROW, [row[0]])
        return gen, None
    return gen, payload["response"]


def _score(state: State, source: str, query: str, texts: list[str], **kw: Any) -> Awaitable[Scored]:
    """:func:`kb_rerank.scoring.score` with the app's reranker, settings, metrics and limits;
    a fallback is counted under ``source`` (the endpoint's) and reloads the model."""
    return scoring.score(reranker=state.reranker, settings=state.settings, metrics=state.metrics,
                         limits=state.limits, reload_later=lambda: _reload_later(state),
                         query=query, texts=texts, source=source, **kw)


async def write_pairs(conn, state: State, model: str, pair_qh: str, scored: Scored, *, generation: int) -> None:
    """The pairs the model scored for this request, into the pair cache under ``generation``
    (not on fallback)."""
    if scored.reason is None and scored.new_pairs and state.settings.pair_cache:
        await pair_cache.put(conn, model, pair_qh, scored.new_pairs, generation=generation,
                             ttl_s=state.settings.cache_ttl_s)


def _reload_later(state: State) -> None:
    svc = getattr(state, "service", None)
    if svc is not None:
        svc.reload_model_later()


def fallback_relevance(first_stage: list[float]) -> list[float]:
    """First-stage score / best, clamped 0..1; rank based when the best is not positive."""
    n = len(first_stage)
    best = max((x for x in first_stage if math.isfinite(x)), default=0.0)
    if best > 0:
        return [min(1.0, max(0.0, x / best)) if math.isfinite(x) else 0.0 for x in first_stage]
    return [1.0 - i / (n + 1) for i in range(n)]


def _rank_map(keys: list[Any], values: list[float | None]) -> dict[Any, int]:
    order = sorted([i for i, v in enumerate(values) if v is not None], key=lambda i: (-values[i], str(keys[i])))
    return {keys[i]: r + 1 for r, i in enumerate(order)}


def _tiers(settings: Settings) -> tuple[float, float]:
    return (float(settings.tier_high), float(settings.tier_medium))


# --------------------------------------------------------------------------- /v1/kb/context


CANDIDATE_META_SQL = (
    "select c.chunk_id, c.embedding, c.injection_flag, c.injection_score, c.injection_reasons, c.spam_flag,"
    " d.source_uri, d.authority, d.updated_at"
    " from kb.chunks c join kb.documents d on d.doc_id = c.doc_id and d.tenant_id = c.tenant_id"
    " where c.chunk_id = any(%s)"
)


@dataclass
class _Cand:
    c: search.Candidate
    embedding: np.ndarray
    injection_flag: bool = False
    injection_score: float = 0.0
    injection_reasons: list[str] = field(default_factory=list)
    spam_flag: bool = False
    source_uri: str = ""
    authority: float = 1.0
    updated_at: datetime | None = None
    demote: float = 1.0


def _context_params(req: ContextRequest, settings: Settings, policy: str, model: str) -> dict[str, Any]:
    return {
        "endpoint": "context/v1",
        "top_n": req.top_n or settings.context_top_n,
        "lambda": settings.mmr_lambda if req.lam is None else req.lam,
        "recency_weight": req.recency_weight,
        "half_life_days": req.half_life_days,
        "authority_weight": req.authority_weight,
        "explain": req.explain,
        "injection_policy": policy,
        "candidates": settings.candidates,
        "fusion_depth": settings.fusion_depth,
        **settings.fusion,
        "rerank_max_candidates": settings.rerank_max_candidates,
        "gate_min_similarity": settings.gate_min_similarity,
        "tiers": [settings.tier_high, settings.tier_medium],
        "demote_factor": settings.demote_factor,
        "model": model,
    }


async def _cached_lookup(state: State, tenant: uuid.UUID, normalized: str, make_params, source: str, kind: str,
                         model: str, trace_id: str, t0: float, detail: str, *, generation: int | None = None):
    """One tenant transaction: the tenant's injection policy, the request's parameters and
    their cache key, the tenant's knowledge-base generation (or ``generation`` when the
    answer does not depend on the knowledge base) and the cache read at it; a hit is
    audited in the same transaction. Returns (policy, params, query_hash, hit or None,
    generation)."""
    async with state.limits.connection(state.pool, tenant) as conn:
        async with atenant_transaction(conn, tenant):
            policy = await _tenant_policy(conn)
            params = make_params(policy)
            qh = _hash(state, normalized, params)
            gen, hit = await _cache_read(conn, qh, source, kind, generation=generation)
            if hit is not None:
                await state.service.audit(conn, tenant, audit.AuditRecord(
                    kind=audit.CACHE_HIT, source=source, query_hash=qh, trace_id=trace_id, model=model,
                    candidate_count=0, returned_count=len(hit.get("results", [])),
                    duration_ms=(time.perf_counter() - t0) * 1000.0, detail=detail,
                ))
    if hit is not None:
        state.metrics.cache_hit(source)
    else:
        state.metrics.cache_miss(source)
    return policy, params, qh, hit, gen


async def build_context(state: State, tenant: uuid.UUID, req: ContextRequest, trace_id: str) -> dict[str, Any]:
    settings: Settings = state.settings
    t0 = time.perf_counter()
    normalized = normalize_query(req.query)
    model = _model_name_for(settings, state.reranker)
    policy, params, qh, hit, gen = await _cached_lookup(
        state, tenant, normalized, lambda policy: _context_params(req, settings, policy, model),
        CONTEXT_SOURCE, CACHE_KIND_CONTEXT, model, trace_id, t0, "context")
    if hit is not None:
        return {**hit, "from_cache": True, "trace_id": trace_id, "rerank_duration_ms": 0, "candidate_count": 0}

    body, fallback_reason, scored = await _compute_context(state, tenant, normalized, req, params, policy, gen)
    async with state.limits.connection(state.pool, tenant) as conn:
        async with atenant_transaction(conn, tenant):
            if scored is not None:
                await write_pairs(conn, state, model, _hash(state, normalized), scored, generation=gen)
            if fallback_reason is None:
                cached = {k: v for k, v in body.items() if k not in ("trace_id", "from_cache")}
                await cache.put(conn, qh, CONTEXT_SOURCE, {"kind": CACHE_KIND_CONTEXT, "response": cached},  # type: ignore[arg-type]
                                generation=gen, ttl_s=settings.cache_ttl_s, trace_id=trace_id, model=model)
            detail = "context" if body["answerable"] or body["candidate_count"] == 0 else "context;unanswerable"
            if not body["answerable"] and body.get("gate", {}).get("closed"):
                detail = "context;gate_closed"
            if fallback_reason:
                detail = f"{fallback_reason};context"
            await state.service.audit(conn, tenant, audit.AuditRecord(
                kind=audit.FALLBACK if fallback_reason else audit.SERVED, source=CONTEXT_SOURCE, query_hash=qh,
                trace_id=trace_id, model=model, candidate_count=body["candidate_count"],
                returned_count=len(body["results"]), duration_ms=(time.perf_counter() - t0) * 1000.0, detail=detail,
            ))
    log.info("context %s tenant=%s query_hash=%s candidates=%d results=%d answerable=%s filtered=%d",
             "fallback" if fallback_reason else "served", tenant, qh, body["candidate_count"], len(body["results"]),
             body["answerable"], len(body["filtered"]))
    return {**body, "from_cache": False, "trace_id": trace_id}


async def _compute_context(state: State, tenant, normalized: str, req: ContextRequest, params: dict[str, Any],
                           policy: str, generation: int) -> tuple[dict[str, Any], str | None, Scored | None]:
    settings: Settings = state.settings
    svc = state.service
    loop = asyncio.get_running_loop()
    async with state.limits.embedding(tenant):
        embedding = await loop.run_in_executor(getattr(svc, "embed_executor", None), state.embedder.embed_query,
                                               normalized)
    async with state.limits.connection(state.pool, tenant) as conn:
        async with atenant_transaction(conn, tenant):
            rows = (await search.ahybrid(conn, normalized, embedding, settings.fusion_depth, **settings.fusion))[
                : 2 * settings.candidates]
            seen: set = set()
            cands: list[search.Candidate] = []
            for c in rows:
                if c.chunk_id not in seen:
                    seen.add(c.chunk_id)
                    cands.append(c)
            meta: dict[Any, tuple] = {}
            cached: dict[pair_cache.PairKey, float] | None = None
            if cands:
                cur = await conn.execute(CANDIDATE_META_SQL, [[c.chunk_id for c in cands]])
                meta = {r[0]: r for r in await cur.fetchall()}
                if settings.pair_cache:
                    cached = await pair_cache.get_live(
                        conn, str(params["model"]), _hash(state, normalized),
                        [pair_cache.content_key(c.chunk_id, c.content) for c in cands], generation=generation)
    top_n = int(params["top_n"])
    lam = float(params["lambda"])
    best_sim = max((c.semantic_score for c in cands if c.semantic_score is not None), default=None)
    lexical_hits = sum(1 for c in cands if c.lexical_rank is not None)
    gate_closed = lexical_hits == 0 and (best_sim is None or best_sim < settings.gate_min_similarity)
    gate = {"closed": gate_closed, "best_similarity": _r(best_sim), "lexical_hits": lexical_hits,
            "threshold": settings.gate_min_similarity}
    body: dict[str, Any] = {
        "answerable": False, "results": [], "filtered": [], "gate": gate,
        "context": context.build_context_block([]), "system_prompt": context.system_prompt(0),
        "model": params["model"], "fallback": False, "fallback_reason": None,
        "candidate_count": len(cands), "reranked_count": 0, "rerank_duration_ms": 0,
        "lambda": lam, "injection_policy": policy,
    }
    if req.explain:
        body["stages"] = []
    if not cands or gate_closed:
        return body, None, None

    # guard policy
    filtered: list[dict[str, Any]] = []
    kept: list[_Cand] = []
    for c in cands:
        m = meta.get(c.chunk_id)
        emb = np.asarray(m[1].to_numpy() if m is not None and hasattr(m[1], "to_numpy") else (m[1] if m else []),
                         dtype=np.float32)
        x = _Cand(c, emb)
        if m is not None:
            x.injection_flag, x.injection_score = bool(m[2]), float(m[3] or 0.0)
            x.injection_reasons, x.spam_flag = list(m[4] or []), bool(m[5])
            x.source_uri, x.authority, x.updated_at = m[6], float(m[7]), m[8]
        if x.injection_flag:
            entry = {"chunk_id": str(c.chunk_id), "reason": "prompt_injection",
                     "score": _r(x.injection_score, 4), "signals": x.injection_reasons}
            if policy == "exclude":
                filtered.append({**entry, "action": "excluded"})
                continue
            if policy == "demote":
                x.demote *= settings.demote_factor
                filtered.append({**entry, "action": "demoted"})
            else:
                filtered.append({**entry, "action": "allowed"})
        if x.spam_flag:
            x.demote *= settings.demote_factor
            filtered.append({"chunk_id": str(c.chunk_id), "reason": "keyword_stuffing", "action": "demoted"})
        kept.append(x)
    body["filtered"] = filtered

    # cut-off before the cross-encoder
    kept.sort(key=lambda x: (-(x.c.score if x.c.score is not None else 0.0), str(x.c.chunk_id)))
    cut = kept[: max(1, settings.rerank_max_candidates)]
    dropped_ids = {x.c.chunk_id for x in kept[len(cut):]}
    body["reranked_count"] = len(cut)
    if not cut:
        return body, None, None
    scored = await _score(state, CONTEXT_SOURCE, normalized, [x.c.content for x in cut],
                          keys=[pair_cache.content_key(x.c.chunk_id, x.c.content) for x in cut],
                          cached=cached, tenant=tenant)
    body["rerank_duration_ms"] = scored.ms
    rel = scored.scores if scored.scores is not None else fallback_relevance([x.c.score for x in cut])
    if scored.reason:
        body["fallback"], body["fallback_reason"] = True, scored.reason

    dim = max((x.embedding.shape[0] for x in cut), default=1)
    embs = np.stack([x.embedding if x.embedding.shape[0] == dim else np.zeros(dim, np.float32) for x in cut])
    rc = [ranking.Candidate(id=str(x.c.chunk_id), relevance=float(rel[i]), text=x.c.content, authority=x.authority,
                            updated_at=x.updated_at, demote=x.demote) for i, x in enumerate(cut)]
    ranked = ranking.composite(rc, embs, lam=lam, k=len(cut), recency_weight=req.recency_weight,
                               half_life_days=req.half_life_days, authority_weight=req.authority_weight)
    tiers = _tiers(settings)
    ids = [x.c.chunk_id for x in cut]
    fused_rank = {x.c.chunk_id: i + 1 for i, x in enumerate(kept)}
    rerank_rank = _rank_map(ids, [float(r) for r in rel])
    final_rank = {cut[r.index].c.chunk_id: pos + 1 for pos, r in enumerate(ranked)}
    results = []
    passages = []
    for pos, r in enumerate(ranked[:top_n]):
        x = cut[r.index]
        c = x.c
        results.append({
            "rank": pos + 1,
            "chunk_id": str(c.chunk_id), "doc_id": str(c.doc_id), "doc_title": c.doc_title,
            "source_path": x.source_uri, "snippet": c.snippet,
            "final_score": r.final_score, "tier": ranking.tier(r.final_score, tiers),
            "rerank_score": _r(rel[r.index]),
            "scores": {"lexical": _r(c.lexical_score), "semantic": _r(c.semantic_score), "fused": _r(c.score),
                       "rerank": _r(rel[r.index]), "final": r.final_score},
            "ranks": {"lexical": c.lexical_rank, "semantic": c.semantic_rank, "fused": fused_rank[c.chunk_id],
                      "rerank": rerank_rank.get(c.chunk_id), "final": pos + 1},
            "mmr": {"penalty": r.mmr_penalty, "max_sim": r.max_sim},
            "boosts": {"recency": _r(r.recency_boost), "authority": _r(r.authority_boost)},
            "flags": {"injection": x.injection_flag, "spam": x.spam_flag, "demoted": x.demote < 1.0},
            "citation": pos + 1,
        })
        passages.append(context.Passage(text=c.content, source=x.source_uri, title=c.doc_title))
    body["results"] = results
    body["answerable"] = bool(results)
    body["context"] = context.build_context_block(passages)
    body["system_prompt"] = context.system_prompt(len(passages))
    if req.explain:
        stages = []
        for x in kept:
            c = x.c
            cid = c.chunk_id
            i = ids.index(cid) if cid in final_rank or cid in rerank_rank else None
            rr = next((r for r in ranked if cut[r.index].c.chunk_id == cid), None)
            stages.append({
                "chunk_id": str(cid),
                "lexical": {"score": _r(c.lexical_score), "rank": c.lexical_rank},
                "semantic": {"score": _r(c.semantic_score), "rank": c.semantic_rank},
                "fused": {"score": _r(c.score), "rank": fused_rank[cid]},
                "rerank": {"score": _r(rel[i]) if i is not None else None, "rank": rerank_rank.get(cid)},
                "mmr": {"penalty": rr.mmr_penalty if rr else None, "max_sim": rr.max_sim if rr else None},
                "final": {"score": rr.final_score if rr else None, "rank": final_rank.get(cid)},
                "selected": final_rank.get(cid, top_n + 1) <= top_n,
                "cut_off": cid in dropped_ids,
                "demote": _r(x.demote),
            })
        for f in filtered:
            if f.get("action") == "excluded":
                c = next(cc for cc in cands if str(cc.chunk_id) == f["chunk_id"])
                stages.append({
                    "chunk_id": f["chunk_id"],
                    "lexical": {"score": _r(c.lexical_score), "rank": c.lexical_rank},
                    "semantic": {"score": _r(c.semantic_score), "rank": c.semantic_rank},
                    "fused": {"score": _r(c.score), "rank": None},
                    "rerank": {"score": None, "rank": None}, "mmr": {"penalty": None, "max_sim": None},
                    "final": {"score": None, "rank": None}, "selected": False, "cut_off": False,
                    "excluded": f["reason"],
                })
        body["stages"] = stages
    return body, scored.reason, scored


async def _serve(request: Request, state: State, parse, build, response_type: type):
    """Shared by the handlers: the request's trace id (set by the auth guard) in the log
    context, the body parsed (a rejection is counted and re-raised), the answer built and
    converted to its response Struct (:mod:`kb_rerank.schemas`)."""
    scope_state = request.scope["state"]
    trace_id: str = scope_state["trace_id"]
    tenant: uuid.UUID = scope_state["tenant"]
    token = TRACE_ID.set(trace_id)
    try:
        try:
            req = parse(await request.body(), state.settings)
        except ApiError as exc:
            state.metrics.rejected.labels(exc.payload.get("error", "invalid")).inc()
            raise
        body = await build(state, tenant, req, trace_id)
        return Response(to_response(body, response_type), headers={"X-Trace-Id": trace_id})
    finally:
        TRACE_ID.reset(token)


@post(CONTEXT_PATH, status_code=200, operation_class=body_operation(ContextRequest, _QUERY_DOC), responses=ERROR_RESPONSES,
      summary="Ranked, guarded context for a language model",
      description="Hybrid retrieval, relevance gate, injection policy, cross-encoder, MMR, tiers, "
                  "and a fenced <context> block with a system prompt template.")
async def context_handler(request: Request, state: State) -> Response[ContextResponse]:
    return await _serve(request, state, parse_context_request, build_context, ContextResponse)


# --------------------------------------------------------------------------- /v2/rerank


def _truncate_tokens(text: str, n: int | None) -> str:
    if n is None:
        return text
    toks = text.split()
    return text if len(toks) <= n else " ".join(toks[:n])


def _first_stage(docs: list[V2Document]) -> list[float]:
    """RRF (k=60) of the caller's bm25 and cosine ranks where given; else input order."""
    n = len(docs)
    have_bm25 = [i for i, d in enumerate(docs) if d.scores and d.scores.bm25 is not None]
    have_cos = [i for i, d in enumerate(docs) if d.scores and d.scores.cosine is not None]
    if not have_bm25 and not have_cos:
        return [1.0 - i / (n + 1) for i in range(n)]
    fused = [0.0] * n
    for idx, getter in ((have_bm25, lambda d: d.scores.bm25), (have_cos, lambda d: d.scores.cosine)):
        order = sorted(idx, key=lambda i: (-getter(docs[i]), i))
        for r, i in enumerate(order, start=1):
            fused[i] += 1.0 / (60 + r)
    return fused


def _v2_params(req: V2Request, settings: Settings, policy: str, model: str) -> dict[str, Any]:
    docs = [d if isinstance(d, str) else msgspec.to_builtins(d) for d in req.documents]
    return {
        "endpoint": "rerank/v2", "documents": docs, "top_n": req.top_n,
        "max_tokens_per_doc": req.max_tokens_per_doc, "return_documents": req.return_documents,
        "lambda": settings.mmr_lambda if req.lam is None else req.lam,
        "recency_weight": req.recency_weight, "half_life_days": req.half_life_days,
        "authority_weight": req.authority_weight, "explain": req.explain, "injection_policy": policy,
        "rerank_max_candidates": settings.rerank_max_candidates, "tiers": [settings.tier_high, settings.tier_medium],
        "demote_factor": settings.demote_factor, "model": model,
    }


async def rerank_v2(state: State, tenant: uuid.UUID, req: V2Request, trace_id: str) -> dict[str, Any]:
    settings: Settings = state.settings
    t0 = time.perf_counter()
    # the documents, and the passages MMR will embed, are charged before any work on them
    # (hashing, guard, scoring, embedding); 429 if short
    mmr_texts = min(len(req.documents), max(1, settings.rerank_max_candidates))
    state.limits.charge_documents(tenant, len(req.documents),
                                  mmr_texts if (settings.mmr_lambda if req.lam is None else req.lam) < 1.0 else 0)
    normalized = normalize_query(req.query)
    model = _model_name_for(settings, state.reranker)
    # caller documents only: the answer does not depend on the knowledge base (generation 0)
    policy, params, qh, hit, gen = await _cached_lookup(
        state, tenant, normalized, lambda policy: _v2_params(req, settings, policy, model),
        V2_SOURCE, CACHE_KIND_V2, model, trace_id, t0, "v2_rerank",
        generation=pair_cache.CALLER_DOCUMENTS_GENERATION)
    if hit is not None:
        meta = {**hit.get("meta", {}), "from_cache": True, "trace_id": trace_id, "rerank_duration_ms": 0}
        return {**hit, "id": trace_id, "meta": meta}

    docs = [V2Document(text=d) if isinstance(d, str) else d for d in req.documents]
    n = len(docs)
    first = _first_stage(docs)
    order = sorted(range(n), key=lambda i: (-first[i], i))
    cut = order[: max(1, settings.rerank_max_candidates)]
    texts = [_truncate_tokens(docs[i].text, req.max_tokens_per_doc) for i in cut]

    filtered: list[dict[str, Any]] = []
    keep: list[int] = []  # positions in cut
    demote: dict[int, float] = {}
    # Detectors in a worker thread with a per-request budget (issue 13): a document not
    # inspected in time is demoted like a flagged one (allowed under policy "allow"), not
    # excluded -- a budget spent by other tenants' load must not drop a caller's documents.
    verdicts = await guard.inspect_documents(texts, settings.guard_budget_ms / 1000.0)
    for p, i in enumerate(cut):
        v = verdicts[p]
        if v is None:
            d = 1.0 if policy == "allow" else settings.demote_factor
            filtered.append({"index": i, "reason": "not_inspected", "action": "allowed" if policy == "allow" else "demoted"})
            demote[p] = d
            keep.append(p)
            continue
        inj, spam = v
        d = 1.0
        if inj.flagged:
            entry = {"index": i, "reason": "prompt_injection", "score": _r(inj.score, 4), "signals": list(inj.reasons)}
            if policy == "exclude":
                filtered.append({**entry, "action": "excluded"})
                continue
            if policy == "demote":
                d *= settings.demote_factor
            filtered.append({**entry, "action": "demoted" if policy == "demote" else "allowed"})
        if spam.flagged:
            d *= settings.demote_factor
            filtered.append({"index": i, "reason": "keyword_stuffing", "action": "demoted"})
        demote[p] = d
        keep.append(p)

    # Pair cache for caller documents: chunk id NO_CHUNK (the zero uuid), content hash the
    # sha256 of the (truncated) text that is scored.
    pair_qh = _hash(state, normalized)
    keys = [pair_cache.content_key(None, texts[p]) for p in keep]
    cached: dict[pair_cache.PairKey, float] | None = None
    if settings.pair_cache and keep:
        async with state.limits.connection(state.pool, tenant) as conn:
            async with atenant_transaction(conn, tenant):
                cached = await pair_cache.get_live(conn, model, pair_qh, keys, generation=gen)
    scored = await _score(state, V2_SOURCE, normalized, [texts[p] for p in keep], keys=keys, cached=cached,
                          tenant=tenant, prepaid=True)
    if scored.scores is not None:
        rel = scored.scores
    else:
        rel = fallback_relevance([first[cut[p]] for p in keep])
    lam = float(params["lambda"])
    mmr_used = lam < 1.0 and len(keep) > 1
    if mmr_used:
        loop = asyncio.get_running_loop()
        try:
            async with state.limits.embedding(tenant, len(keep), charge=False):  # prepaid above
                embs = await loop.run_in_executor(getattr(state.service, "embed_executor", None),
                                                  state.embedder.embed_passages, [texts[p] for p in keep])
            embs = np.asarray(embs, dtype=np.float32)
        except LimitExceeded:
            raise  # the tenant's own embedder cap: 429, not a result without diversity
        except Exception as exc:  # noqa: BLE001 - diversity is best effort
            log.warning("embedding documents for MMR failed: %s", type(exc).__name__)
            embs, mmr_used = np.eye(len(keep), dtype=np.float32), False
    else:
        embs = np.eye(max(1, len(keep)), dtype=np.float32)[: len(keep)]
    rc = []
    for j, p in enumerate(keep):
        d = docs[cut[p]]
        md = d.metadata
        upd = md.updated_at if md else None
        rc.append(ranking.Candidate(id=f"{cut[p]:09d}", relevance=float(rel[j]), text=texts[p],
                                    authority=float(md.authority) if md and md.authority is not None else 1.0,
                                    updated_at=upd, demote=demote[p]))
    top_n = req.top_n or len(keep)
    ranked = ranking.composite(rc, embs, lam=lam if mmr_used else 1.0, k=len(keep),
                               recency_weight=req.recency_weight, half_life_days=req.half_life_days,
                               authority_weight=req.authority_weight)
    tiers = _tiers(settings)
    results = []
    for pos, r in enumerate(ranked[:top_n]):
        p = keep[r.index]
        i = cut[p]
        item: dict[str, Any] = {"index": i, "relevance_score": _r(rel[r.index]), "final_score": r.final_score,
                                "tier": ranking.tier(r.final_score, tiers),
                                "mmr": {"penalty": r.mmr_penalty, "max_sim": r.max_sim}}
        if docs[i].id is not None:
            item["id"] = docs[i].id
        if req.return_documents:
            item["document"] = {"text": docs[i].text}
        if req.explain:
            item["stages"] = {"first_stage": {"score": _r(first[i]), "rank": order.index(i) + 1},
                              "rerank": {"score": _r(rel[r.index])},
                              "final": {"score": r.final_score, "rank": pos + 1},
                              "demote": _r(demote[p])}
        results.append(item)
    meta = {
        "api_version": {"version": "2"},
        "billed_units": {"search_units": 1},
        "model": model, "requested_model": req.model,
        "documents": n, "scored": len(keep), "cut_off": n - len(cut),
        "lambda": lam, "mmr": mmr_used, "injection_policy": policy, "filtered": filtered,
        "fallback": scored.reason is not None, "fallback_reason": scored.reason,
        "rerank_duration_ms": scored.ms, "from_cache": False, "trace_id": trace_id,
    }
    body = {"id": trace_id, "results": results, "meta": meta}
    async with state.limits.connection(state.pool, tenant) as conn:
        async with atenant_transaction(conn, tenant):
            await write_pairs(conn, state, model, pair_qh, scored, generation=gen)
            # a fallback, or an answer with documents the guard had no time to inspect (load
            # of the moment, not a property of the request), is served but not cached
            uninspected = any(f["reason"] == "not_inspected" for f in filtered)
            if scored.reason is None and not uninspected:
                await cache.put(conn, qh, V2_SOURCE, {"kind": CACHE_KIND_V2, "response": body},  # type: ignore[arg-type]
                                generation=gen, ttl_s=settings.cache_ttl_s, trace_id=trace_id, model=model)
            await state.service.audit(conn, tenant, audit.AuditRecord(
                kind=audit.FALLBACK if scored.reason else audit.SERVED, source=V2_SOURCE, query_hash=qh,
                trace_id=trace_id, model=model, candidate_count=n, returned_count=len(results),
                duration_ms=(time.perf_counter() - t0) * 1000.0,
                detail=f"{scored.reason};v2_rerank" if scored.reason else "v2_rerank",
            ))
    return body


@post(V2_RERANK_PATH, status_code=200, operation_class=body_operation(V2Request, _QUERY_DOC), responses=ERROR_RESPONSES,
      summary="Rerank caller-supplied documents (Cohere v2 shape)",
      description="Cross-encoder scores, MMR diversity, tiers; no database search.")
async def v2_rerank_handler(request: Request, state: State) -> Response[V2Response]:
    return await _serve(request, state, parse_v2_request, rerank_v2, V2Response)

