"""``POST /v2/rerank``: the caller's documents reranked, Cohere v2 shape
(:mod:`kb_rerank.endpoints.v2_rerank.flow`)."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.datastructures import State

from kb_rerank.endpoints import parse
from kb_rerank.endpoints.schemas import ERROR_RESPONSES, QUERY_DOC, V2Response, body_operation
from kb_rerank.endpoints.serve import serve
from kb_rerank.endpoints.v2_rerank.flow import CallerDocumentsFlow
from kb_rerank.endpoints.requests import V2Request

PATH = "/v2/rerank"


@post(PATH, status_code=200, operation_class=body_operation(V2Request, QUERY_DOC), responses=ERROR_RESPONSES,
      summary="Rerank caller-supplied documents (Cohere v2 shape)",
      description="Cross-encoder scores, MMR diversity, tiers; no database search.")
async def v2_rerank_handler(request: Request, state: State) -> Response[V2Response]:
    return await serve(request, state, parse.v2_request,
                       lambda req, st: st.pipeline.flow(CallerDocumentsFlow, req), V2Response)
