"""Helpers for the reliability tests (plain functions, no fixtures): a real HTTP server for
an app (uvicorn in a thread of this process, or ``kb-rerank serve`` as a child process),
small tenants with real ingested text, fake rerankers, and database probes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator

import httpx
import psycopg

from kb_rerank.http.auth import JwtConfig, mint_token

SECRET = "kb-rerank-test-secret-0123456789abcdef"
URL = "/v1/kb/search/rerank"
JWT = JwtConfig(secret=SECRET)
# KB_OPS_TOKEN of the test servers: /metrics and the detail of /readyz need it
OPS_TOKEN = "kb-rerank-test-ops-token-fedcba9876543210"
OPS = {"Authorization": "Bearer " + OPS_TOKEN}

TOPICS = [
    ("Billing and invoices", "Invoices are created from the billing page. A recurring invoice repeats every month "
     "and can be paused. Credit notes cancel part of an invoice. Payment reminders are sent three days "
     "before the due date."),
    ("Exporting data", "Reports can be exported to CSV or JSON from the reports page. Large exports run in the "
     "background and a download link is sent by email when the export is ready."),
    ("Account security", "Two-factor authentication protects the account. Administrators can require it for "
     "every member of the workspace. Lost recovery codes can be replaced from the security settings."),
    ("Workspace ownership", "The owner of a workspace can transfer ownership to another administrator. The "
     "previous owner becomes an administrator after the transfer is confirmed by email."),
    ("Error codes", "ERR_402 means the payment is required before the action can run. ERR_429 means too many "
     "requests were sent in a short time; wait and retry later."),
]


def bearer(tenant) -> dict[str, str]:
    return {"Authorization": "Bearer " + mint_token(tenant, JWT)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ingest_small_tenant(conn, tenant, embedder, settings, tmp: Path, flavour: str = "") -> int:
    """Ingest the TOPICS (with a tenant-specific ``flavour`` word) as real documents."""
    from kb_rerank.ingest.loader import ingest_paths

    folder = tmp / f"docs-{tenant}"
    folder.mkdir(parents=True, exist_ok=True)
    for i, (title, text) in enumerate(TOPICS):
        (folder / f"doc{i}.md").write_text(f"# {title} {flavour}\n\n{text}\n\n{flavour} {text}\n", encoding="utf-8")
    report = ingest_paths(conn, tenant, [folder], embedder, settings)
    assert report.added > 0 and not report.bad_files, report.summary()
    return report.added


class FakeReranker:
    """A ready model: deterministic scores in 0..1 from a hash of the passage, after
    ``delay_s`` (asyncio sleep, so the event loop keeps serving)."""

    model_name = "fake-reranker"
    ready = True

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.calls = 0

    async def ascore(self, query, passages):
        self.calls += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return [int(hashlib.sha256(p.encode()).hexdigest()[:6], 16) / 0xFFFFFF for p in passages]

    async def ensure_loaded_async(self):
        return True


# --------------------------------------------------------------------------- servers


@contextlib.contextmanager
def serve_in_thread(app, *, startup_timeout: float = 60.0) -> Iterator[str]:
    """Run ``app`` with uvicorn on a free loopback port in a thread; yield its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on", timeout_graceful_shutdown=5))

    def on_loop(loop) -> None:
        app.state.test_server_loop = loop  # for tests that schedule coroutines on the app's loop

    with run_server(server, startup_timeout=startup_timeout, on_loop=on_loop):
        yield f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def run_server(server, *, startup_timeout: float = 60.0, on_loop=None, stop_timeout: float = 30.0) -> Iterator[None]:
    """``server`` (a uvicorn.Server) on an event loop of its own in a thread, until the block ends."""
    def run() -> None:
        loop = asyncio.new_event_loop()
        if on_loop is not None:
            on_loop(loop)
        try:
            loop.run_until_complete(server.serve())
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield
    finally:
        server.should_exit = True
        thread.join(stop_timeout)


def server_keys_env() -> dict[str, str]:
    """KB_AUDIT_KEY and KB_QUERY_HASH_KEY for a server process (`serve` requires them when it is
    given the app role's URL): the keys the in-process test apps use (kb_rerank.core.keys' default
    files), so tests can compute the hashes the server stores."""
    from kb_rerank.core import keys
    from kb_rerank.core.settings import Settings

    s = Settings()
    return {"KB_AUDIT_KEY": keys.server_key(s, "audit", None).decode(),
            "KB_QUERY_HASH_KEY": keys.server_key(s, "query_hash", None).decode()}


@contextlib.contextmanager
def serve_process(env: dict[str, str], log_path: Path, *, startup_timeout: float = 90.0,
                  args: tuple[str, ...] = ()) -> Iterator[tuple[str, subprocess.Popen]]:
    """``kb-rerank serve [args]`` in a child process (its logs, JSON lines unless
    ``--log-format text``, at INFO, to ``log_path``); wait until /readyz is 200 with the
    model loaded; yield (base URL, process)."""
    port = free_port()
    code = ("import sys; from kb_rerank.cli.main import main; "
            f"sys.exit(main(['serve', '--host', '127.0.0.1', '--port', '{port}', *{list(args)!r}]))")
    full_env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
                "KB_OPS_TOKEN": OPS_TOKEN, **server_keys_env(), **env}
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, "-c", code], env=full_env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    last = None
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited {proc.returncode}: {log_path.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not ready: {last} {log_path.read_text()[-2000:]}")
            try:
                r = httpx.get(base + "/readyz", timeout=2, headers={"Authorization": "Bearer " + full_env["KB_OPS_TOKEN"]})
                last = r.text
                if r.status_code == 200 and r.json()["model"]["ready"]:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        yield base, proc
    finally:
        stop(proc)
        log.close()


def stop(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    """End a child server: SIGTERM, then SIGKILL after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


# --------------------------------------------------------------------------- probes


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text -> {sample name with labels: value}, plus per-name sums under the bare name."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def busy_app_backends(owner_conn: psycopg.Connection, dbname: str) -> list[tuple]:
    """kb_app backends of ``dbname`` that are not idle (busy or stuck in a transaction)."""
    return owner_conn.execute(
        "select pid, state, left(query, 80) from pg_stat_activity"
        " where datname = %s and usename = 'kb_app' and state is distinct from 'idle'",
        [dbname],
    ).fetchall()


def advisory_locks(owner_conn: psycopg.Connection, dbname: str) -> list[tuple]:
    return owner_conn.execute(
        "select l.pid, l.mode, l.granted from pg_locks l join pg_database d on d.oid = l.database"
        " where l.locktype = 'advisory' and d.datname = %s",
        [dbname],
    ).fetchall()


def wait_until(predicate, timeout: float = 5.0, interval: float = 0.05):
    """Poll ``predicate`` until it returns a truthy value (returned) or ``timeout`` passes (last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(interval)


def new_tenant() -> uuid.UUID:
    return uuid.uuid4()
