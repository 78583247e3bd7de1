"""``POST /v1/kb/search/rerank``: hybrid / lexical / semantic / curated retrieval, cross-encoder,
cache and audit (:mod:`kb_rerank.endpoints.search.flow`)."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.datastructures import State

from kb_rerank.endpoints import parse
from kb_rerank.endpoints.schemas import ERROR_RESPONSES, QUERY_DOC, RerankResponse, body_operation
from kb_rerank.endpoints.serve import serve
from kb_rerank.endpoints.search.flow import SearchFlow
from kb_rerank.endpoints.requests import RerankRequest
from kb_rerank.core.settings import SOURCES

PATH = "/v1/kb/search/rerank"

# Documents the JSON body (decoded by kb_rerank.endpoints.parse, to control the errors): the schema
# msgspec derives from RerankRequest, with the sources in their documented order.
_OPERATION = body_operation(RerankRequest, {**QUERY_DOC, "source": {"enum": list(SOURCES)}})


@post(PATH, status_code=200, operation_class=_OPERATION, responses=ERROR_RESPONSES,
      summary="Rerank search results",
      description="Hybrid/lexical/semantic retrieval, cross-encoder rerank, per-tenant cache and audit.")
async def rerank_handler(request: Request, state: State) -> Response[RerankResponse]:
    return await serve(request, state, parse.rerank_request, lambda req, st: st.pipeline.flow(SearchFlow, req),
                       RerankResponse)
