"""The flow behind ``POST /v2/rerank`` (Cohere v2 rerank shape): the caller's documents, no
knowledge-base search (run by :class:`kb_rerank.pipeline.flow.Pipeline`: single flight,
cache, audit, writes).

Request ``{model?, query, documents: [str | {text, id?, scores?: {bm25?, cosine?},
metadata?: {source?, authority?, updated_at?}}], top_n?, max_tokens_per_doc?,
return_documents?}`` plus our ``lambda``, ``recency_weight``, ``half_life_days``,
``authority_weight``, ``explain``. Response ``{id, results: [{index, relevance_score,
document?: {text}, tier, final_score, mmr: {penalty, max_sim}}], meta: {...}}``;
``relevance_score`` is the cross-encoder's score (0..1), results in final order.

Key: the whole normalised request (the documents as the SHA-256 of their canonical JSON) and
the tenant's injection policy,
source ``caller_documents``, generation 0 (``pair_cache.CALLER_DOCUMENTS_GENERATION``): the
answer reads no knowledge-base document, so an ingest does not evict it and it can hold no
knowledge-base text. The cache row holds ``{"kind": "kb_v2_rerank_v1", "response": ...}``.

Compute (a miss):
1. The documents (and one passage a scored document that the guard and MMR will embed) are
   charged before any work on them (by the route, before the cache read; :mod:`.limits`).
   The further texts the guard embeds (the chunks of a document longer than one chunk
   beyond its first, and the spans of the chunks its classifier finds doubtful) are charged
   after the fact, as a debt, when the request ends (served, failed or cancelled;
   :meth:`CallerDocumentsFlow.settle`): those actually embedded, debited whatever the
   tenant's bucket holds (never refused; a negative bucket is waited out by the tenant's
   next requests). A cache hit or a single-flight follower embeds none and pays none.
2. First stage: RRF (k = 60) of the caller's bm25 and cosine ranks where given, else input
   order; more than ``rerank_max_candidates`` documents -> the best are scored, the rest
   dropped (``meta.cut_off``). ``max_tokens_per_doc`` truncates each document to that many
   whitespace-separated tokens before scoring.
3. Guard, the rule ingestion stores per chunk (:mod:`kb_rerank.ingest.verdict`: the learned
   detector over the embedding and the pattern signals, with its veto floor) over the chunks
   ingestion would store of each document (``chunk_max_chars``, ``chunk_overlap``; flagged
   when one is), off the event loop: the patterns in the detectors' worker thread within
   ``guard_budget_ms``, every chunk's embedding on the embedder's executor meanwhile, then
   the spans the gate asks for, nothing waited for past ``guard_embed_timeout_s``; then the
   guard policy (:mod:`.guard_policy`). A document the classifier could not reach (the
   embedder failed, or the cap) has ``classified`` False and is counted in
   ``meta.unclassified``; an answer with uninspected or unclassified documents is served,
   not cached.
4. Scoring (:meth:`Pipeline.score`): pair cache keyed by the zero chunk id
   (``pair_cache.NO_CHUNK``) and the sha256 of the scored text; fallback = first-stage
   score / best.
5. MMR over the embeddings of step 3 (``embedder.embed_passages``; a document of several
   chunks: the pooled vector of its chunks, :func:`verdict.pool`; one the guard could not
   embed is embedded here the same way), composite, tiers.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

import msgspec
import numpy as np

from kb_rerank.candidate import Candidate, sha256_hex
from kb_rerank.ingest import verdict
from kb_rerank.ingest.guard_classifier import load_shipped
from kb_rerank.pipeline import diversify, timing
from kb_rerank.pipeline.compose import fallback_relevance, rounded, tiers
from kb_rerank.pipeline.flow import Lookup, Outcome, Pipeline, Served, StoredResponse
from kb_rerank.pipeline.guard_policy import apply as apply_policy
from kb_rerank.pipeline.limits import LimitExceeded
from kb_rerank.pipeline.query import canonical_json, normalize_query
from kb_rerank.pipeline.requests import V2Document, V2Request
from kb_rerank.settings import Settings
from kb_rerank.store import pair_cache
from kb_rerank.store.session import atenant_transaction

log = logging.getLogger(__name__)

SOURCE = "caller_documents"
CACHE_KIND = "kb_v2_rerank_v1"
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


class CallerDocumentsFlow(StoredResponse):
    """``POST /v2/rerank``."""

    source = SOURCE
    cache_kind = CACHE_KIND
    tag = "v2_rerank"
    fixed_generation = pair_cache.CALLER_DOCUMENTS_GENERATION
    keyed_on_policy = True
    # texts embedded beyond the prepaid passages (further chunks, spans) and not yet charged
    # (by settle); once settled, a late batch is charged as it is embedded
    _owed_embeddings = 0
    _settled = False

    def __init__(self, req: V2Request, settings: Settings, model: str) -> None:
        self.req = req
        self.settings = settings
        self.model = model
        self.normalized = normalize_query(req.query)
        self.lam = settings.mmr_lambda if req.lam is None else req.lam
        # the documents enter the key as the SHA-256 of their canonical JSON, computed once: the
        # key is built twice (single flight, then the cache key with the tenant's policy) and
        # a body of 1,000 documents is megabytes of JSON to serialise on the event loop
        docs = [d if isinstance(d, str) else msgspec.to_builtins(d) for d in req.documents]
        self.documents_sha256 = sha256_hex(canonical_json(docs))

    def classifier(self, pipe: Pipeline):
        """The learned injection detector when it applies: the shipped weights fit the
        embedder and the threshold lets it vote (< 1).

        It needs each scored document's embedding. MMR (lambda < 1) embeds them anyway, and
        the guard now embeds them first and hands them to MMR (one embedding a document). With
        lambda = 1 the guard embeds them for the classifier alone (measured in
        ``bench/results/guard-cost-2026-11-30.md``: the embedding is nearly all of the guard's
        time), because lambda is a ranking choice of the caller and must not switch off a
        detector ingestion applies to every chunk: the tenant's injection policy is what
        decides what a flagged document costs."""
        if self.settings.guard_classifier_threshold >= 1.0:
            return None
        return verdict.guard_classifier(pipe.embedder)

    def embedded_texts(self, pipe: Pipeline) -> int:
        """How many passages the guard and MMR will embed, one a scored document (charged with
        the documents, before any work; the further chunks of long documents and the spans are
        charged by :meth:`settle`)."""
        if self.lam >= 1.0 and self.classifier(pipe) is None:
            return 0
        return min(len(self.req.documents), max(1, self.settings.rerank_max_candidates))

    def admit(self, pipe: Pipeline, tenant) -> None:
        # the documents and the passages the guard and MMR will embed, before any work on them
        # (hashing, guard, scoring, embedding); further chunks and spans are charged by settle
        self._owed_embeddings, self._settled = 0, False
        pipe.limits.charge_documents(tenant, len(self.req.documents), self.embedded_texts(pipe))

    def settle(self, pipe: Pipeline, tenant) -> None:
        """When the request ends, however (:meth:`Pipeline.run`'s finally; once): charge the
        texts embedded beyond the prepaid passages (further chunks, spans), after the fact and
        unconditionally (the bucket may go negative: :meth:`Limits.charge_spans`). None for a
        cache hit, a single-flight follower or a request that failed before its guard."""
        owed, self._owed_embeddings, self._settled = self._owed_embeddings, 0, True
        if owed > 0:
            pipe.limits.charge_spans(tenant, owed)

    def _owe(self, pipe: Pipeline, tenant, texts: int) -> None:
        """``texts`` embedded beyond the prepaid passages: counted for :meth:`settle`, or
        charged at once when the request has ended already (a late call)."""
        if texts <= 0:
            return
        if self._settled:
            pipe.limits.charge_spans(tenant, texts)
        else:
            self._owed_embeddings += texts

    def params(self, policy: str | None) -> Mapping[str, Any]:
        req, s = self.req, self.settings
        return {
            "endpoint": "rerank/v2",
            "documents_sha256": self.documents_sha256,
            "top_n": req.top_n, "max_tokens_per_doc": req.max_tokens_per_doc,
            "return_documents": req.return_documents, "lambda": self.lam,
            "recency_weight": req.recency_weight, "half_life_days": req.half_life_days,
            "authority_weight": req.authority_weight, "explain": req.explain, "injection_policy": policy,
            "rerank_max_candidates": s.rerank_max_candidates, "tiers": [s.tier_high, s.tier_medium],
            "demote_factor": s.demote_factor, "model": self.model,
            # the verdicts depend on the classifier's weights and threshold
            "guard_classifier": [load_shipped().version, s.guard_classifier_threshold],
        }

    def answer(self, served: Served, trace_id: str) -> dict[str, Any]:
        meta = {**served.body.get("meta", {}), "from_cache": served.from_cache, "trace_id": trace_id}
        if served.from_cache:
            meta["rerank_duration_ms"] = 0
        return {"id": trace_id, **served.body, "meta": meta}

    async def compute(self, pipe: Pipeline, look: Lookup) -> Outcome:
        s, req, tenant = self.settings, self.req, look.tenant
        docs = [V2Document(text=d) if isinstance(d, str) else d for d in req.documents]
        n = len(docs)
        first = first_stage(docs)
        order = sorted(range(n), key=lambda i: (-first[i], i))
        cut = order[: max(1, s.rerank_max_candidates)]
        cands = []
        for i in cut:
            md = docs[i].metadata
            cands.append(Candidate(
                id=f"{i:09d}", content=truncate_tokens(docs[i].text, req.max_tokens_per_doc), score=first[i],
                authority=float(md.authority) if md and md.authority is not None else 1.0,
                updated_at=md.updated_at if md else None))
        clf = self.classifier(pipe)
        prepaid = [self.embedded_texts(pipe)]  # passages paid with the documents, not yet embedded

        async def embed(texts: list[str]) -> np.ndarray:
            # the first passages were paid with the documents; those beyond them (the further
            # chunks of long documents) are counted once the embedder slot is held, for settle
            async with pipe.limits.embedding(tenant, len(texts), charge=False):
                paid = min(prepaid[0], len(texts))
                prepaid[0] -= paid
                self._owe(pipe, tenant, len(texts) - paid)
                return await pipe.embed(pipe.embedder.embed_passages, texts)

        async def embed_spans(texts: list[str]) -> np.ndarray:
            # counted once its embedder slot is held (a batch the guard stops waiting for still
            # runs), charged by settle when the request ends, also when it fails or is cancelled
            # after this point; a late batch that gets its slot after that is charged at once
            async with pipe.limits.embedding(tenant, len(texts), charge=False):
                self._owe(pipe, tenant, len(texts))
                return await pipe.embed(pipe.embedder.embed_passages, texts)

        with timing.stage("guard"):
            seen = await verdict.inspect_documents([c.content for c in cands], s.guard_budget_ms / 1000.0,
                                                   classifier=clf, threshold=s.guard_classifier_threshold,
                                                   embed=embed, fatal=(LimitExceeded,),
                                                   embed_timeout_s=s.guard_embed_timeout_s,
                                                   embed_spans=embed_spans,
                                                   chunk=lambda t: verdict.pieces(t, s.chunk_max_chars,
                                                                                  s.chunk_overlap))
        if seen.unclassified:
            log.warning("guard: %d of %d documents not reached by the injection classifier (embedder failed, or "
                        "KB_GUARD_EMBED_TIMEOUT_S); the answer is not cached", seen.unclassified, len(cands))
        pieces_of: dict[str, list[str]] = {}  # what the guard read of each document (MMR embeds the same)
        for c, f, vec, ok, ps in zip(cands, seen.flags, seen.embeddings, seen.classified, seen.pieces):
            c.embedding = vec
            c.classified = ok
            pieces_of[c.id] = ps
            if f is None:
                c.inspected = False
            else:
                c.injection_flag, c.injection_score, c.injection_reasons = (f.injection_flag, f.injection_score,
                                                                            f.injection_reasons)
                c.injection_strong = f.strong
                c.spam_flag = f.spam_flag
        kept, filtered = apply_policy(cands, look.policy, s.demote_factor, lambda c: {"index": int(c.id)})

        keys = [pair_cache.content_key(None, c.content) for c in kept]
        cached = None
        if s.pair_cache and kept:
            async with pipe.connection(tenant) as conn:
                async with atenant_transaction(conn, tenant):
                    cached = await pair_cache.get_live(conn, self.model, pipe.hash_query(self.normalized), keys,
                                                       generation=look.generation)
        scored = await pipe.score(tenant, SOURCE, self.normalized, [c.content for c in kept], keys=keys,
                                  cached=cached, prepaid=True)
        rel = scored.scores if scored.scores is not None else fallback_relevance([c.score for c in kept])
        for c, r in zip(kept, rel):
            c.relevance = float(r)
        mmr_used = self.lam < 1.0 and len(kept) > 1
        embs = np.eye(max(1, len(kept)), dtype=np.float32)[: len(kept)]
        if mmr_used:
            try:
                # not embedded by the guard (classifier off, embedder failed, or the cap): the
                # same pieces as the guard's, pooled the same way
                todo = [c for c in kept if c.embedding is None]
                if todo:
                    parts = [pieces_of[c.id] for c in todo]
                    got = np.asarray(await embed([t for ps in parts for t in ps]), dtype=np.float32)
                    at = 0
                    for c, ps in zip(todo, parts):
                        c.embedding = verdict.pool(list(got[at:at + len(ps)]), [len(t) for t in ps])
                        at += len(ps)
                embs = np.stack([c.embedding for c in kept]).astype(np.float32)
            except LimitExceeded:
                raise  # the tenant's own embedder cap: 429, not a result without diversity
            except Exception as exc:  # noqa: BLE001 - diversity is best effort
                log.warning("embedding documents for MMR failed: %s", type(exc).__name__)
                embs, mmr_used = np.eye(len(kept), dtype=np.float32), False
        top_n = req.top_n or len(kept)
        ranked = diversify.composite(kept, embs, lam=self.lam if mmr_used else 1.0, k=len(kept),
                                     recency_weight=req.recency_weight, half_life_days=req.half_life_days,
                                     authority_weight=req.authority_weight)
        results = []
        for pos, r in enumerate(ranked[:top_n]):
            c = kept[r.index]
            i = int(c.id)
            item: dict[str, Any] = {"index": i, "relevance_score": rounded(c.relevance), "final_score": r.final_score,
                                    "tier": diversify.tier(r.final_score, tiers(s)),
                                    "mmr": {"penalty": r.mmr_penalty, "max_sim": r.max_sim}}
            if docs[i].id is not None:
                item["id"] = docs[i].id
            if req.return_documents:
                item["document"] = {"text": docs[i].text}
            if req.explain:
                item["stages"] = {"first_stage": {"score": rounded(first[i]), "rank": order.index(i) + 1},
                                  "rerank": {"score": rounded(c.relevance)},
                                  "final": {"score": r.final_score, "rank": pos + 1},
                                  "demote": rounded(c.demote)}
            results.append(item)
        meta = {
            "api_version": {"version": "2"}, "billed_units": {"search_units": 1},
            "model": self.model, "requested_model": req.model,
            "documents": n, "scored": len(kept), "cut_off": n - len(cut),
            "lambda": self.lam, "mmr": mmr_used, "injection_policy": look.policy, "filtered": filtered,
            # scored documents the injection classifier could not reach (judged by the patterns
            # alone, or without their spans): the answer is then not cached
            "unclassified": seen.unclassified,
            "fallback": scored.reason is not None, "fallback_reason": scored.reason,
            "rerank_duration_ms": scored.ms,
        }
        # an answer with documents the guard could not inspect or classify (load of the moment,
        # or a failed embedder: not a property of the request) is served but not cached
        return Outcome({"results": results, "meta": meta}, n, len(results), self.model,
                       fallback_reason=scored.reason, rerank_ms=scored.ms, new_pairs=scored.new_pairs,
                       cacheable=all(c.inspected and c.classified for c in cands))
