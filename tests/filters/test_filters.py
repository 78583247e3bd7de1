"""Metadata filters and the result size, as every search API has them.

Documents carry their front-matter keys (kb.documents.metadata, migration 0022), written by
the real ingestion; the filter (docs/filters.md) is applied inside both candidate lists
before fusion, by the SQL searches (as the app role, under RLS) and over REST against a real
HTTP server (uvicorn in a thread); one table of bad filters runs through both, each naming
the same field; a filter never widens what a tenant sees; the cache key holds the canonical
filter and top_n."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.types.json import Jsonb

from kb_rerank.app import create_app
from kb_rerank.ingest.loader import ingest_paths
from kb_rerank.filters import grammar as filters
from kb_rerank.core.query import normalize_query
from kb_rerank.core import knn
from kb_rerank.retrieval import store as search
from kb_rerank.core.session import run, tenant_transaction
from kb_rerank.core.settings import default

from tests.helpers import search_key
from tests.live_server import OPS_TOKEN, SECRET, FakeReranker, bearer, serve_in_thread

URL = "/v1/kb/search/rerank"

# tenant A's documents: name -> (front matter, body); every body speaks of invoices
DOCS_A = {
    "billing-pdf": ("product: billing\ntags: [invoice, pdf]\nversion: 2\nreleased: 2024-05-01",
                    "Invoices can be downloaded as PDF files from the billing page of the workspace."),
    "billing-refund": ("product: billing\ntags: [refund]\nversion: 3\nreleased: 2024-07-10\nlanguage: en",
                       "Refunds return the amount of a paid invoice to the card that paid it."),
    "security-2fa": ("product: security\ntags: invoice\nversion: 2.5\ndraft: true",
                     "Two-factor authentication is required before an administrator can void an invoice."),
    "export-csv": ("product: export\nreleased: 2023-12-31T22:00:00+00:00",
                   "Invoice lists are exported to CSV from the reports page, one invoice a line."),
}
DOCS_B = {
    "b-billing": ("product: billing\ntags: [invoice]\nversion: 2",
                  "Invoices of the other tenant: zebra invoices with a secret total."),
}


def _write(folder: Path, docs: dict[str, tuple[str, str]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (fm, body) in docs.items():
        (folder / f"{name}.md").write_text(f"---\n{fm}\n---\n# {name}\n\n{body}\n", encoding="utf-8")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, settings, app_url, embedder):
    """Tenants A and B, ingested from Markdown with front matter by the real ingestion."""
    root = tmp_path_factory.mktemp("filters")
    a, b = uuid.uuid4(), uuid.uuid4()
    _write(root / "a", DOCS_A)
    _write(root / "b", DOCS_B)
    with psycopg.connect(app_url) as conn:
        for tenant, folder in ((a, root / "a"), (b, root / "b")):
            report = ingest_paths(conn, tenant, [folder], embedder, settings)
            assert not report.bad_files, report.summary()
        ids = {}
        for tenant in (a, b):
            with tenant_transaction(conn, tenant):
                ids.update({uri.removesuffix(".md"): (doc_id, tenant) for doc_id, uri in
                            conn.execute("select doc_id, source_uri from kb.documents")})
    return {"a": a, "b": b, "ids": ids, "names": {v[0]: k for k, v in ids.items()}, "root": root}


def _names(corpus, doc_ids) -> set[str]:
    return {corpus["names"].get(d, f"unknown:{d}") for d in doc_ids}


def _filter_docs(conn, tenant, f) -> list:
    """kb.search_filter_docs(f) in ``tenant``'s transaction, as the connected role."""
    with tenant_transaction(conn, tenant):
        return conn.execute("select kb.search_filter_docs(%s)", [Jsonb(f)]).fetchone()[0]


# ---------------------------------------------------------------------------- metadata


def test_ingestion_stores_front_matter_as_metadata_and_updates_it(corpus, settings, app_url, embedder):
    with psycopg.connect(app_url) as conn:
        with tenant_transaction(conn, corpus["a"]):
            meta = dict(conn.execute("select source_uri, metadata from kb.documents").fetchall())
        assert meta["billing-pdf.md"] == {"product": "billing", "tags": ["invoice", "pdf"], "version": 2,
                                          "released": "2024-05-01"}
        # language is a column (not metadata); a YAML time is ISO text
        assert meta["billing-refund.md"] == {"product": "billing", "tags": ["refund"], "version": 3,
                                             "released": "2024-07-10"}
        assert meta["export-csv.md"] == {"product": "export", "released": "2023-12-31T22:00:00+00:00"}
        # re-ingesting a changed front matter (same body) updates the metadata, no chunk rewritten
        t = uuid.uuid4()
        folder = corpus["root"] / "again"
        _write(folder, {"doc": ("product: old", "A body that stays the same.")})
        ingest_paths(conn, t, [folder], embedder, settings)
        with tenant_transaction(conn, t):
            chunks = conn.execute("select chunk_id from kb.chunks order by chunk_id").fetchall()
        _write(folder, {"doc": ("product: new\ntags: [x]", "A body that stays the same.")})
        report = ingest_paths(conn, t, [folder], embedder, settings)
        assert report.updated == 1 and report.chunks_written == 0, report.summary()
        with tenant_transaction(conn, t):
            assert conn.execute("select metadata from kb.documents").fetchone()[0] == {"product": "new", "tags": ["x"]}
            assert conn.execute("select chunk_id from kb.chunks order by chunk_id").fetchall() == chunks


# ---------------------------------------------------------------------------- grammar semantics

SEMANTICS = [
    ({"product": "billing"}, {"billing-pdf", "billing-refund"}),
    ({"product": {"$eq": "billing"}}, {"billing-pdf", "billing-refund"}),
    ({"tags": "invoice"}, {"billing-pdf", "security-2fa"}),  # a list holds it, or the scalar is it
    ({"tags": {"$in": ["pdf", "refund"]}}, {"billing-pdf", "billing-refund"}),
    ({"product": "billing", "tags": "refund"}, {"billing-refund"}),  # AND
    ({"version": 2}, {"billing-pdf"}),
    ({"version": {"$gte": 2.5}}, {"billing-refund", "security-2fa"}),
    ({"version": {"$gt": 2, "$lt": 3}}, {"security-2fa"}),
    ({"draft": True}, {"security-2fa"}),
    ({"released": {"$gte": "2024-01-01"}}, {"billing-pdf", "billing-refund"}),
    ({"released": {"$lt": "2024-05-01T00:00:01Z"}}, {"billing-pdf", "export-csv"}),
    ({"released": {"$lte": "2024-01-01T00:00:00+02:00"}}, {"export-csv"}),  # 2023-12-31T22:00Z
    ({"source_path": "security-2fa.md"}, {"security-2fa"}),
    ({"source_path": {"$in": ["export-csv.md", "nope.md"]}}, {"export-csv"}),
    ({"language": "en", "product": "billing"}, {"billing-pdf", "billing-refund"}),
    ({"title": "export-csv"}, {"export-csv"}),
    ({"updated_at": {"$gte": "2000-01-01", "$lte": "2999-12-31"}}, set(DOCS_A)),
    ({"updated_at": {"$lt": "2000-01-01"}}, set()),
    ({"product": "nothing"}, set()),
    ({"missing_key": "billing"}, set()),
]


@pytest.mark.parametrize("f, expected", SEMANTICS, ids=[str(f) for f, _ in SEMANTICS])
def test_filter_selects_documents_by_metadata_and_columns(corpus, app_conn, f, expected):
    assert _names(corpus, _filter_docs(app_conn, corpus["a"], f)) == expected
    # the REST side's canonical form is the database's
    with tenant_transaction(app_conn, corpus["a"]):
        assert app_conn.execute("select kb.search_filter(%s)", [Jsonb(f)]).fetchone()[0] == filters.canonical(f)


def test_filter_is_inside_both_lists_before_fusion(corpus, app_conn, embedder):
    """Each list is k deep within the filter: the security document is below the billing ones
    for 'invoice pdf billing' unfiltered, yet a 1-deep filtered list finds it (a filter after
    the list would leave nothing)."""
    q = normalize_query("invoice pdf download billing page")
    emb = embedder.embed_query(q)
    only = {"product": "security"}
    with tenant_transaction(app_conn, corpus["a"]):
        lex_all = run(app_conn, search.alexical, q, 1)
        sem_all = run(app_conn, search.asemantic, emb, 1)
        assert _names(corpus, [c.doc_id for c in lex_all + sem_all]) == {"billing-pdf"}
        lex = run(app_conn, search.alexical, q, 1, filter=only)
        sem = run(app_conn, search.asemantic, emb, 1, filter=only)
        hyb = run(app_conn, search.ahybrid, q, emb, 1, filter=only)
        assert [corpus["names"][c.doc_id] for c in lex] == ["security-2fa"]
        assert [corpus["names"][c.doc_id] for c in sem] == ["security-2fa"]
        assert [corpus["names"][c.doc_id] for c in hyb] == ["security-2fa"]
        assert hyb[0].lexical_rank == 1 and hyb[0].semantic_rank == 1  # found by both lists
        rows = app_conn.execute(
            "select doc_id from kb.retrieve_hybrid(%s, %s::vector, 1, 10, 'convex', 0.7, 0.3, 1.2, 0.75, 5,"
            " null, null, null, %s)", [q, emb, Jsonb(only)]).fetchall()
        assert [corpus["names"][r[0]] for r in rows] == ["security-2fa"]
        # a filter of two products: every row is one of them, both lists 10 deep within it
        two = {"product": {"$in": ["billing", "export"]}}
        rows = run(app_conn, search.ahybrid, q, emb, 10, filter=two)
        assert _names(corpus, [c.doc_id for c in rows]) == {"billing-pdf", "billing-refund", "export-csv"}
        # no filter, {} and null are the same search
        assert [c.chunk_id for c in run(app_conn, search.ahybrid, q, emb, filter={})] == \
               [c.chunk_id for c in run(app_conn, search.ahybrid, q, emb)]


# ---------------------------------------------------------------------------- bad filters: REST and SQL

BAD = [
    ([], "filter"),
    ({"a b": 1}, "filter"),
    ({f"k{i}": 1 for i in range(17)}, "filter"),
    ({"product": None}, "filter.product"),
    ({"product": ["a", "b"]}, "filter.product"),
    ({"product": {}}, "filter.product"),
    ({"product": {"$ne": "a"}}, "filter.product.$ne"),
    ({"product": {"nested": {"x": 1}}}, "filter.product.nested"),
    ({"product": {"$in": []}}, "filter.product.$in"),
    ({"product": {"$in": "billing"}}, "filter.product.$in"),
    ({"product": {"$in": list(range(101))}}, "filter.product.$in"),
    ({"product": {"$in": [{"x": 1}]}}, "filter.product.$in"),
    ({"product": {"$eq": "a", "$gte": 1}}, "filter.product"),
    ({"product": "x" * 257}, "filter.product"),
    ({"updated_at": {"$gte": "yesterday"}}, "filter.updated_at.$gte"),
    ({"updated_at": {"$gte": "2024-13-01"}}, "filter.updated_at.$gte"),
    ({"updated_at": {"$lt": 5}}, "filter.updated_at.$lt"),
    ({"updated_at": "now"}, "filter.updated_at"),
    ({"version": {"$gte": 1, "$gt": 2}}, "filter.version"),
    ({"version": {"$gte": 1, "$lt": "2024-01-01"}}, "filter.version"),
    ({"version": {"$gte": True}}, "filter.version.$gte"),
    ({"title": {"$gte": "a"}}, "filter.title"),
    ({"source_path": 3}, "filter.source_path"),
]


@pytest.fixture(scope="module")
def server(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN), reranker=FakeReranker(),
                     embedder=embedder)
    with serve_in_thread(app) as base:
        with httpx.Client(base_url=base, timeout=60) as client:
            yield app, client


@pytest.mark.parametrize("f, field", BAD, ids=[f"{fld}-{i}" for i, (_, fld) in enumerate(BAD)])
def test_bad_filter_names_its_field_over_rest_and_in_sql(corpus, server, app_conn, f, field):
    _, client = server
    for url, body in ((URL, {"query": "invoice", "filter": f}), ("/v1/kb/context", {"query": "invoice", "filter": f})):
        r = client.post(url, json=body, headers=bearer(corpus["a"]))
        assert r.status_code == 422, (url, r.text)
        assert r.json()["error"] == "invalid_request" and r.json()["field"] == field, r.json()
    with pytest.raises(filters.FilterError) as exc:
        filters.canonical(f)
    assert exc.value.field == field
    for sql in ("select kb.search_filter(%s)", "select count(*) from kb.search_lexical('invoice', 5, 1.2, 0.75, %s)",
                "select count(*) from kb.search_semantic(array_fill(0.1::real, array[384])::vector, 5, %s)"):
        with tenant_transaction(app_conn, corpus["a"]):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
                app_conn.execute(sql, [Jsonb(f)])
        assert err.value.diag.column_name == field and err.value.diag.message_primary.startswith(field + ":")
        app_conn.rollback()


# ---------------------------------------------------------------------------- RLS: never wider


def test_a_filter_never_widens_what_the_tenant_sees(corpus, app_conn, embedder, server):
    """Tenant A, as the app role, filtering on B's document id, source path, metadata or
    tenant id, gets nothing of B: the filter runs under A's tenant and RLS."""
    b_doc, _ = corpus["ids"]["b-billing"]
    q = normalize_query("zebra invoices secret total")
    emb = embedder.embed_query(q)
    hostile = [{"source_path": "b-billing.md"}, {"doc_id": str(b_doc)}, {"tenant_id": str(corpus["b"])},
               {"product": "billing", "tags": "invoice", "version": 2}, {"title": "b-billing"},
               {"tenant_id": {"$in": [str(corpus["a"]), str(corpus["b"])]}}]
    a_docs = {d for d, t in corpus["ids"].values() if t == corpus["a"]}
    with tenant_transaction(app_conn, corpus["b"]):
        assert [c.doc_id for c in run(app_conn, search.alexical, q, 5, filter=hostile[0])] == [b_doc]  # B sees it
    for f in hostile:
        with tenant_transaction(app_conn, corpus["a"]):
            got = [c.doc_id for c in run(app_conn, search.alexical, q, 50, filter=f)]
            got += [c.doc_id for c in run(app_conn, search.asemantic, emb, 50, filter=f)]
            got += [c.doc_id for c in run(app_conn, search.ahybrid, q, emb, 50, filter=f)]
        docs = _filter_docs(app_conn, corpus["a"], f)
        assert set(got) <= a_docs and set(docs) <= a_docs and b_doc not in got, f
    # {"product": "billing", ...} matches A's own billing document only
    assert _names(corpus, _filter_docs(app_conn, corpus["a"], hostile[3])) == {"billing-pdf"}
    # over REST, with A's token: nothing of B
    _, client = server
    for f in hostile[:3]:
        r = client.post(URL, json={"query": "zebra invoices secret total", "filter": f}, headers=bearer(corpus["a"]))
        assert r.status_code == 200 and r.json()["results"] == [], (f, r.text)


def test_no_tenant_no_rows_even_with_a_filter(corpus, app_conn):
    assert app_conn.execute("select kb.search_filter_docs(%s)", [Jsonb({"product": "billing"})]).fetchone()[0] == []
    assert app_conn.execute("select count(*) from kb.search_lexical('invoice', 5, 1.2, 0.75, %s)",
                            [Jsonb({"product": "billing"})]).fetchone()[0] == 0


# ---------------------------------------------------------------------------- REST: filter, top_n, cache key


def test_rest_filter_and_top_n(corpus, server):
    _, client = server
    h = bearer(corpus["a"])
    r = client.post(URL, json={"query": "invoice", "filter": {"product": "billing"}}, headers=h)
    assert r.status_code == 200, r.text
    got = {corpus["names"][uuid.UUID(x["doc_id"])] for x in r.json()["results"]}
    assert got == {"billing-pdf", "billing-refund"}
    for source in ("lexical_only", "semantic_only"):
        r = client.post(URL, json={"query": "invoice", "source": source, "filter": {"tags": "invoice"}}, headers=h)
        assert {corpus["names"][uuid.UUID(x["doc_id"])] for x in r.json()["results"]} == {"billing-pdf", "security-2fa"}
    for n in (1, 3, 10):
        r = client.post(URL, json={"query": "invoice", "top_n": n}, headers=h)
        assert r.status_code == 200 and len(r.json()["results"]) == min(n, len(DOCS_A)), r.text
    for n in (0, default("max_top_n") + 1, -1, "3", 2.5):  # one past KB_MAX_TOP_N
        r = client.post(URL, json={"query": "invoice", "top_n": n}, headers=h)
        assert r.status_code == 422 and r.json()["field"] == "top_n", (n, r.text)
    # /v1/kb/context takes the filter too
    r = client.post("/v1/kb/context", json={"query": "invoice", "filter": {"product": "export"}, "explain": True},
                    headers=h)
    assert r.status_code == 200, r.text
    assert {corpus["names"][uuid.UUID(x["doc_id"])] for x in r.json()["results"]} == {"export-csv"}
    # /v2/rerank (the caller's documents) has no filter
    r = client.post("/v2/rerank", json={"query": "q", "documents": ["a"], "filter": {"product": "x"}}, headers=h)
    assert r.status_code == 422 and r.json()["field"] == "filter", r.text


def test_cache_key_holds_the_canonical_filter_and_top_n(corpus, server, settings):
    from kb_rerank.endpoints.requests import RerankRequest
    from kb_rerank.endpoints.search.flow import SearchFlow

    app, client = server
    pipe = app.state.pipeline

    def key(**kw):
        req = RerankRequest(query="invoice", **kw)
        req.filter = filters.canonical(req.filter)
        return pipe.cache_key(pipe.flow(SearchFlow, req), None)

    same = [key(filter={"product": "billing", "tags": "pdf"}),
            key(filter={"tags": {"$eq": "pdf"}, "product": {"$eq": "billing"}}),
            key(filter={"tags": {"$in": ["pdf"]}, "product": "billing"})]
    assert len(set(same)) == 1
    assert key() == key(filter={}) == key(top_n=10) == key(filter=None, top_n=settings.rerank_top_n)
    assert len({same[0], key(), key(filter={"product": "billing"}), key(top_n=3),
                key(filter={"updated_at": {"$gte": "2024-01-01"}})}) == 5
    assert key(filter={"updated_at": {"$gte": "2024-01-01"}}) == key(filter={"updated_at": {"$gte": "2024-01-01T02:00+02:00"}})
    # over HTTP: the same filter written another way is served from the cache; another is not
    h = bearer(corpus["a"])
    first = client.post(URL, json={"query": "invoice refund", "filter": {"product": "billing", "version": 3}}, headers=h)
    again = client.post(URL, json={"query": "invoice refund", "filter": {"version": {"$eq": 3}, "product": "billing"}},
                        headers=h)
    other = client.post(URL, json={"query": "invoice refund", "filter": {"product": "billing"}}, headers=h)
    assert first.json()["from_cache"] is False and again.json()["from_cache"] is True
    assert again.json()["results"] == first.json()["results"]
    assert other.json()["from_cache"] is False
    assert search_key(settings, "x") != ""  # the helper still builds a key without filter or top_n


# ---------------------------------------------------------------------------- broad filters (> 4000 chunks)

WORDS = [f"v{i:02d}" for i in range(40)]


def _broad_tenant(conn, docs: int) -> uuid.UUID:
    """A tenant of ``docs`` documents of 10 chunks each, 4 in 5 of them tagged "wide"."""
    t = uuid.uuid4()
    with tenant_transaction(conn, t):
        conn.execute("select setseed(0.33)")
        conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash, metadata)"
                     " select kb.current_tenant(), 'd' || i, '', repeat('0', 64),"
                     "        jsonb_build_object('tags', case when i %% 5 < 4 then '[\"wide\"]'::jsonb else '[]' end)"
                     " from generate_series(1, %s) as i", [docs])
        conn.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                     " select kb.current_tenant(), d.doc_id, p,"
                     "        (select string_agg((%s::text[])[1 + floor(random() * 40)::int], ' ')"
                     "         from generate_series(1, 6 + p)),"  # correlated on p: drawn per chunk
                     "        repeat('0', 64),"
                     # vectors near a curve (a position drawn per chunk, plus noise): neighbours
                     # exist, as in real embeddings; uniform noise in 384 dimensions has none,
                     # and a graph index's recall on it swings from build to build
                     "        (select array_agg(cos(g * x.r) + 0.2 * (random() - 0.5))::real[]"
                     "         from (select random() * 3 + 0 * p as r) x, generate_series(1, 384) g)::vector"
                     " from kb.documents d cross join generate_series(0, 9) as p", [WORDS])
        conn.execute("select kb.refresh_term_blocks(16, 100)")
    conn.commit()
    return t


def _exact(conn, f, v, k):
    return [r[0] for r in conn.execute(
        # (a scalar subquery: the filter's documents read once, not again for each chunk a scan visits)
        "select chunk_id from kb.chunks where doc_id = any ((select kb.search_filter_docs(%s))::uuid[])"
        " order by (embedding <=> %s) + 0, chunk_id limit %s", [f, v, k])]


def test_a_filter_below_the_exact_threshold_gets_the_exact_semantic_list(app_url):
    """More chunks in the filter than the lexical list's 4000 (it reads the term blocks) and
    at most SEMANTIC_EXACT_MAX_CHUNKS: the semantic list is the exact filtered top k, in
    order, where the graph walk would lose some of it. The lexical list is exact too (the
    unfiltered ranking restricted to the filter)."""
    with psycopg.connect(app_url) as conn:
        t = _broad_tenant(conn, 520)
        f = Jsonb({"tags": "wide"})
        with tenant_transaction(conn, t):
            n = conn.execute("select count(*) from kb.chunks where doc_id = any ((select kb.search_filter_docs(%s))::uuid[])",
                             [f]).fetchone()[0]
            assert 4000 < n <= knn.SEMANTIC_EXACT_MAX_CHUNKS
            assert conn.execute("select count(*) from kb.term_blocks").fetchone()[0] > 0
            wide = {r[0] for r in conn.execute("select unnest(kb.search_filter_docs(%s))", [f])}
            for i in range(8):
                q = " ".join(WORDS[(i * 7 + j) % 40] for j in range(1 + i % 3))
                got = [r[0] for r in conn.execute("select doc_id from kb.search_lexical_ids(%s, 20, 1.2, 0.75, %s)",
                                                  [q, f])]
                deep = [r[0] for r in conn.execute("select doc_id from kb.search_lexical_ids(%s, 1000)", [q])
                        if r[0] in wide]
                assert got == deep[:20] and len(got) == 20, q
                v = conn.execute("select embedding from kb.chunks offset %s limit 1", [i * 97]).fetchone()[0]
                for k in (10, 120):
                    sem = [r[0] for r in conn.execute("select chunk_id from kb.search_semantic_ids(%s, %s, %s)",
                                                      [v, k, f])]
                    assert sem == _exact(conn, f, v, k) and len(sem) == k


def _explained(owner_url, t, v, f, k, *, sort=True, index_only=False):
    """kb.search_semantic_ids(v, k, f) called as kb_app in tenant t, with auto_explain of its
    nested statements: (chunk ids, the plans' text, the exact filtered top k)."""
    plans: list[str] = []
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: plans.append(d.message_primary or ""))
        conn.execute("load 'auto_explain'")
        for s in ("auto_explain.log_min_duration = 0", "auto_explain.log_nested_statements = on",
                  "auto_explain.log_level = notice", "client_min_messages = notice"):
            conn.execute("set " + s)
        conn.execute("set role kb_app")
        with conn.transaction():
            conn.execute("select set_config('auth.tenant_id', %s, true)", [str(t)])
            if not sort:
                conn.execute("set local enable_sort = off")
            if index_only:  # the heap's own ways to read the chunks turned off
                for g in ("enable_seqscan", "enable_bitmapscan"):
                    conn.execute(f"set local {g} = off")
            sem = [r[0] for r in conn.execute("select chunk_id from kb.search_semantic_ids(%s, %s, %s)", [v, k, f])]
            conn.execute("reset client_min_messages")
            exact = _exact(conn, f, v, k)
    return sem, "\n".join(plans), exact


def test_the_exact_semantic_list_reads_the_vectors_from_the_covering_index(app_url, owner_url):
    """The exact search over a filter's chunks reads (chunk_id, embedding) from the covering
    index chunks_tenant_doc_vectors_idx, an index-only scan with no heap visit or TOAST read a
    chunk, where the table is all-visible as autovacuum keeps it (auto_explain of the definer's
    nested statement, called as kb_app), and its list is the exact filtered top k.
    The planner's all-visible fraction is set from the table's pages for the call and put back
    after it: a vacuum here cannot always set the visibility map (a transaction elsewhere on
    the server may hold the horizon back), and without it the planner costs the index-only scan
    as an index scan with heap visits."""
    with psycopg.connect(app_url) as conn:
        t = _broad_tenant(conn, 520)
        with tenant_transaction(conn, t):
            v = conn.execute("select embedding from kb.chunks offset 101 limit 1").fetchone()[0]
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("vacuum analyze kb.chunks")
        pages, visible = conn.execute("select relpages, relallvisible from pg_class"
                                      " where oid = 'kb.chunks'::regclass").fetchone()
        stats = "select pg_restore_relation_stats('schemaname', 'kb', 'relname', 'chunks', 'relallvisible', %s::integer)"
        conn.execute(stats, [pages])
        try:
            sem, text, exact = _explained(owner_url, t, v, Jsonb({"tags": "wide"}), 60, index_only=True)
        finally:
            conn.execute(stats, [visible])
    assert sem == exact and len(sem) == 60
    assert "Index Only Scan using chunks_tenant_doc_vectors_idx" in text, text[-3000:]


def test_the_exact_search_counts_its_own_candidates_where_the_statistics_expect_few(app_url, owner_url):
    """Where the planner's statistics put the filter's chunks (documents x chunks per
    document) under SEMANTIC_EXACT_MAX_CHUNKS, the exact search runs first and counts its own
    candidates: no separate count statement, and the list is the exact filtered top k, the
    same as where the statistics are missing and the count runs first."""
    with psycopg.connect(app_url) as conn:
        t = _broad_tenant(conn, 60)
        with tenant_transaction(conn, t):
            v = conn.execute("select embedding from kb.chunks offset 33 limit 1").fetchone()[0]
    f = Jsonb({"tags": "wide"})
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("vacuum analyze kb.chunks, kb.documents")
    for k in (10, 60):
        sem, text, exact = _explained(owner_url, t, v, f, k)
        assert sem == exact and len(sem) == k
        assert "CTE cand" in text and "select 1 from kb.chunks" not in text, text[-3000:]
    # no statistics: the count first, then the exact search; the same list
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute("update pg_class set reltuples = -1 where oid = 'kb.documents'::regclass")
    try:
        sem, text, exact = _explained(owner_url, t, v, f, 60)
    finally:
        with psycopg.connect(owner_url, autocommit=True) as conn:
            conn.execute("analyze kb.documents")
    assert "CTE cand" not in text and "select 1 from kb.chunks" in text, text[-3000:]
    assert sem == exact and len(sem) == 60


@pytest.mark.slow
def test_a_broad_filter_walks_the_graph_and_stays_within_it(app_url, owner_url):
    """More than SEMANTIC_EXACT_MAX_CHUNKS chunks in the filter: the semantic list walks the
    HNSW graph (iterative scan), stays within the filter, is k deep and keeps recall against
    the exact filtered search (bench/results/semantic-exact-threshold.md measures it at scale)."""
    docs = knn.SEMANTIC_EXACT_MAX_CHUNKS // 8 + 100  # 8 chunks of every 10 are tagged "wide"
    with psycopg.connect(app_url) as conn:
        t = _broad_tenant(conn, docs)
        f = Jsonb({"tags": "wide"})
        # the exact search tried first and given up: statistics that put too few chunks in the
        # filter (documents with no chunks, in a tenant of their own), then the graph walk
        empty = uuid.uuid4()
        with tenant_transaction(conn, empty):
            conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                         " select kb.current_tenant(), 'e' || i, '', repeat('0', 64) from generate_series(1, %s) i",
                         [docs * 20])
        conn.commit()
        with psycopg.connect(owner_url, autocommit=True) as own:
            own.execute("vacuum analyze kb.chunks, kb.documents")
        with tenant_transaction(conn, t):
            v = conn.execute("select embedding from kb.chunks where tenant_id = %s offset 5 limit 1", [t]).fetchone()[0]
        sem, text, exact = _explained(owner_url, t, v, f, 120, sort=False)
        assert "CTE cand" in text and "Index Scan using chunks_embedding_hnsw_idx" in text, text[-3000:]
        # one query's recall swings with the graph's build (measured below over eight queries)
        assert len(sem) == 120 and len(set(sem)) == 120
        with tenant_transaction(conn, t):
            # this small tenant among the session's others: the planner may prefer the
            # (tenant_id, doc_id) index and a sort (exact); without a sort it walks the graph
            conn.execute("set local enable_sort = off")
            n = conn.execute("select count(*) from kb.chunks where doc_id = any ((select kb.search_filter_docs(%s))::uuid[])",
                             [f]).fetchone()[0]
            assert n > knn.SEMANTIC_EXACT_MAX_CHUNKS  # the graph, not the exact search
            wide = {r[0] for r in conn.execute("select unnest(kb.search_filter_docs(%s))", [f])}
            recalls = []
            for i in range(8):
                v = conn.execute("select embedding from kb.chunks where tenant_id = %s offset %s limit 1",
                                 [t, i * 97]).fetchone()[0]
                # 120 deep (the service's semantic list), within a filter of 8 chunks in 10
                sem = [r[0] for r in conn.execute("select chunk_id from kb.search_semantic_ids(%s, 120, %s)", [v, f])]
                assert len(sem) == 120
                assert {r[0] for r in conn.execute("select doc_id from kb.chunks where chunk_id = any (%s)",
                                                   [sem])} <= wide
                recalls.append(len(set(sem) & set(_exact(conn, f, v, 120))) / 120)
            # on this tenant's vectors (a curve plus noise) about one walk in 150 ends far from
            # its query (recall near 0, seen at ef_search 100 and 200 alike, the same graph and
            # query giving 1.0 on another call): 7 of the 8 at 0.9 or more
            assert sum(r >= 0.9 for r in recalls) >= 7, recalls


def test_the_curated_list_keeps_the_filter_documents(corpus, app_conn):
    """manual_curation: a filter keeps the curated chunks of its documents, in curated order."""
    from kb_rerank.core.session import AwaitedConnection, run_awaited

    qh = uuid.uuid4().hex * 2  # this test's own curated list
    with tenant_transaction(app_conn, corpus["a"]):
        chunks = app_conn.execute("select c.chunk_id, d.source_uri from kb.chunks c join kb.documents d"
                                  " on d.doc_id = c.doc_id order by d.source_uri").fetchall()
        for pos, (chunk, _) in enumerate(chunks):
            app_conn.execute("insert into kb.kb_rerank_curation (tenant_id, query_hash, position, chunk_id)"
                             " values (kb.current_tenant(), %s, %s, %s)", [qh, pos, chunk])
        aconn = AwaitedConnection(app_conn)
        every = run_awaited(search.acurated(aconn, qh, 10))
        billing = run_awaited(search.acurated(aconn, qh, 10, filter={"product": "billing"}))
    assert [c.chunk_id for c in every] == [c for c, _ in chunks]
    assert [c.chunk_id for c in billing] == [c for c, uri in chunks if uri.startswith("billing-")]


def test_metadata_keeps_scalars_and_short_lists_only():
    from datetime import date

    from kb_rerank.ingest.loader import document_metadata

    assert document_metadata({
        "nested": {"a": 1}, "long": "x" * 257, "many": list(range(101)), "mixed": ["a", {"b": 1}],
        "bad key": 1, "title": "t", "language": "en", "authority": 2, "source_path": "x", "updated_at": "2024-01-01",
        "nan": float("nan"), "nul": "a\x00b",
    }) == {}
    assert document_metadata({"ok": "x" * 256, "n": 3, "d": date(2024, 5, 1), "l": [1, "a", True]}) == {
        "ok": "x" * 256, "n": 3, "d": "2024-05-01", "l": [1, "a", True]}
