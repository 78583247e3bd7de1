"""LangChain integration (``pip install 'kb-rerank[langchain]'``).

- :class:`KbRerankRetriever`: a ``BaseRetriever`` (sync and async) over ``POST /v1/kb/context``
  (default: the route for prompts, with the tenant's injection policy, tiers, citations and
  the whole passage) or ``POST /v1/kb/search/rerank`` (``endpoint="search"``: a ``source`` of
  its own, no guard policy, the first 300 characters of each passage); each result is a
  ``Document`` whose ``page_content`` is the passage and whose ``metadata`` holds the chunk and
  document ids, title, scores as the API gave them, tier, source path, trace id, model and
  fallback (:mod:`kb_rerank.integrations._client`).
- :class:`KbRerankCompressor`: a ``BaseDocumentCompressor`` over ``POST /v2/rerank`` for chains
  that bring their own candidates (e.g. in a ``ContextualCompressionRetriever``): the documents
  come back in the service's order with its scores added to their metadata; a 503 (no model can
  score) raises :class:`~kb_rerank.integrations._client.KbRerankUnavailable`.

The tenant is the token's (a JWT whose tenant claim the server verifies): give ``token`` or a
``token_provider`` called before each request.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Sequence

from kb_rerank.core.extras import require

require("langchain_core", "langchain", "kb_rerank.integrations.langchain")

from langchain_core.callbacks import (  # noqa: E402
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
    Callbacks,
)
from langchain_core.documents import BaseDocumentCompressor, Document  # noqa: E402
from langchain_core.retrievers import BaseRetriever  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator  # noqa: E402

from kb_rerank.integrations import _client as api  # noqa: E402
from kb_rerank.integrations._client import KbRerankClient, KbRerankError, KbRerankUnavailable  # noqa: E402,F401

__all__ = ["KbRerankRetriever", "KbRerankCompressor", "KbRerankError", "KbRerankUnavailable"]


class _Connection(BaseModel):
    """Fields and client shared by the retriever and the compressor."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    base_url: str | None = None
    token: SecretStr | None = None
    token_provider: Callable[[], str] | None = Field(default=None, exclude=True)
    timeout: float = api.DEFAULT_TIMEOUT_S
    client: KbRerankClient | None = Field(default=None, exclude=True)
    _kb: KbRerankClient | None = PrivateAttr(default=None)

    @property
    def kb(self) -> KbRerankClient:
        if self._kb is None:
            self._kb = api.make_client(self.client, self.base_url, self.token, self.token_provider, self.timeout)
        return self._kb


def _document(hit: api.Hit) -> Document:
    return Document(page_content=hit.text, metadata=hit.metadata, id=hit.id)


class KbRerankRetriever(_Connection, BaseRetriever):
    """Documents of the tenant's knowledge base ranked by kb-rerank.

    ``top_n``, ``filter`` and (``endpoint="search"`` only) ``source`` (``hybrid_lexical_semantic``,
    ``lexical_only``, ...) are sent as the API defines them, and only when set.
    """

    endpoint: Literal["search", "context"] = "context"
    source: str | None = None
    top_n: int | None = None
    filter: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _fits(self) -> "KbRerankRetriever":
        api.check_endpoint(self.endpoint, self.source)
        return self

    def _options(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "source": self.source, "top_n": self.top_n, "filter": self.filter}

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [_document(h) for h in api.retrieve(self.kb, query, **self._options())]

    async def _aget_relevant_documents(self, query: str, *,
                                       run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        return [_document(h) for h in await api.aretrieve(self.kb, query, **self._options())]


class KbRerankCompressor(_Connection, BaseDocumentCompressor):
    """Rerank the chain's own documents with ``POST /v2/rerank`` (the tenant's token; the
    service's cross-encoder, injection guard, MMR and tiers). Each returned document keeps its
    content and metadata and gains the service's ``relevance_score`` (null on a fallback),
    ``final_score``, ``tier``, ``scored_by``, ``index``, ``trace_id``, ``model`` and
    ``fallback``; documents the service's guard excluded are not returned."""

    top_n: int | None = None

    @staticmethod
    def _ranked(documents: Sequence[Document], ranked) -> list[Document]:
        out = []
        for i, hit in ranked:
            doc = documents[i]
            out.append(Document(page_content=doc.page_content, metadata={**doc.metadata, **hit.metadata}, id=doc.id))
        return out

    def compress_documents(self, documents: Sequence[Document], query: str,
                           callbacks: Callbacks | None = None) -> Sequence[Document]:
        texts = [d.page_content for d in documents]
        return self._ranked(documents, api.rerank_texts(self.kb, query, texts, top_n=self.top_n))

    async def acompress_documents(self, documents: Sequence[Document], query: str,
                                  callbacks: Callbacks | None = None) -> Sequence[Document]:
        texts = [d.page_content for d in documents]
        return self._ranked(documents, await api.arerank_texts(self.kb, query, texts, top_n=self.top_n))
