"""kb_rerank.integrations.langchain against a real `kb-rerank serve` process (two tenants, the tiny
cross-encoder; tests/integrations/integrations_live.py), plus the request bodies and degraded answers through
an httpx.MockTransport. Filters end to end, for the three integrations at once:
tests/integrations/test_integrations_filters.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from langchain_core.documents import Document

from kb_rerank.integrations._client import KbRerankError, KbRerankUnavailable
from kb_rerank.integrations.langchain import KbRerankCompressor, KbRerankRetriever

from tests.integrations.integrations_live import (  # noqa: F401 - live: a module fixture
    FALLBACK_SEARCH, V2_UNAVAILABLE, WORD_A, WORD_B, api, frameworks_after, live, mock_client, run_doc_example)

ROOT = Path(__file__).resolve().parents[2]


def test_importing_kb_rerank_imports_no_framework():
    assert frameworks_after("import kb_rerank, kb_rerank.integrations, kb_rerank.integrations._client, kb_rerank.cli.main, "
                            "kb_rerank.cli.mcp, kb_rerank.app\n"
                            "kb_rerank.cli.main.build_parser().parse_args(['mcp', '--token', 't'])") == []
    # and each integration imports its own framework only
    assert frameworks_after("import kb_rerank.integrations.langchain") == ["langchain_core"]


def test_each_integration_is_an_extra_the_dev_extra_installs():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    extras = meta["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["langchain"]] == ["langchain-core"]
    assert [r.split(">")[0] for r in extras["llamaindex"]] == ["llama-index-core"]
    assert [r.split(">")[0] for r in extras["mcp"]] == ["mcp"]
    assert "kb-rerank[langchain,llamaindex,mcp]" in extras["dev"]
    deps = " ".join(meta["dependencies"])
    assert not any(name in deps for name in ("langchain", "llama-index", "mcp"))
    # every package the extras pulled in is pinned
    pins = {line.split("==")[0].lower() for line in (ROOT / "constraints.txt").read_text("utf-8").splitlines()
            if "==" in line and not line.startswith("#")}
    assert {"langchain-core", "llama-index-core", "mcp", "mcp-types", "langsmith", "starlette"} <= pins


# --------------------------------------------------------------------------- retriever, live


def test_retriever_returns_the_services_results_as_documents(live):  # noqa: F811
    query = f"recurring invoice {WORD_A}"
    docs = KbRerankRetriever(base_url=live.base, token=live.token_a).invoke(query)
    direct = api(live, live.token_a, "/v1/kb/context", {"query": query})  # the default route
    assert docs and all(isinstance(d, Document) for d in docs)
    assert [d.metadata["chunk_id"] for d in docs] == [r["chunk_id"] for r in direct["results"]]
    for d, r in zip(docs, direct["results"]):
        # the whole passage, as the context block holds it
        assert d.page_content == r["text"] and f"\n{r['text']}\n</passage>" in direct["context"]
        assert d.id == r["chunk_id"]
        m = d.metadata
        assert (m["doc_id"], m["title"], m["rerank_score"], m["scored_by"], m["source_path"], m["tier"],
                m["citation"]) == (r["doc_id"], r["doc_title"], r["rerank_score"], r["scored_by"], r["source_path"],
                                   r["tier"], r["citation"])
        assert m["doc_id"] in live.docs_a
        assert m["model"] == direct["model"] and m["fallback"] is False and m["fallback_reason"] is None
        assert len(m["trace_id"]) >= 16
    assert all(WORD_A in d.page_content for d in docs)
    billing = [d for d in docs if d.metadata["title"].startswith("Billing and invoices")]
    # a passage longer than the snippet comes whole (the search route would cut it at 300 characters)
    assert billing and len(billing[0].page_content) > 300 and billing[0].page_content.endswith("due date.")
    # the trace id is the answer's own (one id for every document of a call)
    assert len({d.metadata["trace_id"] for d in docs}) == 1


def test_the_search_endpoint_gives_its_snippets_and_sources(live):  # noqa: F811
    query = f"recurring invoice {WORD_A}"
    docs = KbRerankRetriever(base_url=live.base, token=live.token_a, endpoint="search").invoke(query)
    direct = api(live, live.token_a, "/v1/kb/search/rerank", {"query": query})
    assert [d.metadata["chunk_id"] for d in docs] == [r["chunk_id"] for r in direct["results"]] and docs
    for d, r in zip(docs, direct["results"]):
        assert d.page_content == r["snippet"] and len(d.page_content) <= 300
        assert (d.metadata["source"], d.metadata["rerank_score"]) == (r["source"], r["rerank_score"])


def test_retriever_async_and_token_provider(live):  # noqa: F811
    calls = []

    def provider():
        calls.append(1)
        return live.token_a

    retriever = KbRerankRetriever(base_url=live.base, token_provider=provider, endpoint="search",
                                  source="lexical_only")
    query = f"export CSV {WORD_A}"
    docs = asyncio.run(retriever.ainvoke(query))
    again = retriever.invoke(query)
    assert len(calls) == 2  # asked before each request
    assert docs and [d.metadata["chunk_id"] for d in docs] == [d.metadata["chunk_id"] for d in again]
    assert all(d.metadata["source"] == "lexical_only" for d in docs)
    direct = api(live, live.token_a, "/v1/kb/search/rerank", {"query": query, "source": "lexical_only"})
    assert [d.page_content for d in docs] == [r["snippet"] for r in direct["results"]]


def test_tenant_a_never_gets_tenant_bs_passages(live):  # noqa: F811
    query = f"{WORD_B} invoices export security ownership errors"
    for endpoint in ("search", "context"):
        a_docs = KbRerankRetriever(base_url=live.base, token=live.token_a, endpoint=endpoint).invoke(query)
        b_docs = KbRerankRetriever(base_url=live.base, token=live.token_b, endpoint=endpoint).invoke(query)
        assert a_docs and b_docs  # both tenants answer the same query, from their own documents
        assert {d.metadata["doc_id"] for d in a_docs} <= live.docs_a
        assert all(WORD_B not in d.page_content and WORD_B not in d.metadata["title"] for d in a_docs)
        assert {d.metadata["doc_id"] for d in b_docs} <= live.docs_b
        assert any(WORD_B in d.page_content for d in b_docs)
    a_async = asyncio.run(KbRerankRetriever(base_url=live.base, token=live.token_a).ainvoke(WORD_B))
    assert {d.metadata["doc_id"] for d in a_async} <= live.docs_a


def test_context_endpoint_tiers_and_a_flagged_passage_fenced(live):  # noqa: F811
    query = f"{WORD_A} refunds policy instructions"
    docs = KbRerankRetriever(base_url=live.base, token=live.token_a, endpoint="context", top_n=6).invoke(query)
    direct = api(live, live.token_a, "/v1/kb/context", {"query": query, "top_n": 6})
    assert [d.metadata["chunk_id"] for d in docs] == [r["chunk_id"] for r in direct["results"]]
    assert 1 <= len(docs) <= 6
    for d, r in zip(docs, direct["results"]):
        assert d.metadata["tier"] == r["tier"] in ("high", "medium", "low")
        assert d.metadata["final_score"] == r["final_score"] and d.metadata["scores"] == r["scores"]
        assert d.metadata["citation"] == r["citation"] and d.metadata["source_path"] == r["source_path"]
    flagged = [d for d in docs if d.metadata["chunk_id"] == live.flagged_chunk]
    assert flagged, "the flagged passage is served (doubtful evidence: demoted, kept)"
    f = flagged[0]
    assert f.metadata["flagged"] is True and f.metadata["flags"]["injection"] is True
    assert "<|im_start|>" not in f.page_content and "</context>" not in f.page_content
    assert "Ignore all previous instructions" in f.page_content  # fenced, not dropped
    assert all("flagged" not in d.metadata for d in docs if d is not f)
    # a source belongs to the search route: refused when the retriever is built
    for endpoint in ({"endpoint": "context"}, {}):
        with pytest.raises(ValueError, match="source applies to endpoint=\"search\""):
            KbRerankRetriever(base_url=live.base, token=live.token_a, source="lexical_only", **endpoint)
    with pytest.raises(ValueError, match="endpoint"):
        KbRerankRetriever(base_url=live.base, token=live.token_a, endpoint="rerank")


def test_errors_carry_status_body_and_trace_id(live):  # noqa: F811
    with pytest.raises(KbRerankError) as exc:
        KbRerankRetriever(base_url=live.base, token="not-a-token").invoke("invoices")
    e = exc.value
    assert e.status == 401 and e.error == "unauthorized" and e.trace_id and e.trace_id in str(e)
    with pytest.raises(KbRerankError) as exc:
        asyncio.run(KbRerankRetriever(base_url=live.base, token=live.token_a, endpoint="context",
                                      top_n=0).ainvoke("invoices"))
    assert exc.value.status == 422 and exc.value.body["field"] == "top_n" and "top_n" in str(exc.value)
    with pytest.raises(KbRerankError) as exc:
        KbRerankRetriever(base_url="http://127.0.0.1:9", token="t").invoke("x")
    assert exc.value.status is None and "could not be reached" in str(exc.value)
    with pytest.raises(ValueError):
        KbRerankRetriever(token="t").invoke("x")  # no base URL


# --------------------------------------------------------------------------- bodies and degraded answers


def test_filter_and_top_n_are_passed_through_only_when_set():
    client, sent = mock_client(FALLBACK_SEARCH)
    flt = {"tags": "billing", "updated_at": {"$gte": "2026-01-01"}, "product": {"$in": ["a", "b"]}}
    KbRerankRetriever(client=client, endpoint="search", top_n=3, filter=flt, source="lexical_only").invoke("q")
    asyncio.run(KbRerankRetriever(client=client, top_n=2, filter=flt).ainvoke("q"))
    KbRerankRetriever(client=client).invoke("q")
    assert sent[0] == {"path": "/v1/kb/search/rerank", "auth": "Bearer tok",
                       "body": {"query": "q", "source": "lexical_only", "top_n": 3, "filter": flt}}
    assert sent[1]["path"] == "/v1/kb/context" and sent[1]["body"] == {"query": "q", "top_n": 2, "filter": flt}
    assert sent[2] == {"path": "/v1/kb/context", "auth": "Bearer tok", "body": {"query": "q"}}  # nothing unset


def test_a_fallback_answer_is_read_as_given():
    client, _ = mock_client(FALLBACK_SEARCH, headers={"X-KB-Fallback": "model_not_ready"})
    (doc,) = KbRerankRetriever(client=client, endpoint="search").invoke("q")
    m = doc.metadata
    assert m["rerank_score"] is None and m["fused_score"] == 0.42 and m["scored_by"] == "fused"
    assert m["model"] is None and m["fallback"] is True and m["fallback_reason"] == "model_not_ready"
    assert m["trace_id"] == "trace-1"
    assert "relevance_score" not in m and "tier" not in m  # nothing invented


# --------------------------------------------------------------------------- compressor (/v2/rerank)


CANDIDATES = [
    Document(page_content="Carson City is the capital city of the American state of Nevada.", metadata={"k": 0}),
    Document(page_content="Washington, D.C. is the capital of the United States.", metadata={"k": 1}, id="dc"),
    Document(page_content="Capital punishment has existed in the United States since before it was a country.",
             metadata={"k": 2}),
    Document(page_content="Invoices are created from the billing page.", metadata={"k": 3}),
]


def test_compressor_reranks_the_chains_documents(live):  # noqa: F811
    query = "What is the capital of the United States?"
    comp = KbRerankCompressor(base_url=live.base, token=live.token_a, top_n=3)
    out = comp.compress_documents(CANDIDATES, query)
    direct = api(live, live.token_a, "/v2/rerank", {"query": query, "documents": [d.page_content for d in CANDIDATES],
                                                     "top_n": 3})
    assert [d.metadata["k"] for d in out] == [r["index"] for r in direct["results"]]
    assert len(out) == 3
    for d, r in zip(out, direct["results"]):
        src = CANDIDATES[r["index"]]
        assert d.page_content == src.page_content and d.id == src.id
        assert d.metadata["relevance_score"] == r["relevance_score"] and d.metadata["tier"] == r["tier"]
        assert d.metadata["final_score"] == r["final_score"] and d.metadata["index"] == r["index"]
        assert d.metadata["fallback"] is False and d.metadata["model"] == direct["meta"]["model"]
    again = asyncio.run(comp.acompress_documents(CANDIDATES, query))
    assert [d.metadata["k"] for d in again] == [d.metadata["k"] for d in out]
    assert comp.compress_documents([], query) == []


def test_compressor_raises_on_503_instead_of_returning_the_input_order():
    body = V2_UNAVAILABLE
    client, sent = mock_client(body, status=503, headers={"Retry-After": "7"})
    comp = KbRerankCompressor(client=client, top_n=2)
    for call in (lambda: comp.compress_documents(CANDIDATES, "q"),
                 lambda: asyncio.run(comp.acompress_documents(CANDIDATES, "q"))):
        with pytest.raises(KbRerankUnavailable) as exc:
            call()
        e = exc.value
        assert e.status == 503 and e.retry_after == 7 and e.body == body and e.trace_id == "trace-1"
        assert "503" in str(e) and "no model can score" in str(e)
    assert sent[0]["body"] == {"query": "q", "documents": [d.page_content for d in CANDIDATES], "top_n": 2}


def test_the_docs_example_runs(live):  # noqa: F811
    r = run_doc_example("LangChain", live.base, live.token_a)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    direct = api(live, live.token_a, "/v1/kb/context", {"query": "what does ERR_402 mean", "top_n": 3})
    assert len(lines) == len(direct["results"]) + 2 and len(direct["results"]) == 3
    for line, res in zip(lines, direct["results"]):
        assert line.startswith(f"{res['citation']} {res['tier']} {res['rerank_score']} {res['doc_title']} | trace ")
        assert line.endswith("| fallback False")
    own = ["Refunds take five days.", "ERR_402: payment required.", "Hello."]
    v2 = api(live, live.token_a, "/v2/rerank", {"query": "what is ERR_402", "documents": own, "top_n": 2})
    assert lines[3:] == [f"{x['relevance_score']} {x['tier']} {own[x['index']]}" for x in v2["results"]]


def test_the_readme_example_runs(live):  # noqa: F811
    readme = (ROOT / "README.md").read_text("utf-8")
    block = readme.split("\n## LangChain, LlamaIndex, MCP", 1)[1].split("```python\n", 1)[1].split("\n```", 1)[0]
    env = {**os.environ, "KB_BASE_URL": live.base, "KB_TOKEN": live.token_a}
    r = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=180, env=env)
    assert r.returncode == 0, r.stderr
    direct = api(live, live.token_a, "/v1/kb/context", {"query": "what does ERR_402 mean", "top_n": 5,
                                                         "filter": {"language": "en"}})
    assert direct["results"] and r.stdout.splitlines() == [
        f"{x['rank']} {x['tier']} {x['doc_title']} {x['scored_by']} False" for x in direct["results"]]


@pytest.mark.parametrize("module,package,extra", [("langchain", "langchain_core", "langchain"),
                                                  ("llama_index", "llama_index", "llamaindex"),
                                                  ("mcp", "mcp", "mcp")])
def test_a_missing_framework_is_an_error_naming_its_extra(module, package, extra):
    code = (f"import sys; sys.modules[{package!r}] = None\n"
            "from kb_rerank.core.extras import MissingExtra\n"
            f"try:\n    import kb_rerank.integrations.{module}\n"
            "except MissingExtra as exc:\n    print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"pip install 'kb-rerank[{extra}]'" in out.stdout
    if module == "mcp":  # and the command says so, without a traceback
        code = ("import sys; sys.modules['mcp'] = None\nfrom kb_rerank.cli.main import main\n"
                "sys.exit(main(['mcp', '--token', 't', '--url', 'http://127.0.0.1:9']))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                             stdin=subprocess.DEVNULL)
        assert out.returncode == 1 and "pip install 'kb-rerank[mcp]'" in out.stderr and "Traceback" not in out.stderr
