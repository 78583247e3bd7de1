"""Reading and applying the SQL files shipped in the package: the versioned files and the idempotent layer.

The frozen Alembic revisions import `kb_rerank.sqlfiles`, which stays and calls this module.

db/schema/NNNN_*.sql are versioned: each is run once by its Alembic revision and never
changes once shipped (their hashes are frozen in db/migrations/frozen.sha256, checked by
tests/db/test_migrations.py). Migrations are forward-only: a revision's downgrade raises,
and a database is taken back by restoring a backup (docs/operations.md).
The idempotent layer (functions, grants, policies, views) sits beside the capability that
owns it, in <capability>/sql/*.sql; db/layer.txt lists its files in the order they are
applied, once at the end of every upgrade that reaches head (db/migrations/env.py); no
revision applies them in the middle of an upgrade. With the default app role, db/roles/adopt_app_role.sql
runs first (a database the former default role served is adopted under the new name). The layer carries a version, the
hash of its rendered files, that ``kb.schema_layer_version()`` returns and /readyz checks.

Placeholders, filled by :func:`render` in every file: ``{{embedding_dim}}`` (the embedder's
dimension), ``{{app_role}}`` (the service's role, KB_APP_ROLE, as a quoted identifier;
migrations get both from ``config.attributes``: ``kb_embedding_dim``, ``kb_app_role``) and
the search filter's limits and patterns (``{{filter_*}}``: the Python grammar's constants,
:func:`kb_rerank.filters.grammar.sql_constants`), the semantic list's choice of path
(``{{semantic_exact_max_chunks}}``: :mod:`kb_rerank.core.knn`), and
``{{default:NAME}}`` (the declared default of the setting NAME, as a SQL literal: the search
functions' parameter defaults, so a SQL caller ranks as the service does with its defaults).

The files are read with importlib.resources, so an installed wheel finds them as well as a
checkout does.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from importlib.resources.abc import Traversable

from kb_rerank.core import settings
from kb_rerank.core.settings import APP_ROLE_PATTERN, DEFAULT_APP_ROLE, ROLE_NAME_RULE

# The layer's files in the order applied, one path a line relative to the package.
MANIFEST = "db/layer.txt"


def package_dir() -> Traversable:
    return resources.files("kb_rerank")


def app_role_sql(app_role: str) -> str:
    """The app role as SQL: a quoted identifier (the name is checked to need no escaping)."""
    if not isinstance(app_role, str) or not APP_ROLE_PATTERN.fullmatch(app_role):
        raise ValueError(f"app_role must match {ROLE_NAME_RULE}, got {app_role!r}")
    return f'"{app_role}"'


_SETTING_DEFAULT = re.compile(r"\{\{default:([a-z0-9_]+)\}\}")


def sql_literal(value: object) -> str:
    """A setting's default as a SQL literal (numbers as Python writes them: repr round-trips)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {value!r}")


def render(path: Traversable, *, embedding_dim: int, app_role: str = DEFAULT_APP_ROLE) -> str:
    """A file's SQL with its placeholders filled: ``{{embedding_dim}}`` (an integer),
    ``{{app_role}}`` (the service's role, KB_APP_ROLE, as a quoted identifier), the search
    filter's ``{{filter_*}}`` constants and ``{{default:NAME}}`` (setting NAME's declared
    default, as a SQL literal)."""
    if not isinstance(embedding_dim, int) or isinstance(embedding_dim, bool) or not 0 < embedding_dim <= 16000:
        raise ValueError(f"embedding_dim must be an integer in 1..16000, got {embedding_dim!r}")
    from kb_rerank.filters.grammar import sql_constants

    role = app_role_sql(app_role)
    text = (path.read_text(encoding="utf-8").replace("{{embedding_dim}}", str(embedding_dim))
            .replace("{{app_role}}", role))
    if "{{filter_" in text:
        for name, value in sql_constants().items():
            text = text.replace(name, value)
    if "{{semantic_" in text:
        from kb_rerank.core.knn import sql_constants as knn_constants

        for name, value in knn_constants().items():
            text = text.replace(name, value)
    return _SETTING_DEFAULT.sub(lambda m: sql_literal(settings.default(m.group(1))), text)


FORWARD_ONLY = ("migrations are forward-only: a database is taken back by restoring the backup made before"
                " the upgrade (docs/operations.md, \"Upgrades\")")


def versioned_file(name: str) -> Traversable:
    if name.endswith(".down.sql"):
        # the frozen revisions' downgrade() names their former down files
        raise RuntimeError(FORWARD_ONLY)
    path = package_dir() / "db" / "schema" / name
    if not path.is_file():
        raise FileNotFoundError(f"db/schema/{name}")
    return path


def manifest() -> list[str]:
    """The layer's paths (relative to the package) from db/layer.txt, in the order applied."""
    text = (package_dir() / MANIFEST).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def idempotent_files() -> list[tuple[str, Traversable]]:
    """(path relative to the package, file) of every idempotent file, in the order applied."""
    files: list[tuple[str, Traversable]] = []
    for rel in manifest():
        path = package_dir().joinpath(*rel.split("/"))
        if not path.is_file():
            raise FileNotFoundError(f"{MANIFEST} lists {rel}, which is not in the package")
        files.append((rel, path))
    return files


def execute_script(dbapi_conn, text: str) -> None:
    """Run a multi-statement script on a raw psycopg connection (no parameters, so no
    placeholder parsing: `%` and `:` in the SQL are left alone)."""
    dbapi_conn.execute(text)


def apply_versioned(dbapi_conn, name: str, *, embedding_dim: int, app_role: str = DEFAULT_APP_ROLE) -> None:
    execute_script(dbapi_conn, render(versioned_file(name), embedding_dim=embedding_dim, app_role=app_role))


def run_versioned(files: tuple[str, ...]) -> None:
    """Apply versioned files from inside an Alembic revision's upgrade(),
    on the migration's connection, with the embedding dimension and app role the run was given. In
    offline mode (`kb-rerank migrate --sql`) the rendered files are written to the output
    instead, as they would run."""
    from alembic import context, op

    dim = context.config.attributes["kb_embedding_dim"]
    role = context.config.attributes.get("kb_app_role") or DEFAULT_APP_ROLE
    if context.is_offline_mode():
        for name in files:
            emit_script(f"db/schema/{name}", render(versioned_file(name), embedding_dim=dim, app_role=role))
        return
    raw = op.get_bind().connection.driver_connection
    for name in files:
        apply_versioned(raw, name, embedding_dim=dim, app_role=role)


def emit_script(label: str, text: str) -> None:
    """Offline mode: write one file's SQL to Alembic's output, verbatim (no bind-parameter
    parsing, so `:` and `%` are left alone), headed by its path."""
    from alembic import context

    context.get_context().impl.static_output(f"-- ===== {label}\n{text.rstrip()}")


def emit_idempotent(*, embedding_dim: int, app_role: str = DEFAULT_APP_ROLE) -> str:
    """Offline mode: write the idempotent layer and its version function as apply_idempotent
    would run them; return the layer version."""
    for rel in adopt_steps(app_role):
        emit_script(rel, render(package_dir().joinpath(*rel.split("/")), embedding_dim=embedding_dim, app_role=app_role))
    for rel, path in idempotent_files():
        emit_script(rel, render(path, embedding_dim=embedding_dim, app_role=app_role))
    version = layer_version(embedding_dim=embedding_dim, app_role=app_role)
    emit_script("kb.schema_layer_version()", _layer_version_sql(version, app_role))
    return version


def layer_version(*, embedding_dim: int, app_role: str = DEFAULT_APP_ROLE) -> str:
    """SHA-256 over the idempotent files as applied (relative path and rendered text): the
    embedding dimension and the app role are part of it, so /readyz of a service configured
    with another KB_APP_ROLE than the database was migrated with reports a layer mismatch."""
    h = hashlib.sha256()
    for rel, path in idempotent_files():
        h.update(rel.encode() + b"\0"
                 + render(path, embedding_dim=embedding_dim, app_role=app_role).encode("utf-8") + b"\0")
    return h.hexdigest()


# Written after the idempotent files, in the same transaction: the function's body is the
# version of the layer just applied. SECURITY INVOKER; /readyz calls it as the app role.
_LAYER_VERSION_SQL = """
create or replace function kb.schema_layer_version()
returns text
language sql
immutable
parallel safe
security invoker
set search_path = pg_catalog, pg_temp
as $$ select '{version}'::text $$;
comment on function kb.schema_layer_version() is
  'SHA-256 of the idempotent SQL layer (functions, policies, views) applied by the last upgrade to head';
revoke execute on function kb.schema_layer_version() from public;
grant execute on function kb.schema_layer_version() to {app_role};
"""


def _layer_version_sql(version: str, app_role: str) -> str:
    return _LAYER_VERSION_SQL.format(version=version, app_role=app_role_sql(app_role))


# Before the layer, with the default app role: a database the former default role served is
# adopted under the new name (db/roles/adopt_app_role.sql says when, and when it refuses).
ADOPT_APP_ROLE = "db/roles/adopt_app_role.sql"


def adopt_steps(app_role: str) -> list[str]:
    """The files run before the layer for ``app_role`` (relative to the package)."""
    return [ADOPT_APP_ROLE] if app_role == DEFAULT_APP_ROLE else []


def apply_idempotent(dbapi_conn, *, embedding_dim: int, app_role: str = DEFAULT_APP_ROLE) -> str:
    """Apply every idempotent file, then record the layer's version; return it."""
    import psycopg

    for rel in adopt_steps(app_role):
        try:
            execute_script(dbapi_conn, render(package_dir().joinpath(*rel.split("/")), embedding_dim=embedding_dim, app_role=app_role))
        except psycopg.errors.RaiseException as exc:
            raise RuntimeError(exc.diag.message_primary or str(exc)) from None
    # The role is created, and given CONNECT on this database, by 0016_app_role (run before
    # the layer in the same transaction). A database past 0016 keeps the role it was migrated
    # with: a different KB_APP_ROLE later would grant the layer to a role that cannot connect
    # while the old one kept its grants, so it is refused.
    ok = dbapi_conn.execute(
        "select case when to_regrole(%s) is null then false"
        " else has_database_privilege(%s, current_database(), 'CONNECT') end",
        [app_role_sql(app_role), app_role]).fetchone()[0]
    if not ok:
        raise RuntimeError(
            f"KB_APP_ROLE={app_role}: the role does not exist or may not connect to this database; migration"
            " 0016_app_role creates the app role and grants it CONNECT when a database reaches it, and a database"
            " past it keeps the role it was migrated with (docs/operations.md, \"Two databases on one cluster\")")
    for rel, path in idempotent_files():
        try:
            execute_script(dbapi_conn, render(path, embedding_dim=embedding_dim, app_role=app_role))
        except Exception as exc:
            raise RuntimeError(f"applying {rel} failed: {exc}") from exc
    version = layer_version(embedding_dim=embedding_dim, app_role=app_role)
    execute_script(dbapi_conn, _layer_version_sql(version, app_role))
    return version


def applied_layer_version(dbapi_conn) -> str | None:
    """The layer version recorded in the database, or None when none is (a database
    migrated before the layer carried a version, or not migrated):
    :func:`kb_rerank.db.schema_state.layer_version`, the one read of it (/readyz too)."""
    from kb_rerank.db.schema_state import layer_version

    return layer_version(dbapi_conn)
