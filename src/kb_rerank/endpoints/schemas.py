"""The wire types the OpenAPI document is generated from, shared by the three JSON routes
(``POST /v1/kb/search/rerank``, ``/v1/kb/context``, ``/v2/rerank``): the response Structs of
the two context-ranking routes, the one error body, the error responses every route
documents, the bearer security scheme, and the request-body documentation.

Each flow builds its answer as its response Struct (one definition per shape); the result
cache stores the Struct as msgspec builtins and decodes a row back into it. Optional keys
absent from an answer (not ``null``) are ``UNSET``. Only Litestar's OpenAPI types are used here: nothing in
this module changes how a request is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Components, OpenAPIMediaType, Operation, RequestBody, SecurityScheme
from msgspec import UNSET, UnsetType

# the query field of every request body, as the OpenAPI document describes it
# The rerank budget's fields (KB_RERANK_BUDGET_MS), with the descriptions the OpenAPI document shows
ScoredBy = Annotated[str, msgspec.Meta(description=(
    "What ranked this result: `model` (the cross-encoder: the score is its relevance), `fused` (the first"
    " stage, not a relevance: on a fallback or for a candidate the rerank budget did not reach; no relevance"
    " and no tier are reported, the result follows every model-scored one in first-stage order), `curation`"
    " (a curated list's rank)"))]
RankedBy = Annotated[str, msgspec.Meta(description=(
    "What ranked the answer: `model`, `fused` (a fallback: no model could score, `model` is null and the"
    " X-KB-Fallback header names the reason) or `curation`"))]
AnswerModel = Annotated[str | None, msgspec.Meta(description=(
    "The cross-encoder that ranked the answer; null on a fallback (no model scored it)"))]
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

QUERY_DOC = {"query": {"minLength": 1, "description": "search text; NFC, trimmed, whitespace collapsed"}}

# --------------------------------------------------------------------------- errors


class ErrorBody(msgspec.Struct, forbid_unknown_fields=True):
    """Every error answer of the JSON routes: ``error`` always; the rest as the error has it."""

    # invalid_json | invalid_request | unauthorized | not_found | method_not_allowed | payload_too_large |
    # unsupported_media_type | rate_limited | tenant_busy | database_unavailable | identity_keys_unavailable |
    # model_unavailable (and the snake_case name of any other HTTP status)
    error: str
    field: str | None = None  # the offending value's path (documents[3].text, top_n, ...); null when none can be named
    detail: str | None = None
    allowed: list[str] | None = None  # 422 on an unknown source: the accepted values
    reason: str | None = None  # 401: why the token was refused; 503 model_unavailable: the fallback reason
    retry_after_s: int | None = None  # 429, 503 model_unavailable: also in Retry-After
    scope: str | None = None  # 429 rate_limited: which bucket (tenant, address, ...)
    cost: float | None = None  # 429 rate_limited: tokens the request needed
    resource: str | None = None  # 429 tenant_busy: the resource whose slots are all taken


def _err(description: str) -> ResponseSpec:
    return ResponseSpec(data_container=ErrorBody, description=description, generate_examples=False)


# The errors every JSON route can answer (kb_rerank.http.body, the auth guard of
# kb_rerank.http.auth, the handlers in kb_rerank.endpoints, kb_rerank.core.limits);
# passed as ``responses=`` to each route decorator.
ERROR_RESPONSES: dict[int, ResponseSpec] = {
    400: _err("invalid_json: not JSON, invalid UTF-8 or nested too deeply (field is null)"),
    401: _err("unauthorized: missing, invalid or expired bearer token, or another scheme than Bearer"
              " (reason); WWW-Authenticate is set"),
    413: _err("payload_too_large: the body is over the route's limit (refused while it is read)"),
    415: _err("unsupported_media_type: a Content-Type other than application/json (none is accepted as JSON)"),
    422: _err("invalid_request: valid JSON of the wrong shape; field names the offending value"),
    429: _err("rate_limited or tenant_busy: per-tenant / per-address limits; Retry-After is set"),
    503: _err("database_unavailable: no database connection in time; identity_keys_unavailable: the"
              " KB_JWT_JWKS_URL keys could not be fetched; model_unavailable (/v2/rerank, KB_V2_FALLBACK=error):"
              " no cross-encoder could score, reason names why; Retry-After is set"),
}

# --------------------------------------------------------------------------- security

BEARER = "bearerAuth"
# The security scheme (OpenAPIConfig components) and the requirement of the guarded routes.
SECURITY_COMPONENTS = Components(security_schemes={
    BEARER: SecurityScheme(type="http", scheme="bearer", bearer_format="JWT",
                           description="A JWT whose tenant claim selects the tenant (HS256, RS256, ES256 or EdDSA;"
                                       " a static key or the identity provider's JWKS)."),
})
SECURITY: list[dict[str, list[str]]] = [{BEARER: []}]

# --------------------------------------------------------------------------- request bodies


def json_schema(typ: type, extra: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON Schema msgspec generates for ``typ`` -- the library that decodes the body
    (kb_rerank.http.body), so the document says what the decoder accepts -- with its ``$defs``
    inlined (a ``#/$defs`` reference would resolve against the OpenAPI document, not this
    schema). Inline, not a component: Litestar fills ``components/schemas`` only with the
    types it documents itself (the responses) and drops any other. ``extra``: keys merged
    into the named top-level properties (descriptions, ordering of an enum)."""
    schema = msgspec.json.schema(typ)
    defs = schema.pop("$defs", {})

    def inline(x: Any) -> Any:
        if isinstance(x, dict):
            if "$ref" in x:
                return inline(defs[x["$ref"].rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in x.items()}
        if isinstance(x, list):
            return [inline(v) for v in x]
        return x

    out = inline(schema)
    for name, more in (extra or {}).items():
        out["properties"][name] = {**out["properties"][name], **more}
    return out


def body_operation(typ: type, extra: dict[str, dict[str, Any]] | None = None) -> type[Operation]:
    """An ``operation_class`` for a route decorator that documents ``typ`` as its required
    JSON request body. The handler keeps reading the raw body itself (kb_rerank.http.body): a
    ``data: typ`` parameter would make Litestar parse and validate it, with other status
    codes and error bodies."""
    schema = json_schema(typ, extra)

    @dataclass
    class BodyOperation(Operation):
        def __post_init__(self) -> None:
            # the schema as a plain dict: the spec's serializer passes dicts through
            self.request_body = RequestBody(required=True, content={
                "application/json": OpenAPIMediaType(schema=schema)})  # type: ignore[arg-type]

    BodyOperation.__name__ = BodyOperation.__qualname__ = f"{typ.__name__}Operation"
    return BodyOperation


# --------------------------------------------------------------------------- shared pieces


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
    action: str  # excluded | demoted | allowed
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


# --------------------------------------------------------------------------- GET /v1/kb/documents


class DocumentItem(msgspec.Struct, forbid_unknown_fields=True):
    doc_id: str
    title: str
    source_path: str  # the document's source path (kb.documents.source_uri), unique in the tenant
    language: str | None
    updated_at: str  # ISO 8601, with its UTC offset


class DocumentsResponse(msgspec.Struct, forbid_unknown_fields=True):
    """A page of the tenant's documents, in source-path order."""

    documents: list[DocumentItem]
    next_cursor: Annotated[str | None, msgspec.Meta(description=(
        "Pass as `cursor` for the next page; null on the last page"))]
    trace_id: str


def query_operation(parameters: list[dict[str, Any]]) -> type[Operation]:
    """An ``operation_class`` documenting query ``parameters`` (OpenAPI parameter objects as
    dicts) that the handler reads and validates itself (422 ``invalid_request`` naming the
    parameter, as the body routes answer; Litestar's own validation answers 400)."""
    from litestar.openapi.spec import Parameter, Schema

    params = [Parameter(name=p["name"], param_in="query", required=False, description=p.get("description"),
                        schema=Schema(**p["schema"])) for p in parameters]

    @dataclass
    class QueryOperation(Operation):
        def __post_init__(self) -> None:
            self.parameters = [*params, *(self.parameters or [])]  # type: ignore[list-item]

    return QueryOperation
