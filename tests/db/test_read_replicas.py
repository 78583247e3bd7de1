"""Reads on a hot standby, against a real streaming replica of the test
server made with the embedded server's pg_basebackup -R (kb_rerank.testing.standby).

The app gets KB_READ_DATABASE_URL; candidate retrieval runs there, everything else on the
primary. Each search records, through a spy on the retrieval step's connection, whether the
server that ran it is in recovery (pg_is_in_recovery()), so the tests see where reads went."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from kb_rerank.db import database as db
from kb_rerank.app import create_app
from kb_rerank.ingest.loader import ingest_paths
from kb_rerank.retrieval import spec as retrieval
from kb_rerank.testing import standby as sb

from tests.live_server import OPS, OPS_TOKEN, SECRET, FakeReranker, bearer, ingest_small_tenant, serve_in_thread

URL = "/v1/kb/search/rerank"


@pytest.fixture(scope="module")
def standby(server_url):
    if sb.local_socket(server_url) is None:
        pytest.skip("read-replica tests need the embedded server (a primary on a local socket) to copy")
    folder = Path(tempfile.mkdtemp(prefix="kbsb-", dir="/tmp"))
    s = sb.make_standby(server_url, folder)
    yield s
    s.destroy()
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def where(monkeypatch):
    """Records pg_is_in_recovery() of the connection each search ran on."""
    seen: list[bool] = []
    inner = retrieval.RetrievalSpec.fetch

    async def spy(self, conn, *args, **kw):
        cur = await conn.execute("select pg_is_in_recovery()")
        seen.append((await cur.fetchone())[0])
        return await inner(self, conn, *args, **kw)

    monkeypatch.setattr(retrieval.RetrievalSpec, "fetch", spy)
    return seen


@contextlib.contextmanager
def served(settings, standby, embedder, **changes):
    read_url = standby.url(settings.database_url)
    changes = {"replica_check_interval_s": 0.2, "max_replica_lag_s": 2.0, **changes}
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, read_database_url=read_url, **changes),
                     reranker=FakeReranker(), embedder=embedder)
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield app, client


def ask(client, tenant, query):
    r = client.post(URL, json={"query": query, "source": "lexical_only"}, headers=bearer(tenant))
    assert r.status_code == 200, r.text
    return r.json()


def wait_until(cond, timeout_s: float, step: float = 0.05) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"not within {timeout_s} s")
        time.sleep(step)
    return time.monotonic() - t0


def readyz(client):
    r = client.get("/readyz", headers=OPS)
    assert r.status_code == 200, r.text
    return r.json()["reads"]


def new_tenant(settings, embedder, tmp_path, flavour):
    tenant = uuid.uuid4()
    with psycopg.connect(db.app_url(settings), autocommit=True) as conn:
        ingest_small_tenant(conn, tenant, embedder, settings, tmp_path, flavour=flavour)
    return tenant


def add_document(settings, embedder, tenant, folder: Path, name: str, text: str) -> None:
    """One new document for ``tenant``, ingested on the primary."""
    folder.mkdir()
    (folder / f"{name}.md").write_text(text, encoding="utf-8")
    with psycopg.connect(db.app_url(settings), autocommit=True) as conn:
        assert ingest_paths(conn, tenant, [folder], embedder, settings).added == 1


def test_searches_run_on_the_standby_under_the_tenants_rls(settings, standby, embedder, tmp_path, where):
    tenant = new_tenant(settings, embedder, tmp_path, "zebrafish")
    other = new_tenant(settings, embedder, tmp_path / "o", "quokka")
    sb.wait_for_replay(settings.database_url, standby.url(settings.database_url))
    with served(settings, standby, embedder) as (app, client):
        wait_until(lambda: readyz(client)["reads"] == "replica", 10)
        body = ask(client, tenant, "ERR_402 zebrafish")
        assert where and all(where), "the search ran on a server not in recovery"
        # (the fake reranker orders by a hash: the ERR_402 chunk is among the results)
        assert any("ERR_402" in r["snippet"] for r in body["results"])
        # RLS and the tenant setting hold on the standby: the other tenant's word finds nothing
        assert ask(client, tenant, "quokka")["results"] == []
        assert ask(client, other, "quokka")["results"]
        # cache and audit went to the primary: the second ask is a hit, and both are audited
        assert ask(client, tenant, "ERR_402 zebrafish")["from_cache"] is True
        info = readyz(client)
        assert info["standbys"][0]["healthy"] is True and info["standbys"][0]["lag_s"] <= 2.0
    with psycopg.connect(settings.database_url) as conn:
        kinds = conn.execute("select kind, count(*) from kb.kb_rerank_audit where tenant_id = %s group by kind",
                             [tenant]).fetchall()
    assert dict(kinds).get("cache_hit") == 1


def test_a_document_ingested_on_the_primary_is_found_on_the_standby(settings, standby, embedder, tmp_path, where):
    tenant = new_tenant(settings, embedder, tmp_path, "narwhal")
    with served(settings, standby, embedder) as (app, client):
        wait_until(lambda: readyz(client)["reads"] == "replica", 10)
        assert ask(client, tenant, "okapi")["results"] == []
        add_document(settings, embedder, tenant, tmp_path / "more", "okapi", "# Okapi\n\nThe okapi lives in the Ituri rainforest.\n")
        sb.wait_for_replay(settings.database_url, standby.url(settings.database_url))
        body = ask(client, tenant, "okapi")
        assert body["results"] and where[-1] is True


def test_a_standby_stopped_mid_load_costs_no_request_and_reads_come_back(settings, standby, embedder, tmp_path,
                                                                          where):
    tenant = new_tenant(settings, embedder, tmp_path, "wombat")
    sb.wait_for_replay(settings.database_url, standby.url(settings.database_url))
    queries = [f"ERR_402 wombat {i}" for i in range(400)]
    with served(settings, standby, embedder) as (app, client):
        wait_until(lambda: readyz(client)["reads"] == "replica", 10)
        # four clients send distinct queries (every one a miss) while the standby is stopped
        statuses: list[int] = []
        todo = iter(queries[:300])
        lock = threading.Lock()

        def client_loop():
            with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
                while True:
                    with lock:
                        q = next(todo, None)
                    if q is None or len(statuses) >= 80:
                        return
                    r = c.post(URL, json={"query": q, "source": "lexical_only"}, headers=bearer(tenant))
                    with lock:
                        statuses.append(r.status_code)

        threads = [threading.Thread(target=client_loop) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: len(statuses) >= 20, 60)
        standby.stop("immediate")  # the server goes away under open connections and running reads
        stopped = time.monotonic()
        for t in threads:
            t.join(120)
        assert len(statuses) >= 80 and set(statuses) == {200}, "a client saw the standby's failure"
        assert True in where  # some of the load did run on the standby before it stopped
        # reads are on the primary within 5 s of the stop, and /readyz says so
        wait_until(lambda: readyz(client)["reads"] == "primary", max(0.1, 5 - (time.monotonic() - stopped)))
        where.clear()
        ask(client, tenant, queries[300])
        assert where == [False]
        assert readyz(client)["standbys"][0]["healthy"] is False
        # back on the standby once it returns and has caught up
        standby.start()
        wait_until(lambda: readyz(client)["reads"] == "replica", 30)
        where.clear()
        ask(client, tenant, queries[301])
        assert where == [True]


def test_a_standby_behind_by_more_than_the_allowed_lag_serves_no_reads(settings, standby, embedder, tmp_path,
                                                                        where):
    """Replay paused on the standby while the primary writes: once it is more than
    KB_MAX_REPLICA_LAG_S behind, reads go to the primary (and find the new rows); replay
    resumed, reads return to the standby."""
    tenant = new_tenant(settings, embedder, tmp_path, "axolotl")
    owner_standby = standby.url(settings.database_url)
    sb.wait_for_replay(settings.database_url, owner_standby)
    with served(settings, standby, embedder, max_replica_lag_s=1.0) as (app, client), \
            psycopg.connect(owner_standby, autocommit=True) as sconn:
        wait_until(lambda: readyz(client)["reads"] == "replica", 10)
        sconn.execute("select pg_wal_replay_pause()")
        try:
            started = time.monotonic()  # before the write: a write slowed down by load cannot hide the wait
            add_document(settings, embedder, tenant, tmp_path / "late", "tapir", "# Tapir\n\nThe tapir browses at night.\n")
            wait_until(lambda: readyz(client)["reads"] == "primary", 10)
            assert time.monotonic() - started >= 0.5  # not at once: it was within the allowed lag at first
            assert readyz(client)["standbys"][0]["lag_s"] > 1.0
            where.clear()
            assert ask(client, tenant, "tapir")["results"]  # the primary has the new document
            assert where == [False]
        finally:
            sconn.execute("select pg_wal_replay_resume()")
        wait_until(lambda: readyz(client)["reads"] == "replica", 10)
        where.clear()
        assert ask(client, tenant, "tapir night")["results"]
        assert where == [True]


def test_a_standby_within_the_lag_but_behind_the_tenants_generation_is_not_read(settings, standby, embedder,
                                                                                  tmp_path, where):
    """The cache key carries the tenant's generation read on the primary: a standby that has
    not replayed that generation yet would put an older knowledge base's answer under the new
    key. Such a read runs on the primary (the standby stays in service for others)."""
    tenant = new_tenant(settings, embedder, tmp_path, "pangolin")
    owner_standby = standby.url(settings.database_url)
    sb.wait_for_replay(settings.database_url, owner_standby)
    with served(settings, standby, embedder, max_replica_lag_s=60.0) as (app, client), \
            psycopg.connect(owner_standby, autocommit=True) as sconn:
        wait_until(lambda: readyz(client)["reads"] == "replica", 10)
        sconn.execute("select pg_wal_replay_pause()")
        try:
            add_document(settings, embedder, tenant, tmp_path / "late", "kiwi", "# Kiwi\n\nThe kiwi cannot fly.\n")
            where.clear()
            body = ask(client, tenant, "kiwi")
            assert body["results"] and where == [False]
            assert readyz(client)["reads"] == "replica"  # still in service: only 60 s allowed
        finally:
            sconn.execute("select pg_wal_replay_resume()")
        sb.wait_for_replay(settings.database_url, owner_standby)
        where.clear()
        assert ask(client, tenant, "kiwi flying")["results"]
        assert where == [True]
