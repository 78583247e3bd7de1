"""The response types of the context-ranking routes (``POST /v1/kb/search/rerank``,
``/v1/kb/context``, ``/v2/rerank``): one msgspec Struct per shape, built by each flow,
encoded into its cache row and returned by its route. No web framework here: a flow runs
without Litestar; :mod:`kb_rerank.endpoints.schemas` documents them."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import UNSET, UnsetType

# The rerank budget's fields (KB_RERANK_BUDGET_MS), with the descriptions the OpenAPI document shows
ScoredBy = Annotated[str, msgspec.Meta(description=(
    "What ranked this result: `model` (the cross-encoder: the score is its relevance), `fused` (the first"
    " stage, not a relevance: on a fallback or for a candidate the rerank budget did not reach; no relevance"
    " and no tier are reported, the result follows every model-scored one in first-stage order), `curation`"
    " (a curated list's rank)"))]
RankedBy = Annotated[str, msgspec.Meta(description=(
    "What ranked the answer: `model` (the model named by `model` scored at least one result), `fused` (a"
    " fallback: no model could score, `model` is null and the X-KB-Fallback header names the reason),"
    " `curation`, or `none` (no result: nothing was ranked, `model` is null)"))]
AnswerModel = Annotated[str | None, msgspec.Meta(description=(
    "The cross-encoder that scored at least one of the answer's results; null when none did (a fallback, an"
    " answer without results)"))]
FinalScore = Annotated[float | None, msgspec.Meta(description=(
    "The composite the results are ordered by (relevance, MMR, boosts); null for a result the model did not"
    " score (no relevance to compose: its place in the list is its rank)"))]
Tier = Annotated[str | None, msgspec.Meta(description=(
    "high | medium | low, from final_score, for a result the model scored; null for one it did not"))]
RerankedCount = Annotated[int, msgspec.Meta(description=(
    "Candidates ranked by a model score (the pair cache's or this request's); fewer than `candidate_count`"
    " when the rerank budget ended first, 0 on a fallback or a cache hit"))]
PartialReason = Annotated[str | None, msgspec.Meta(description=(
    "`budget` when KB_RERANK_BUDGET_MS ended before the model reached every candidate: a partial answer"
    " (`fallback` stays false), not cached; asking again ranks further. null otherwise"))]


class Mmr(msgspec.Struct, forbid_unknown_fields=True):
    penalty: float | None
    max_sim: float | None


class ScoreRank(msgspec.Struct, forbid_unknown_fields=True):
    score: float | None
    rank: int | None


# --------------------------------------------------------------------------- POST /v1/kb/context


class ContextScores(msgspec.Struct, forbid_unknown_fields=True):
    lexical: float | None
    semantic: float | None
    fused: float | None
    rerank: float | None
    final: float | None  # null when the model did not score it (scored_by: fused)


class ContextRanks(msgspec.Struct, forbid_unknown_fields=True):
    lexical: int | None
    semantic: int | None
    fused: int
    rerank: int | None
    final: int


class Boosts(msgspec.Struct, forbid_unknown_fields=True):
    recency: float | None
    authority: float | None


class ChunkFlags(msgspec.Struct, forbid_unknown_fields=True):
    injection: bool
    spam: bool
    demoted: bool


class ContextResult(msgspec.Struct, forbid_unknown_fields=True):
    rank: int
    chunk_id: str
    doc_id: str
    doc_title: str
    source_path: str
    snippet: str  # the passage's first 300 characters
    text: Annotated[str, msgspec.Meta(description=(
        "The whole passage as the `context` block holds it (chat-role tokens and context tags defused):"
        " what a client that builds its own prompt puts in it"))]
    final_score: FinalScore
    tier: Tier
    rerank_score: float | None  # null when the model did not score it (scored_by: fused)
    scores: ContextScores
    ranks: ContextRanks
    mmr: Mmr
    boosts: Boosts
    flags: ChunkFlags
    citation: int  # the [n] of this passage in ``context``
    scored_by: ScoredBy = "model"


class FilteredChunk(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    chunk_id: str
    reason: str  # prompt_injection | keyword_stuffing
    score: float | None | UnsetType = UNSET  # prompt_injection only
    signals: list[str] | UnsetType = UNSET  # prompt_injection only
    action: str  # excluded | demoted | allowed
    # prompt_injection only: strong (excluded under the default policy "exclude") | doubtful
    # (demoted under it); a chunk a person blocked counts as strong
    evidence: str | UnsetType = UNSET
    # prompt_injection of a reviewed chunk: allowed | blocked (kb-rerank guard allow / block)
    review: str | UnsetType = UNSET


class Gate(msgspec.Struct, forbid_unknown_fields=True):
    closed: bool
    best_similarity: float | None
    lexical_hits: int
    threshold: float


class ContextStage(msgspec.Struct, forbid_unknown_fields=True):
    chunk_id: str
    lexical: ScoreRank
    semantic: ScoreRank
    fused: ScoreRank
    rerank: ScoreRank
    mmr: Mmr
    final: ScoreRank
    selected: bool
    cut_off: bool
    demote: float | None | UnsetType = UNSET  # candidates that were kept
    excluded: str | UnsetType = UNSET  # candidates the injection policy excluded: the reason


class ContextResponse(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, rename={"lam": "lambda"}):
    answerable: bool
    results: list[ContextResult]
    filtered: list[FilteredChunk]
    gate: Gate
    context: str  # the fenced, numbered <context> block
    system_prompt: str
    model: AnswerModel
    ranked_by: RankedBy = "model"  # "model" in answers cached before the field existed
    fallback: bool
    fallback_reason: str | None
    candidate_count: int
    reranked_count: RerankedCount
    partial_reason: PartialReason = None
    rerank_duration_ms: int
    lam: float
    injection_policy: str
    stages: list[ContextStage] | UnsetType = UNSET  # only with "explain": true
    from_cache: bool
    trace_id: str


# --------------------------------------------------------------------------- POST /v2/rerank


class V2ResultDocument(msgspec.Struct, forbid_unknown_fields=True):
    text: str


class V2RerankStage(msgspec.Struct, forbid_unknown_fields=True):
    score: float | None


class V2Stages(msgspec.Struct, forbid_unknown_fields=True):
    first_stage: ScoreRank
    rerank: V2RerankStage
    final: ScoreRank
    demote: float | None


class V2Result(msgspec.Struct, forbid_unknown_fields=True):
    index: int  # position of the document in the request
    relevance_score: float | None  # the cross-encoder's score (0..1); null when it did not score the document
    final_score: FinalScore
    tier: Tier
    mmr: Mmr
    id: str | UnsetType = UNSET  # the document's id, when it had one
    document: V2ResultDocument | UnsetType = UNSET  # with "return_documents": true
    stages: V2Stages | UnsetType = UNSET  # with "explain": true
    scored_by: ScoredBy = "model"


class V2Filtered(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    index: int
    # prompt_injection | keyword_stuffing | not_inspected (no verdict in time) | not_classified
    # (the learned classifier had no vote on it: demoted, allowed under "allow")
    reason: str
    score: float | None | UnsetType = UNSET  # prompt_injection only
    signals: list[str] | UnsetType = UNSET  # prompt_injection only
    action: str  # excluded | demoted | allowed | reported (in Cohere's order: noted, not applied)
    # prompt_injection only: strong (excluded under the default policy "exclude") | doubtful (demoted under it)
    evidence: str | UnsetType = UNSET
    review: str | UnsetType = UNSET  # not set for caller documents (reviews apply to knowledge-base chunks)


class V2ApiVersion(msgspec.Struct, forbid_unknown_fields=True):
    version: str


class V2BilledUnits(msgspec.Struct, forbid_unknown_fields=True):
    search_units: int


class V2Meta(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, rename={"lam": "lambda"}):
    api_version: V2ApiVersion
    billed_units: V2BilledUnits
    model: AnswerModel
    ranked_by: RankedBy = "model"  # "model" in answers cached before the field existed
    requested_model: str | None
    documents: int
    scored: int
    cut_off: int
    lam: float
    mmr: bool
    injection_policy: str
    guard: str = "apply"  # the request's guard: apply | report
    # what orders the results: relevance_score (Cohere's contract, the default) | final_score
    # (the request asked for diversity, lambda < 1, or a boost)
    order: str = "final_score"
    filtered: list[V2Filtered]
    # scored documents the injection classifier could not reach (embedder failed, or
    # KB_GUARD_EMBED_TIMEOUT_S): judged by the patterns alone or without their spans; such an
    # answer is not cached (0 in answers cached before the field existed). Where the handler's
    # dict has it (kw_only lets a defaulted field stand before required ones)
    unclassified: int = 0
    fallback: bool
    fallback_reason: str | None
    reranked: RerankedCount | UnsetType = UNSET  # absent in answers cached before it
    partial_reason: PartialReason = None
    rerank_duration_ms: int
    # a degraded answer (fallback or partial) only, as Cohere's meta.warnings: one sentence saying so
    warnings: list[str] | UnsetType = UNSET
    from_cache: bool
    trace_id: str


class V2Response(msgspec.Struct, forbid_unknown_fields=True):
    id: str  # the request's trace id
    results: list[V2Result]
    meta: V2Meta


class RerankResult(msgspec.Struct):
    chunk_id: str
    doc_id: str
    doc_title: str
    snippet: str
    rerank_score: float | None  # the model's relevance (0..1); null when it did not score the result
    source: str
    scored_by: ScoredBy = "model"
    # a result the model did not score (scored_by: fused) only: its first-stage fused score, as it is
    fused_score: float | None | UnsetType = UNSET


class RerankResponse(msgspec.Struct):
    results: list[RerankResult]
    from_cache: bool
    rerank_duration_ms: int
    trace_id: str
    model: AnswerModel
    fallback: bool
    fallback_reason: str | None
    candidate_count: int
    reranked_count: RerankedCount = 0
    partial_reason: PartialReason = None
    ranked_by: RankedBy = "model"
