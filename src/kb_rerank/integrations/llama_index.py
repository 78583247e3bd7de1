"""LlamaIndex integration (``pip install 'kb-rerank[llamaindex]'``).

- :class:`KbRerankRetriever`: a ``BaseRetriever`` (``retrieve`` / ``aretrieve``) over
  ``POST /v1/kb/context`` (default: the tenant's injection policy, the whole passage) or
  ``POST /v1/kb/search/rerank`` (``endpoint="search"``: no guard policy, the first 300
  characters of each passage), returning ``NodeWithScore``: a ``TextNode`` per passage (id =
  the chunk id; metadata: ids, title, scores as the API gave them, tier, source path, trace
  id, model, fallback) whose score is
  the model's relevance, or None on a fallback answer (the fused order is not a relevance).
- :class:`KbRerankPostprocessor`: a ``BaseNodePostprocessor`` over ``POST /v2/rerank`` that
  reranks the nodes a pipeline brings; a 503 (no model can score) raises
  :class:`~kb_rerank.integrations._client.KbRerankUnavailable`.

The tenant is the token's: give ``token`` or a ``token_provider`` called before each request.
Only the passage's title and source path reach the language model with its text; the other
metadata is kept from the LLM and embedding views (``excluded_*_metadata_keys``).
"""

from __future__ import annotations

from typing import Any, Callable, List, Literal, Mapping, Optional

from kb_rerank.core.extras import require

require("llama_index.core", "llamaindex", "kb_rerank.integrations.llama_index")

from llama_index.core.base.base_retriever import BaseRetriever  # noqa: E402
from llama_index.core.bridge.pydantic import Field, PrivateAttr, SecretStr  # noqa: E402
from llama_index.core.callbacks import CallbackManager  # noqa: E402
from llama_index.core.postprocessor.types import BaseNodePostprocessor  # noqa: E402
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode  # noqa: E402

from kb_rerank.integrations import _client as api  # noqa: E402
from kb_rerank.integrations._client import KbRerankClient, KbRerankError, KbRerankUnavailable  # noqa: E402,F401

__all__ = ["KbRerankRetriever", "KbRerankPostprocessor", "KbRerankError", "KbRerankUnavailable"]

_SHOWN = ("title", "source_path")  # the metadata a language model sees with the passage


def _hidden(metadata: Mapping[str, Any]) -> list[str]:
    return [k for k in metadata if k not in _SHOWN]


def _node(hit: api.Hit) -> NodeWithScore:
    hidden = _hidden(hit.metadata)
    node = TextNode(text=hit.text, id_=hit.id or None, metadata=hit.metadata,
                    excluded_llm_metadata_keys=hidden, excluded_embed_metadata_keys=hidden)
    return NodeWithScore(node=node, score=hit.score)


class KbRerankRetriever(BaseRetriever):
    """Passages of the tenant's knowledge base ranked by kb-rerank. ``top_n``, ``filter`` and
    (``endpoint="search"`` only) ``source`` are sent as the API defines them, only when set."""

    def __init__(self, base_url: str | None = None, token: str | None = None, *,
                 token_provider: Callable[[], str] | None = None, endpoint: Literal["search", "context"] = "context",
                 source: str | None = None, top_n: int | None = None, filter: Mapping[str, Any] | None = None,
                 timeout: float = api.DEFAULT_TIMEOUT_S, client: KbRerankClient | None = None,
                 callback_manager: CallbackManager | None = None, verbose: bool = False) -> None:
        api.check_endpoint(endpoint, source)
        self.kb = api.make_client(client, base_url, token, token_provider, timeout)
        self.options = {"endpoint": endpoint, "source": source, "top_n": top_n,
                        "filter": dict(filter) if filter is not None else None}
        super().__init__(callback_manager=callback_manager, verbose=verbose)

    def _retrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return [_node(h) for h in api.retrieve(self.kb, query_bundle.query_str, **self.options)]

    async def _aretrieve(self, query_bundle: QueryBundle) -> List[NodeWithScore]:
        return [_node(h) for h in await api.aretrieve(self.kb, query_bundle.query_str, **self.options)]


class KbRerankPostprocessor(BaseNodePostprocessor):
    """Rerank a pipeline's nodes with ``POST /v2/rerank`` (the service's cross-encoder,
    injection guard, MMR and tiers). Each returned node is a copy of the one given with the
    service's ``relevance_score``, ``final_score``, ``tier``, ``scored_by``, ``index``,
    ``trace_id``, ``model`` and ``fallback`` added to its metadata, scored with
    ``relevance_score`` (None on a fallback); nodes the guard excluded are not returned."""

    base_url: Optional[str] = None
    token: Optional[SecretStr] = None
    token_provider: Optional[Callable[[], str]] = Field(default=None, exclude=True)
    timeout: float = api.DEFAULT_TIMEOUT_S
    top_n: Optional[int] = None
    client: Optional[KbRerankClient] = Field(default=None, exclude=True)
    _kb: Optional[KbRerankClient] = PrivateAttr(default=None)

    @classmethod
    def class_name(cls) -> str:
        return "KbRerankPostprocessor"

    @property
    def kb(self) -> KbRerankClient:
        if self._kb is None:
            self._kb = api.make_client(self.client, self.base_url, self.token, self.token_provider, self.timeout)
        return self._kb

    @staticmethod
    def _inputs(nodes: List[NodeWithScore], query_bundle: Optional[QueryBundle]) -> tuple[str, list[str]]:
        if query_bundle is None:
            raise ValueError("kb-rerank: KbRerankPostprocessor needs the query (query_bundle or query_str)")
        return query_bundle.query_str, [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]

    @staticmethod
    def _ranked(nodes: List[NodeWithScore], ranked) -> List[NodeWithScore]:
        out = []
        for i, hit in ranked:
            node = nodes[i].node
            metadata = {**node.metadata, **hit.metadata}
            copy = node.model_copy(update={
                "metadata": metadata,
                "excluded_llm_metadata_keys": sorted({*node.excluded_llm_metadata_keys, *hit.metadata}),
                "excluded_embed_metadata_keys": sorted({*node.excluded_embed_metadata_keys, *hit.metadata}),
            })
            out.append(NodeWithScore(node=copy, score=hit.score))
        return out

    def _postprocess_nodes(self, nodes: List[NodeWithScore],
                           query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        query, texts = self._inputs(nodes, query_bundle)
        return self._ranked(nodes, api.rerank_texts(self.kb, query, texts, top_n=self.top_n))

    async def _apostprocess_nodes(self, nodes: List[NodeWithScore],
                                  query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
        query, texts = self._inputs(nodes, query_bundle)
        return self._ranked(nodes, await api.arerank_texts(self.kb, query, texts, top_n=self.top_n))
