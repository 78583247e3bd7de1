"""The API's metadata filter and `top_n` through each integration -- the LangChain retriever, the
LlamaIndex retriever and the MCP tool (the SDK's in-memory client over the real server object) --
against one real `kb-rerank serve` process with two tenants (tests/integrations/integrations_live.py): one
test, run against all three. A filter narrows tenant A's passages and never reaches tenant B's,
whatever it names; a bad one is the API's 422 naming the field."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

import pytest
from mcp import Client

from kb_rerank.integrations._client import KbRerankClient, KbRerankError
from kb_rerank.integrations.langchain import KbRerankRetriever as LangChainRetriever
from kb_rerank.integrations.llama_index import KbRerankRetriever as LlamaRetriever
from kb_rerank.integrations.mcp import TOOL, build_server

from tests.integrations.integrations_live import WORD_A, WORD_B, live  # noqa: F401 - live: a module fixture


@dataclass(frozen=True)
class Passage:
    doc_id: str
    title: str
    text: str


def _langchain(base: str, token: str, query: str, **opts: Any) -> list[Passage]:
    docs = LangChainRetriever(base_url=base, token=token, **opts).invoke(query)
    return [Passage(d.metadata["doc_id"], d.metadata["title"], d.page_content) for d in docs]


def _llama_index(base: str, token: str, query: str, **opts: Any) -> list[Passage]:
    nodes = asyncio.run(LlamaRetriever(base, token, **opts).aretrieve(query))
    return [Passage(n.node.metadata["doc_id"], n.node.metadata["title"], n.node.get_content()) for n in nodes]


def _mcp(base: str, token: str, query: str, **opts: Any) -> list[Passage]:
    async def run():
        async with Client(build_server(KbRerankClient(base, token))) as c:
            return await c.call_tool(TOOL, {"query": query, **opts})

    result = asyncio.run(run())
    if result.is_error:
        raise KbRerankError(result.content[0].text)
    return [Passage(p["doc_id"], p["title"], p["text"] or "") for p in result.structured_content["passages"]]


INTEGRATIONS: dict[str, Callable[..., list[Passage]]] = {"langchain": _langchain, "llama_index": _llama_index,
                                                        "mcp": _mcp}


def _documents(base: str, token: str) -> dict[str, dict]:
    """The tenant's documents by title (GET /v1/kb/documents)."""
    with KbRerankClient(base, token) as client:
        return {d["title"]: d for d in client.get("/v1/kb/documents?limit=200").body["documents"]}


def _one(docs: dict[str, dict], prefix: str) -> dict:
    (doc,) = [d for title, d in docs.items() if title.startswith(prefix)]
    return doc


@pytest.mark.parametrize("name", sorted(INTEGRATIONS))
def test_a_filter_narrows_the_tenants_passages_and_never_reaches_another_tenant(live, name):  # noqa: F811
    search = INTEGRATIONS[name]
    a_docs, b_docs = _documents(live.base, live.token_a), _documents(live.base, live.token_b)
    a_billing, a_export = _one(a_docs, "Billing and invoices"), _one(a_docs, "Exporting data")
    b_billing = _one(b_docs, "Billing and invoices")
    query = f"invoices export reports security {WORD_A} {WORD_B}"

    unfiltered = search(live.base, live.token_a, query, top_n=5)
    assert len({p.doc_id for p in unfiltered}) > 1  # the filter below has something to remove

    # one document by its source path: only its passages
    only = search(live.base, live.token_a, query, filter={"source_path": a_billing["source_path"]})
    assert only and {p.doc_id for p in only} == {a_billing["doc_id"]}
    # $in over two paths
    two = search(live.base, live.token_a, query,
                 filter={"source_path": {"$in": [a_billing["source_path"], a_export["source_path"]]}})
    assert two and {p.doc_id for p in two} <= {a_billing["doc_id"], a_export["doc_id"]}
    # top_n
    assert len(search(live.base, live.token_a, query, top_n=1)) == 1

    # tenant B's title, path and document id, asked with A's token: none of B's passages, ever
    assert search(live.base, live.token_a, query, filter={"title": b_billing["title"]}) == []
    for flt in ({"source_path": b_billing["source_path"]}, {"doc_id": b_billing["doc_id"]},
                {"tenant_id": str(live.tenant_b)}):
        got = search(live.base, live.token_a, query, filter=flt)
        assert {p.doc_id for p in got} <= live.docs_a, flt
        assert all(WORD_B not in p.text and WORD_B not in p.title for p in got), flt
    # and B's token with B's own title finds it
    mine = search(live.base, live.token_b, query, filter={"title": b_billing["title"]})
    assert mine and {p.doc_id for p in mine} == {b_billing["doc_id"]}

    # a bad filter: the API's 422, naming the field
    with pytest.raises(KbRerankError) as exc:
        search(live.base, live.token_a, query, filter={"updated_at": {"$gte": "yesterday"}})
    assert "422" in str(exc.value) and "filter.updated_at.$gte" in str(exc.value)
