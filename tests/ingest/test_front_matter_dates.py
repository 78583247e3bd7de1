"""A document's own date comes from its front matter (``updated_at`` or ``date``): it is the
filter field ``updated_at`` and the documents listing's ``updated_at``; the ingestion time is
``ingested_at``, listed and filterable; a document naming no date falls back to its ingestion
time. Through the real ingestion, the SQL filter and GET /v1/kb/documents."""

from __future__ import annotations

import uuid
from datetime import date, datetime, timezone

import psycopg
import pytest
from litestar.testing import TestClient
from psycopg.types.json import Jsonb

from kb_rerank.app import create_app
from kb_rerank.ingest.loader import document_date, ingest_paths
from kb_rerank.core.session import tenant_transaction

from tests.live_server import SECRET, FakeReranker, bearer

DOCS = {
    "old-guide": "updated_at: 2024-11-05",
    "dated-post": "date: 2025-08-01T09:30:00+02:00",
    "both": "updated_at: 2025-07-01\ndate: 2020-01-01",
    "undated": "product: billing",
}


def _write(folder, docs):
    folder.mkdir(parents=True, exist_ok=True)
    for name, fm in docs.items():
        (folder / f"{name}.md").write_text(f"---\n{fm}\n---\n# {name}\n\nInvoices and how to pay them.\n",
                                           encoding="utf-8")


@pytest.fixture(scope="module")
def dated(tmp_path_factory, settings, app_url, embedder):
    root = tmp_path_factory.mktemp("dates")
    tenant = uuid.uuid4()
    _write(root, DOCS)
    before = datetime.now(timezone.utc)
    with psycopg.connect(app_url) as conn:
        report = ingest_paths(conn, tenant, [root], embedder, settings)
        assert not report.bad_files, report.summary()
        with tenant_transaction(conn, tenant):
            rows = {uri.removesuffix(".md"): (doc_id, upd, ing) for doc_id, uri, upd, ing in conn.execute(
                "select doc_id, source_uri, updated_at, ingested_at from kb.documents")}
    return {"tenant": tenant, "rows": rows, "before": before, "root": root}


def test_front_matter_date_is_the_documents_date_and_ingestion_time_is_apart(dated):
    rows, before = dated["rows"], dated["before"]
    assert rows["old-guide"][1] == datetime(2024, 11, 5, tzinfo=timezone.utc)
    assert rows["dated-post"][1] == datetime(2025, 8, 1, 7, 30, tzinfo=timezone.utc)
    assert rows["both"][1] == datetime(2025, 7, 1, tzinfo=timezone.utc)  # updated_at before date
    assert rows["undated"][1] >= before and rows["undated"][1] == rows["undated"][2]  # falls back
    assert all(ing >= before for _, _, ing in rows.values())


def _filter(conn, tenant, f, rows) -> set[str]:
    names = {doc_id: n for n, (doc_id, _, _) in rows.items()}
    with tenant_transaction(conn, tenant):
        got = conn.execute("select kb.search_filter_docs(%s)", [Jsonb(f)]).fetchone()[0]
    return {names[d] for d in got}


def test_updated_at_filters_on_the_documents_own_date(dated, app_conn):
    t, rows = dated["tenant"], dated["rows"]
    # the user's journey: documents dated 2024 are not "updated since June 2025"
    assert _filter(app_conn, t, {"updated_at": {"$gte": "2025-06-01"}}, rows) == {"dated-post", "both", "undated"}
    assert _filter(app_conn, t, {"updated_at": {"$lt": "2025-01-01"}}, rows) == {"old-guide"}
    assert _filter(app_conn, t, {"updated_at": "2024-11-05"}, rows) == {"old-guide"}
    # ingested_at: every document was ingested now
    since = dated["before"].isoformat()
    assert _filter(app_conn, t, {"ingested_at": {"$gte": since}}, rows) == set(DOCS)
    assert _filter(app_conn, t, {"ingested_at": {"$lt": "2025-01-01"}}, rows) == set()


def test_a_changed_date_alone_updates_the_document(dated, settings, app_url, embedder):
    root, t = dated["root"], dated["tenant"]
    _write(root, {"old-guide": "updated_at: 2026-01-02"})
    with psycopg.connect(app_url) as conn:
        report = ingest_paths(conn, t, [root], embedder, settings)
        assert report.updated == 1 and report.chunks_written == 0, report.summary()
        with tenant_transaction(conn, t):
            (upd,) = conn.execute("select updated_at from kb.documents where source_uri = 'old-guide.md'").fetchone()
    assert upd == datetime(2026, 1, 2, tzinfo=timezone.utc)
    _write(root, {"old-guide": "updated_at: 2024-11-05"})
    with psycopg.connect(app_url) as conn:
        ingest_paths(conn, t, [root], embedder, settings)


def test_the_listing_has_both_dates(dated, settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder)
    with TestClient(app) as client:
        r = client.get("/v1/kb/documents", headers=bearer(dated["tenant"]))
    assert r.status_code == 200, r.text
    docs = {d["source_path"]: d for d in r.json()["documents"]}
    assert docs["old-guide.md"]["updated_at"].startswith("2024-11-05T00:00:00")
    assert datetime.fromisoformat(docs["old-guide.md"]["ingested_at"]) >= dated["before"]
    assert docs["undated.md"]["updated_at"] == docs["undated.md"]["ingested_at"]


def test_document_date_reads_yaml_dates_times_and_text():
    assert document_date({"updated_at": date(2024, 1, 2)}) == datetime(2024, 1, 2, tzinfo=timezone.utc)
    assert document_date({"date": datetime(2024, 1, 2, 3, 4)}) == datetime(2024, 1, 2, 3, 4, tzinfo=timezone.utc)
    assert document_date({"date": "2024-01-02T03:04:00+01:00"}) == datetime(2024, 1, 2, 2, 4, tzinfo=timezone.utc)
    assert document_date({"date": "last tuesday"}) is None
    assert document_date({"title": "x"}) is None
