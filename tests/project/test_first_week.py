"""A user's first week, end to end: a fresh tenant ingests a folder of its own documents
(.md, .txt, PDF, DOCX; English, German, Japanese, Chinese; front matter), searches from the
command line and over HTTP with filters and top_n, reranks with the Cohere SDK, meets a model
that failed and a remote backend that is down, and types five searches in a row against a
model slower than the budget. Each step asserts what the user sees."""

from __future__ import annotations

import time
import uuid

import cohere
import pytest
from litestar.testing import TestClient

from kb_rerank.cli import main as cli
from kb_rerank.app import create_app
from kb_rerank.models.cross_encoder import Reranker
from kb_rerank.models.remote import RemoteReranker

from tests.live_server import OPS, OPS_TOKEN, SECRET, URL, FakeReranker, bearer, free_port, serve_in_thread
from tests.ingest.test_ingest_files import make_docx, make_pdf
from tests.core.test_ordinary_use_limits import SlowModel

pytestmark = pytest.mark.slow

CONTEXT, V2 = "/v1/kb/context", "/v2/rerank"

DOCS = {
    "refunds.md": "---\ntitle: Refund policy\nproduct: billing\n---\n# Refunds\n\nA refund is issued to the"
                  " original payment method within five business days of the approval.\n",
    "rechnungen.md": "---\ntitle: Rechnungen exportieren\nproduct: reports\n---\n# Export\n\nRechnungen werden"
                     " im Bereich Berichte als CSV-Datei exportiert, jeweils für einen Monat.\n",
    "seikyu.txt": "請求書の発行方法\n請求書は毎月一日に自動で発行されます。支払い期限は発行日から三十日です。\n",
    "fapiao.md": "---\ntitle: 发票设置\nproduct: billing\n---\n发票在每个月的第一天自动开具，付款期限为三十天。\n",
}


def _kb(folder):
    folder.mkdir(parents=True)
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    (folder / "gasket.pdf").write_bytes(make_pdf(["Cover page", "Tighten the zephyrine gasket to twelve newton"
                                                  " metres."], title="Zephyrine service manual"))
    (folder / "export.docx").write_bytes(make_docx([("Heading1", "Quillwort export"),
                                                    (None, "Export quillwort reports as CSV from the Reports page.")]))
    return folder


def _app(settings, embedder, reranker, **changes):
    return create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, **changes), reranker=reranker,
                      embedder=embedder)


def test_a_first_week(settings, embedder, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KB_DATABASE_URL", settings.database_url)
    if settings.app_password:
        monkeypatch.setenv("KB_APP_PASSWORD", settings.app_password)
    tenant, h = uuid.uuid4(), None
    h = bearer(tenant)
    kb = _kb(tmp_path / "my-docs")

    # ingest from the command line: every file read, each failure (none here) printed once
    assert cli.main(["ingest", str(kb), "--tenant", str(tenant), "--quiet"]) == 0
    assert "6 added" in capsys.readouterr().out
    # search from the command line: the front-matter title, not the first heading
    assert cli.main(["search", "refund payment method", "--tenant", str(tenant), "--mode", "lexical"]) == 0
    out = capsys.readouterr().out
    assert "Refund policy" in out and "| " in out

    with TestClient(_app(settings, embedder, FakeReranker())) as client:
        # titles: front matter, a text file's first line, a PDF's metadata Title, a DOCX heading
        titles = set()
        for q in ("refund", "Rechnungen", "請求書", "发票", "zephyrine gasket", "quillwort"):
            r = client.post(URL, json={"query": q, "source": "lexical_only"}, headers=h)
            assert r.status_code == 200, r.text
            titles |= {x["doc_title"] for x in r.json()["results"]}
        assert {"Refund policy", "Rechnungen exportieren", "請求書の発行方法", "发票设置",
                "Zephyrine service manual", "Quillwort export"} <= titles

        # a filter and top_n over HTTP: one bound for top_n on both endpoints, named in plain words
        body = {"query": "billing invoices refunds", "filter": {"product": "billing"}, "top_n": 2}
        miss = client.post(URL, json=body, headers=h).json()
        assert 1 <= len(miss["results"]) <= 2
        assert {x["doc_title"] for x in miss["results"]} <= {"Refund policy", "发票设置"}
        assert miss["model"] == "fake-reranker" and miss["ranked_by"] == "model" and miss["fallback"] is False
        hit = client.post(URL, json=body, headers=h).json()
        assert hit["from_cache"] is True  # a hit reports the miss's counts
        assert (hit["candidate_count"], hit["reranked_count"]) == (miss["candidate_count"], miss["reranked_count"])
        for path in (URL, CONTEXT):
            assert client.post(path, json={"query": "refunds", "top_n": 20}, headers=h).status_code == 200
            for bad in (0, 21, "5"):
                r = client.post(path, json={"query": "refunds", "top_n": bad}, headers=h)
                assert r.status_code == 422 and r.json() == {
                    "error": "invalid_request", "field": "top_n",
                    "detail": "top_n must be a whole number between 1 and 20"}, r.text
        r = client.post(URL, content=b'{"query": "refu', headers={**h, "content-type": "application/json"})
        assert r.status_code == 400 and "truncated" not in r.json()["detail"]
        r = client.post(V2, json={"query": "q", "documents": ["a"], "lambda": 2}, headers=h)
        assert r.json()["detail"] == "lambda must be a number between 0.0 and 1.0"

        # an empty answer names no model
        empty = client.post(URL, json={"query": "refunds", "filter": {"product": "nothing-here"}}, headers=h).json()
        assert empty["results"] == [] and empty["model"] is None and empty["ranked_by"] == "none"
        ctx = client.post(CONTEXT, json={"query": "xylophone quartz nebula"}, headers=h).json()
        assert ctx["results"] == [] and ctx["model"] is None and ctx["ranked_by"] == "none"

    # the Cohere SDK against /v2/rerank: the top_n of highest relevance_score, in that order
    docs = ["Refunds go to the original payment method.", "Refunds go back to the original payment method.",
            "Invoices are issued monthly.", "Refunds are issued within five days.", "Refunds: original method."]
    with serve_in_thread(_app(settings, embedder, FakeReranker())) as base:
        co = cohere.ClientV2(base_url=base, api_key=h["Authorization"].split()[1])
        every = co.rerank(model="rerank-v3.5", query="how are refunds paid", documents=docs, top_n=len(docs))
        top = co.rerank(model="rerank-v3.5", query="how are refunds paid", documents=docs, top_n=3)
    scores = [x.relevance_score for x in every.results]
    assert scores == sorted(scores, reverse=True) and len(every.results) == len(docs)
    assert [x.index for x in top.results] == [x.index for x in every.results[:3]]

    # a model that failed to load: degraded, answers name no model, no Retry-After on /v2/rerank
    failed = Reranker(str(tmp_path / "no-such-model"), device="cpu")
    with TestClient(_app(settings, embedder, failed)) as client:
        deadline = time.monotonic() + 30
        while failed.state != "failed" and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = client.get("/readyz", headers=OPS)
        assert ready.status_code == 503 and ready.json()["status"] == "degraded"
        assert ready.json()["model"]["state"] == "failed"
        ctx = client.post(CONTEXT, json={"query": "refund payment method"}, headers=h).json()
        assert ctx["model"] is None and ctx["ranked_by"] in ("fused", "none")
        assert ctx["fallback"] is (ctx["ranked_by"] == "fused")
        r = client.post(V2, json={"query": "refunds", "documents": docs}, headers=h)
        assert r.status_code == 503 and r.json()["reason"] == "model_failed"
        assert "retry-after" not in r.headers and r.json()["retry_after_s"] is None

    # a remote backend whose server is down: degraded, answers name no model
    down = RemoteReranker(f"http://127.0.0.1:{free_port()}/rerank", model_name="BAAI/bge-reranker-v2-m3",
                          timeout_s=1.0)
    with TestClient(_app(settings, embedder, down)) as client:
        ready = client.get("/readyz", headers=OPS).json()
        assert ready["status"] == "degraded" and ready["model"]["state"] == "unreachable"
        r = client.post(URL, json={"query": "refund payment method"}, headers=h).json()
        assert r["model"] is None and r["ranked_by"] == "fused" and r["fallback"] is True

    # five searches typed one after another against a model slower than the budget: no 429
    with TestClient(_app(settings, embedder, SlowModel())) as client:
        for i in range(5):
            r = client.post(URL, json={"query": f"refund payment method {i}"}, headers=h)
            assert r.status_code == 200, r.text
