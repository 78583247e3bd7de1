"""kb_rerank.integrations.llama_index against a real `kb-rerank serve` process (two tenants, the
tiny cross-encoder; tests/integrations/integrations_live.py), plus the request bodies and degraded answers
through an httpx.MockTransport. Filters end to end, for the three integrations at once:
tests/integrations/test_integrations_filters.py."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle, TextNode

from kb_rerank.integrations._client import KbRerankError, KbRerankUnavailable
from kb_rerank.integrations.llama_index import KbRerankPostprocessor, KbRerankRetriever

from tests.integrations.integrations_live import (  # noqa: F401 - live: a module fixture
    FALLBACK_SEARCH, V2_UNAVAILABLE, WORD_A, WORD_B, api, frameworks_after, live, mock_client, run_doc_example)


def test_the_module_imports_llama_index_only():
    assert frameworks_after("import kb_rerank.integrations.llama_index") == ["llama_index"]


def test_retriever_returns_nodes_with_the_services_scores(live):  # noqa: F811
    query = f"two-factor authentication {WORD_A}"
    nodes = KbRerankRetriever(live.base, live.token_a).retrieve(query)
    direct = api(live, live.token_a, "/v1/kb/context", {"query": query})  # the default route
    assert nodes and all(isinstance(n, NodeWithScore) for n in nodes)
    assert [n.node.node_id for n in nodes] == [r["chunk_id"] for r in direct["results"]]
    for n, r in zip(nodes, direct["results"]):
        assert n.score == r["rerank_score"] and n.node.get_content() == r["text"]  # the whole passage
        m = n.node.metadata
        assert (m["doc_id"], m["title"], m["scored_by"], m["source_path"], m["tier"]) == \
               (r["doc_id"], r["doc_title"], r["scored_by"], r["source_path"], r["tier"])
        assert m["fallback"] is False and m["model"] == direct["model"] and m["trace_id"]
        # the language model sees the title with the passage, not the ids and scores
        llm = n.node.get_content(metadata_mode=MetadataMode.LLM)
        assert r["doc_title"] in llm and r["chunk_id"] not in llm and "trace_id" not in llm
    # the search route: its snippets, its own order
    searched = KbRerankRetriever(live.base, live.token_a, endpoint="search").retrieve(query)
    direct = api(live, live.token_a, "/v1/kb/search/rerank", {"query": query})
    assert [(n.node.node_id, n.node.get_content(), n.score, n.node.metadata["source"]) for n in searched] == \
           [(r["chunk_id"], r["snippet"], r["rerank_score"], r["source"]) for r in direct["results"]]
    with pytest.raises(ValueError, match="source"):
        KbRerankRetriever(live.base, live.token_a, source="lexical_only")  # a search-route option


def test_async_retrieve_context_endpoint_and_token_provider(live):  # noqa: F811
    calls = []

    def provider():
        calls.append(1)
        return live.token_a

    query = f"transfer workspace ownership {WORD_A}"
    retriever = KbRerankRetriever(live.base, token_provider=provider, top_n=3)
    nodes = asyncio.run(retriever.aretrieve(query))
    direct = api(live, live.token_a, "/v1/kb/context", {"query": query, "top_n": 3})
    assert calls == [1]
    assert [n.node.node_id for n in nodes] == [r["chunk_id"] for r in direct["results"]] and len(nodes) == 3
    for n, r in zip(nodes, direct["results"]):
        assert n.node.metadata["tier"] == r["tier"] and n.node.metadata["final_score"] == r["final_score"]
        assert n.score == r["rerank_score"]


def test_tenant_a_never_gets_tenant_bs_passages(live):  # noqa: F811
    query = f"{WORD_B} invoices export security ownership errors"
    for endpoint in ("search", "context"):
        a = KbRerankRetriever(live.base, live.token_a, endpoint=endpoint).retrieve(query)
        b = asyncio.run(KbRerankRetriever(live.base, live.token_b, endpoint=endpoint).aretrieve(query))
        assert a and b
        assert {n.node.metadata["doc_id"] for n in a} <= live.docs_a
        assert all(WORD_B not in n.node.get_content() for n in a)
        assert {n.node.metadata["doc_id"] for n in b} <= live.docs_b
        assert any(WORD_B in n.node.get_content() for n in b)


def test_errors_and_bodies():
    client, sent = mock_client(FALLBACK_SEARCH, headers={"X-KB-Fallback": "model_timeout"})
    flt = {"tags": {"$in": ["billing"]}, "version": "2"}
    (n,) = KbRerankRetriever(client=client, endpoint="search", top_n=4, filter=flt).retrieve("q")
    assert sent[0]["path"] == "/v1/kb/search/rerank" and sent[0]["body"] == {"query": "q", "top_n": 4, "filter": flt}
    # a fallback: no relevance to give, so none is invented; every field as the answer had it
    assert n.score is None and n.node.metadata["fused_score"] == 0.42 and n.node.metadata["rerank_score"] is None
    assert n.node.metadata["fallback_reason"] == "model_timeout" and n.node.metadata["model"] is None
    KbRerankRetriever(client=client).retrieve("q")
    assert sent[1] == {"path": "/v1/kb/context", "auth": "Bearer tok", "body": {"query": "q"}}
    with pytest.raises(ValueError):
        KbRerankRetriever()  # neither base URL nor client


def test_unauthorized_is_an_error_with_the_trace_id(live):  # noqa: F811
    with pytest.raises(KbRerankError) as exc:
        KbRerankRetriever(live.base, "not-a-token").retrieve("invoices")
    assert exc.value.status == 401 and exc.value.error == "unauthorized" and exc.value.trace_id


# --------------------------------------------------------------------------- postprocessor (/v2/rerank)


TEXTS = ["Carson City is the capital city of the American state of Nevada.",
         "Washington, D.C. is the capital of the United States.",
         "Capital punishment has existed in the United States since before it was a country.",
         "Invoices are created from the billing page."]


def _nodes():
    return [NodeWithScore(node=TextNode(text=t, id_=f"n{i}", metadata={"k": i}), score=0.1 * i)
            for i, t in enumerate(TEXTS)]


def test_postprocessor_reranks_the_pipelines_nodes(live):  # noqa: F811
    query = "What is the capital of the United States?"
    post = KbRerankPostprocessor(base_url=live.base, token=live.token_a, top_n=3)
    given = _nodes()
    out = post.postprocess_nodes(given, query_str=query)
    direct = api(live, live.token_a, "/v2/rerank", {"query": query, "documents": TEXTS, "top_n": 3})
    assert [n.node.node_id for n in out] == [f"n{r['index']}" for r in direct["results"]] and len(out) == 3
    for n, r in zip(out, direct["results"]):
        assert n.score == r["relevance_score"] and n.node.metadata["tier"] == r["tier"]
        assert n.node.metadata["k"] == r["index"] and n.node.get_content() == TEXTS[r["index"]]
        assert "relevance_score" not in n.node.get_content(metadata_mode=MetadataMode.LLM)
    assert all("tier" not in g.node.metadata for g in given)  # the caller's nodes are not changed
    again = asyncio.run(post.apostprocess_nodes(_nodes(), query_bundle=QueryBundle(query)))
    assert [n.node.node_id for n in again] == [n.node.node_id for n in out]
    with pytest.raises(ValueError, match="query"):
        post.postprocess_nodes(_nodes())


def test_postprocessor_raises_on_503():
    client, sent = mock_client(V2_UNAVAILABLE, status=503, headers={"Retry-After": "7"})
    post = KbRerankPostprocessor(client=client)
    for call in (lambda: post.postprocess_nodes(_nodes(), query_str="q"),
                 lambda: asyncio.run(post.apostprocess_nodes(_nodes(), query_str="q"))):
        with pytest.raises(KbRerankUnavailable) as exc:
            call()
        assert exc.value.status == 503 and exc.value.retry_after == 7 and exc.value.trace_id == "trace-1"
    assert sent[0]["body"] == {"query": "q", "documents": TEXTS}


def test_the_docs_example_runs(live):  # noqa: F811
    r = run_doc_example("LlamaIndex", live.base, live.token_a)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    ctx = api(live, live.token_a, "/v1/kb/context", {"query": "how do I pause a recurring invoice", "top_n": 3})
    first = [f"{x['citation']} {x['tier']} {x['rerank_score']} {x['doc_title']}" for x in ctx["results"]]
    assert lines[:len(first)] == first and len(first) == 3
    texts = [x["text"] for x in ctx["results"]]  # the nodes' text: the whole passages
    v2 = api(live, live.token_a, "/v2/rerank", {"query": "when are payment reminders sent", "documents": texts, "top_n": 2})
    titles = [x["doc_title"] for x in ctx["results"]]
    assert lines[3:] == [f"{x['relevance_score']} {x['tier']} {titles[x['index']]}" for x in v2["results"]]
