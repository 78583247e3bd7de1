"""The wire types the OpenAPI document is generated from, shared by the three JSON routes
(``POST /v1/kb/search/rerank``, ``/v1/kb/context``, ``/v2/rerank``): the one error body, the
error responses every route documents, the bearer security scheme, and the request-body
documentation. The response Structs are :mod:`kb_rerank.endpoints.responses`' (each flow
builds its own; no web framework there). Only Litestar's OpenAPI types are used here:
nothing in this module changes how a request is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from litestar.openapi.datastructures import ResponseSpec
from litestar.openapi.spec import Components, OpenAPIMediaType, Operation, RequestBody, SecurityScheme

# the response types the routes document (one definition each, built by the flows)
from kb_rerank.endpoints.responses import ContextResponse, RerankResponse, V2Response  # noqa: F401

# the query field of every request body, as the OpenAPI document describes it
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
            # the schema as a plain dict: the OpenAPI document's serializer passes dicts through
            self.request_body = RequestBody(required=True, content={
                "application/json": OpenAPIMediaType(schema=schema)})  # type: ignore[arg-type]

    BodyOperation.__name__ = BodyOperation.__qualname__ = f"{typ.__name__}Operation"
    return BodyOperation


# --------------------------------------------------------------------------- shared pieces


# --------------------------------------------------------------------------- GET /v1/kb/documents


class DocumentItem(msgspec.Struct, forbid_unknown_fields=True):
    doc_id: str
    title: str
    source_path: str  # the document's source path (kb.documents.source_uri), unique in the tenant
    language: str | None
    updated_at: str  # the document's own date (front matter updated_at or date, else ingested_at): ISO 8601 with offset
    ingested_at: str  # when ingestion last wrote the document: ISO 8601 with its UTC offset


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
