"""The flow behind ``POST /v2/rerank`` (Cohere v2 rerank shape): the caller's documents, no
knowledge-base search (run by :class:`kb_rerank.endpoints.runner.Pipeline`: single flight,
cache, audit, writes).

Request ``{model?, query, documents: [str | {text, id?, scores?: {bm25?, cosine?},
metadata?: {source?, authority?, updated_at?}}], top_n?, max_tokens_per_doc?,
return_documents?}`` plus our ``lambda``, ``recency_weight``, ``half_life_days``,
``authority_weight``, ``explain``. Response ``{id, results: [{index, relevance_score,
document?: {text}, tier, final_score, mmr: {penalty, max_sim}}], meta: {...}}``;
``relevance_score`` is the cross-encoder's score (0..1; null, with ``final_score`` and
``tier``, for a document it did not score). Results: by default Cohere's order, the
``top_n`` of highest ``relevance_score`` (``meta.order``); in ``final_score`` order when the
request asks for diversity (``lambda`` < 1) or a boost. ``guard``: ``apply`` (default: the
tenant's injection policy, the one departure from Cohere's contract) or ``report``.

Key: the whole normalised request (the documents as the SHA-256 of their canonical JSON) and
the tenant's injection policy,
source ``caller_documents``, generation 0 (``pair_cache.CALLER_DOCUMENTS_GENERATION``): the
answer reads no knowledge-base document, so an ingest does not evict it and it can hold no
knowledge-base text. The flow builds the :class:`~kb_rerank.endpoints.responses.V2Response`;
the cache row holds ``{"kind": "kb_v2_rerank_v2", "response": ...}`` encoded from it.

Compute (a miss):
1. The documents (each with its pair) and one passage a scored document that the guard and
   MMR will embed are the flow's ``admission``, charged before the cache read
   (:mod:`.costs`). The further texts the guard embeds (the chunks of a document longer than
   one chunk beyond its first, and the spans of the chunks its classifier finds doubtful) are
   debited after the fact when the request ends (served, failed or cancelled), never refused.
   A cache hit or a single-flight follower embeds none and pays none of them.
2. First stage: RRF (k = 60) of the caller's bm25 and cosine ranks where given, else input
   order; more than ``rerank_max_candidates`` documents -> the best are scored, the rest
   dropped (``meta.cut_off``). ``max_tokens_per_doc`` truncates each document to that many
   whitespace-separated tokens before scoring.
3. Guard, the rule ingestion stores per chunk (:mod:`kb_rerank.guard.verdict`: the learned
   detector over the embedding and the pattern signals, with its veto floor) over the chunks
   ingestion would store of each document (``chunk_max_chars``, ``chunk_overlap``; flagged
   when one is), off the event loop: the patterns in the detectors' worker thread within
   ``guard_budget_ms``, every chunk's embedding on the embedder's executor meanwhile, then
   the spans the gate asks for, nothing waited for past ``guard_embed_timeout_s``; then the
   guard policy (:mod:`.guard_policy`). A document the classifier could not reach (the
   embedder failed, or the cap) has ``classified`` False and is counted in
   ``meta.unclassified``; an answer with uninspected or unclassified documents is served,
   not cached.
4. Scoring (:meth:`~kb_rerank.endpoints.runner.Pipeline.score`): pair cache keyed by the zero chunk id
   (``pair_cache.NO_CHUNK``) and the sha256 of the scored text. No model score at all (a
   fallback): by default (``KB_V2_FALLBACK=error``) a 503 ``model_unavailable`` with the
   reason and ``Retry-After`` (:class:`~kb_rerank.rerank.compose.ModelUnavailable`: the
   caller asked for a reranker, as TEI and hosted rerankers answer); with ``fused`` the
   first-stage order, honest as every degraded answer is (:mod:`kb_rerank.rerank.compose`:
   ``relevance_score`` and ``tier`` null where the model did not score, ``meta.model`` null,
   ``meta.ranked_by: "fused"``, ``meta.warnings``, ``X-KB-Fallback``).
5. MMR over the embeddings of step 3 (``embedder.embed_passages``; a document of several
   chunks: the pooled vector of its chunks, :func:`verdict.pool`; one the guard could not
   embed is embedded here the same way), composite, tiers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any, Awaitable, Callable, Mapping

import msgspec
import numpy as np
from msgspec import UNSET

from kb_rerank.core.candidate import Candidate, sha256_hex
from kb_rerank.guard import verdict
from kb_rerank.rerank import diversify
from kb_rerank.core import timing
from kb_rerank.rerank.compose import (ModelUnavailable, answer_model, degraded_warning, ranked_by,
                                        reported_score, reported_tier, rounded)
from kb_rerank.core.costs import Work
from kb_rerank.endpoints.runner import Lookup, Outcome, Selection, Served, StoredResponse
from kb_rerank.rerank import scoring
from kb_rerank.rerank.scoring import Scored
from kb_rerank.guard.policy import apply as apply_policy
from kb_rerank.core.limits import LimitExceeded
from kb_rerank.core.query import canonical_json, normalize_query
from kb_rerank.endpoints.requests import V2Document, V2Request
from kb_rerank.endpoints.responses import (Mmr, ScoreRank, V2ApiVersion, V2BilledUnits, V2Filtered, V2Meta,
                                         V2RerankStage, V2Response, V2Result, V2ResultDocument, V2Stages)
from kb_rerank.core.settings import Settings
from kb_rerank.rerank import pair_cache

log = logging.getLogger(__name__)

SOURCE = "caller_documents"
CACHE_KIND = "kb_v2_rerank_v2"  # a new kind whenever the stored answer changes shape: older rows miss
RRF_K = 60  # the first stage over the caller's scores: textbook RRF


def truncate_tokens(text: str, n: int | None) -> str:
    if n is None:
        return text
    toks = text.split()
    return text if len(toks) <= n else " ".join(toks[:n])


def first_stage(docs: list[V2Document]) -> list[float]:
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
            fused[i] += 1.0 / (RRF_K + r)
    return fused


def pieces_estimate(n_chars: int, max_chars: int, overlap: int) -> int:
    """How many chunks of at most ``max_chars`` overlapping by ``overlap`` a text of ``n_chars``
    makes, cut at exact lengths (the chunker cuts at boundaries, so it may make a few more)."""
    if n_chars <= max_chars:
        return 1
    return 1 + math.ceil((n_chars - max_chars) / max(1, max_chars - overlap))


class _Once:
    """``embed`` with each distinct text embedded once: a text asked for again (MMR after the
    guard) awaits the first call, also one the guard stopped waiting for, instead of a second.
    :meth:`cancel` ends the calls still under way when no one will read them (the inspection
    over, or the request abandoned): their embedding units not started are dropped."""

    def __init__(self, embed: Callable[[list[str]], Awaitable[np.ndarray]]) -> None:
        self.embed = embed
        self.started: dict[str, tuple[asyncio.Future, int]] = {}

    async def __call__(self, texts: list[str]) -> np.ndarray:
        started = self.started
        todo = [t for t in dict.fromkeys(texts) if t not in started or _failed(started[t][0])]
        if todo:
            call = asyncio.ensure_future(self.embed(todo))
            started.update((t, (call, i)) for i, t in enumerate(todo))
        rows = []
        for t in texts:
            call, i = started[t]
            rows.append(np.asarray(await asyncio.shield(call), dtype=np.float32)[i])
        return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)

    def cancel(self) -> None:
        for call in {call for call, _ in self.started.values()}:
            if not call.done():
                call.cancel()
            call.add_done_callback(_read)


def _read(call: asyncio.Future) -> None:
    if not call.cancelled():
        call.exception()  # read, so that an abandoned call's failure is not reported as unhandled


def _failed(call: asyncio.Future) -> bool:
    return call.done() and (call.cancelled() or call.exception() is not None)


class CallerDocumentsFlow(StoredResponse):
    """``POST /v2/rerank``."""

    source = SOURCE
    cache_kind = CACHE_KIND
    response_type = V2Response
    tag = "v2_rerank"
    fixed_generation = pair_cache.CALLER_DOCUMENTS_GENERATION
    keyed_on_policy = True
    retrieval = None
    miss = Work()  # the documents' pairs and passages were paid at admission

    def __init__(self, req: V2Request, settings: Settings, model: str, classifier: Any = None) -> None:
        self.req, self.settings, self.model = req, settings, model
        self.normalized = normalize_query(req.query)
        # Cohere's contract by default: the highest relevance first, no diversity; MMR only when
        # the request asks (``lambda`` < 1), the composite only when it asks for a boost
        self.lam = 1.0 if req.lam is None else req.lam
        self.composite = self.lam < 1.0 or bool(req.recency_weight) or bool(req.authority_weight)
        # the learned injection detector (None: its weights do not fit the embedder, or it may
        # not vote). It reads each scored document's embedding, which MMR (lambda < 1) needs
        # anyway: with lambda = 1 the documents are embedded for the classifier alone, since
        # lambda is a ranking choice of the caller and must not switch off a detector
        # ingestion applies to every chunk (the cost: docs/guardrails.md)
        self.classifier = classifier
        # the documents enter the key as the SHA-256 of their canonical JSON, computed once (a
        # body of 1,000 documents is megabytes of JSON to serialise on the event loop)
        docs = [d if isinstance(d, str) else msgspec.to_builtins(d) for d in req.documents]
        self.documents_sha256 = sha256_hex(canonical_json(docs))
        self.docs = [V2Document(text=d) if isinstance(d, str) else d for d in req.documents]
        self.first = first_stage(self.docs)
        self.order = sorted(range(len(self.docs)), key=lambda i: (-self.first[i], i))
        self.cut = self.order[: max(1, settings.rerank_max_candidates)]
        self.texts = [truncate_tokens(self.docs[i].text, req.max_tokens_per_doc) for i in self.cut]
        # the documents (each with its pair) and the pieces the guard and MMR will embed of each
        # scored document (the chunks ingestion would store of it, each at most one model
        # window), before any work on them. The count is the chunker's arithmetic, not the
        # chunking itself (a megabyte of text to chunk would hold the event loop); pieces beyond
        # it and the guard's spans are debited after the fact
        embedded = 0 if self.lam >= 1.0 and classifier is None else sum(
            pieces_estimate(len(t), settings.chunk_max_chars, settings.chunk_overlap) for t in self.texts)
        self.admission = Work(documents=len(self.docs), embeddings=embedded)
        self.unclassified = 0
        self.mmr = False  # set by inspect: MMR applies and every candidate has its embedding
        self.pieces: dict[str, list[str]] = {}  # what the guard read of each document (MMR embeds the same)

    def params(self, policy: str | None) -> Mapping[str, Any]:
        req = self.req
        return {
            "endpoint": "rerank/v2",
            "documents_sha256": self.documents_sha256,
            "top_n": req.top_n, "max_tokens_per_doc": req.max_tokens_per_doc,
            "return_documents": req.return_documents, "lambda": self.lam,
            "recency_weight": req.recency_weight, "half_life_days": req.half_life_days,
            "authority_weight": req.authority_weight, "explain": req.explain, "injection_policy": policy,
            "guard": req.guard,
        }

    def answer(self, served: Served, trace_id: str) -> V2Response:
        body: V2Response = served.body
        meta = msgspec.structs.replace(body.meta, from_cache=served.from_cache, trace_id=trace_id)
        if served.from_cache:
            meta = msgspec.structs.replace(meta, rerank_duration_ms=0)
        return msgspec.structs.replace(body, id=trace_id, meta=meta)

    def candidates(self) -> list[Candidate]:
        """The best ``rerank_max_candidates`` documents by first stage, truncated to
        ``max_tokens_per_doc``."""
        out = []
        for i, text in zip(self.cut, self.texts):
            md = self.docs[i].metadata
            out.append(Candidate(
                id=f"{i:09d}", content=text,
                score=self.first[i], authority=float(md.authority) if md and md.authority is not None else 1.0,
                updated_at=md.updated_at if md else None))
        return out

    async def inspect(self, tools, cands: list[Candidate]) -> None:
        """The guard over every candidate (the rule ingestion stores per chunk), then, for MMR,
        the embeddings it could not make."""
        embed = _Once(tools.embed_passages)  # one embedding a text per request: the guard's, then MMR's
        try:
            await self._inspect(embed, tools, cands)
        finally:
            embed.cancel()  # nothing reads them now (or the request was abandoned)

    async def _inspect(self, embed: "_Once", tools, cands: list[Candidate]) -> None:
        s = self.settings
        with timing.stage("guard"):
            seen = await verdict.inspect_documents(
                [c.content for c in cands], s.guard_budget_ms / 1000.0, classifier=self.classifier,
                threshold=s.guard_classifier_threshold, embed=embed, fatal=(LimitExceeded,),
                embed_timeout_s=s.guard_embed_timeout_s, embed_spans=tools.embed_passages,
                chunk=lambda t: verdict.pieces(t, s.chunk_max_chars, s.chunk_overlap),
                voters=verdict.voters_for(s))
        self.unclassified = seen.unclassified
        if seen.unclassified:
            log.warning("guard: %d of %d documents not reached by the injection classifier (embedder failed, or "
                        "KB_GUARD_EMBED_TIMEOUT_S); the answer is not cached", seen.unclassified, len(cands))
        for c, f, vec, ok, ps in zip(cands, seen.flags, seen.embeddings, seen.classified, seen.pieces):
            c.embedding, c.classified = vec, ok
            self.pieces[c.id] = ps
            if f is None:
                c.inspected = False
            else:
                c.injection_flag, c.injection_score, c.injection_reasons = (f.injection_flag, f.injection_score,
                                                                            f.injection_reasons)
                c.injection_strong, c.spam_flag = f.strong, f.spam_flag
        self.mmr = self.lam < 1.0 and len(cands) > 1
        if not self.mmr:
            return
        try:
            # not embedded by the guard (classifier off, embedder failed, or the cap): the same
            # pieces as the guard's, pooled the same way
            todo = [c for c in cands if c.embedding is None]
            if todo:
                parts = [self.pieces[c.id] for c in todo]
                # capped as the guard's wait is: a call the guard gave up on may still be under way
                got = np.asarray(await asyncio.wait_for(embed([t for ps in parts for t in ps]),
                                                        s.guard_embed_timeout_s), dtype=np.float32)
                at = 0
                for c, ps in zip(todo, parts):
                    c.embedding = verdict.pool(list(got[at:at + len(ps)]), [len(t) for t in ps])
                    at += len(ps)
        except LimitExceeded:
            raise  # the tenant's own embedder cap: 429, not a result without diversity
        except Exception as exc:  # noqa: BLE001 - diversity is best effort (meta.mmr says it was not applied)
            log.warning("embedding documents for MMR failed: %s", type(exc).__name__)
            self.mmr = False

    def select(self, cands: list[Candidate], policy: str) -> Selection:
        # "guard": "report": every verdict reported in meta.filtered, nothing excluded or demoted
        # for it (the "allow" policy)
        policy = "allow" if self.req.guard == "report" else policy
        kept, filtered = apply_policy(cands, policy, self.settings.demote_factor, lambda c: {"index": int(c.id)})
        if not self.composite:
            # Cohere's order is relevance_score's. The one departure is the guard's decision on
            # prompt injection (the tenant's policy: strong evidence excluded, doubtful demoted);
            # any other demotion (keyword stuffing, a document not inspected or not classified
            # in time) is reported, not applied
            injected = {f["index"] for f in filtered if f["reason"] == "prompt_injection" and f["action"] == "demoted"}
            for c in kept:
                c.demote = self.settings.demote_factor if int(c.id) in injected else 1.0
            for f in filtered:
                if f["action"] == "demoted" and f["reason"] != "prompt_injection":
                    f["action"] = "reported"
        return Selection(cands, kept, kept, filtered)

    def compose(self, look: Lookup, sel: Selection, scored: Scored) -> Outcome:
        s, req, docs, first, order = self.settings, self.req, self.docs, self.first, self.order
        n, cands, kept, filtered = len(docs), sel.candidates, sel.kept, sel.filtered
        if scored.reason is not None and s.v2_fallback == "error":
            raise ModelUnavailable(scored.reason)  # the caller asked for a reranker: 503, not a fused order
        rel, by = scoring.relevance(scored, [c.score for c in kept])
        for c, r, b in zip(kept, rel, by):
            c.relevance, c.scored_by = float(r), b
        mmr_used = self.mmr and len(kept) > 1
        if mmr_used:
            embs = np.stack([c.embedding for c in kept]).astype(np.float32)
        else:
            embs = np.eye(max(1, len(kept)), dtype=np.float32)[: len(kept)]
        cut = self.cut
        top_n = req.top_n or len(kept)
        ranked = diversify.composite(kept, embs, lam=self.lam if mmr_used else 1.0, k=len(kept),
                                     recency_weight=req.recency_weight, half_life_days=req.half_life_days,
                                     authority_weight=req.authority_weight)
        if not self.composite:
            # Cohere's order: relevance_score descending (the unscored after, in first-stage order),
            # a document the guard demoted for prompt injection lowered by its demotion
            ranked = sorted(ranked, key=lambda r: (-kept[r.index].relevance * kept[r.index].demote,
                                                   int(kept[r.index].id)))
        results = []
        for pos, r in enumerate(ranked[:top_n]):
            c = kept[r.index]
            i = int(c.id)
            results.append(V2Result(
                index=i, relevance_score=reported_score(c.relevance, c.scored_by),
                final_score=reported_score(r.final_score, c.scored_by),
                tier=reported_tier(r.final_score, c.scored_by, s),
                mmr=Mmr(penalty=r.mmr_penalty, max_sim=r.max_sim),
                id=docs[i].id if docs[i].id is not None else UNSET,
                document=V2ResultDocument(text=docs[i].text) if req.return_documents else UNSET,
                stages=V2Stages(first_stage=ScoreRank(rounded(first[i]), order.index(i) + 1),
                                rerank=V2RerankStage(reported_score(c.relevance, c.scored_by)),
                                final=ScoreRank(reported_score(r.final_score, c.scored_by), pos + 1),
                                demote=rounded(c.demote)) if req.explain else UNSET,
                scored_by=c.scored_by,
            ))
        warning = degraded_warning(scored.reason, scored.partial)
        model = answer_model(self.model, results)
        meta = V2Meta(
            api_version=V2ApiVersion(version="2"), billed_units=V2BilledUnits(search_units=1),
            model=model, ranked_by=ranked_by(model, scored.reason),
            requested_model=req.model,
            documents=n, scored=len(kept), cut_off=n - len(cut),
            lam=self.lam, mmr=mmr_used, injection_policy=look.policy, guard=req.guard,
            order="final_score" if self.composite else "relevance_score",
            filtered=msgspec.convert(filtered, list[V2Filtered]),
            # scored documents the injection classifier could not reach (judged by the patterns
            # alone, or without their spans): the answer is then not cached
            unclassified=self.unclassified,
            fallback=scored.reason is not None, fallback_reason=scored.reason,
            reranked=scored.reranked, partial_reason=scored.partial,
            rerank_duration_ms=scored.ms,
            # Cohere's meta.warnings: shown by clients that read no header
            warnings=[warning] if warning else UNSET,
            from_cache=False, trace_id="")
        # an answer with documents the guard could not inspect or classify (load of the moment,
        # or a failed embedder: not a property of the request) is served but not cached
        return Outcome(V2Response(id="", results=results, meta=meta), n, len(results), model,
                       fallback_reason=scored.reason, rerank_ms=scored.ms, new_pairs=scored.new_pairs,
                       cacheable=all(c.inspected and c.classified for c in cands))
