"""``POST /v1/kb/context``: ranked, guarded context for a language model
(:mod:`kb_rerank.endpoints.context.flow`)."""

from __future__ import annotations

from litestar import Request, Response, post
from litestar.datastructures import State

from kb_rerank.endpoints import parse
from kb_rerank.endpoints.schemas import ERROR_RESPONSES, QUERY_DOC, ContextResponse, body_operation
from kb_rerank.endpoints.serve import serve
from kb_rerank.endpoints.context.flow import ContextFlow
from kb_rerank.endpoints.requests import ContextRequest

PATH = "/v1/kb/context"


@post(PATH, status_code=200, operation_class=body_operation(ContextRequest, QUERY_DOC), responses=ERROR_RESPONSES,
      summary="Ranked, guarded context for a language model",
      description="Hybrid retrieval, relevance gate, injection policy, cross-encoder, MMR, tiers, "
                  "and a fenced <context> block with a system prompt template.")
async def context_handler(request: Request, state: State) -> Response[ContextResponse]:
    return await serve(request, state, parse.context_request,
                       lambda req, st: st.pipeline.flow(ContextFlow, req), ContextResponse)
