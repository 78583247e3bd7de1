"""SQL access for one tenant (`kb-rerank sql-access`): a login role of its own, member of the
group role ``kb_sql_reader`` (read-only grants, under RLS), mapped in ``kb.sql_access`` to the
one tenant that ``kb.current_tenant()`` returns for it, whatever the session sets
``auth.tenant_id`` to (db/sql/current_tenant.sql).

Run with the owner URL (like ``kb-rerank migrate``): creating roles needs CREATEROLE or a
superuser, and kb.sql_access is written by the owner only. Every statement is parameterised
or built with :mod:`psycopg.sql` identifiers and literals.

What keeps a mapped role to its tenant:
* the mapping is keyed on ``session_user``, which neither SET ROLE nor a definer changes;
* a mapped role is a member of ``kb_sql_reader`` and of nothing else (an existing role with
  any other membership, or with a role attribute that bypasses RLS or creates roles, is
  refused), so it cannot SET ROLE to the app role or to another mapped role;
* ``kb_sql_reader`` is never granted to the app role (its sessions would see nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

import psycopg
from psycopg import sql

from kb_rerank.core.settings import APP_ROLE_PATTERN

READER = "kb_sql_reader"
# A plain SQL name that needs no quoting: the app role's rule.
ROLE_PATTERN = APP_ROLE_PATTERN


class SqlAccessError(ValueError):
    """A grant or revoke that would be unsafe or names nothing; the message says why."""


@dataclass(frozen=True)
class Access:
    role: str
    tenant: UUID
    created: bool  # whether `grant` created the login role (then `revoke` drops it)
    granted_at: object = None
    can_login: bool | None = None
    member: bool | None = None  # still a member of kb_sql_reader


def default_role(tenant: UUID) -> str:
    """``kb_tenant_<32 hex digits>``: one role per tenant unless the DBA names another."""
    return f"kb_tenant_{UUID(str(tenant)).hex}"


def check_role_name(name: str, *, app_role: str) -> str:
    from kb_rerank.core.settings import RESERVED_ROLES

    if not ROLE_PATTERN.fullmatch(name):
        raise SqlAccessError(f"role {name!r} is invalid: a plain SQL name, [a-z_][a-z0-9_]*, at most 63 characters")
    if name in RESERVED_ROLES or name.startswith("pg_") or name == app_role:
        raise SqlAccessError(f"role {name!r} is a role of its own (the app role, a definer role, pg_*): "
                             "name a role that only this SQL caller uses")
    return name


def _role(conn: psycopg.Connection, name: str):
    return conn.execute(
        "select oid, rolsuper, rolbypassrls, rolcreaterole, rolcreatedb, rolreplication, rolinherit, rolcanlogin"
        " from pg_catalog.pg_roles where rolname = %s", [name]).fetchone()


def _check_existing(conn: psycopg.Connection, name: str, oid: int, attrs) -> None:
    """An existing role is adopted only if RLS binds it and it can reach no other role."""
    superuser, bypassrls, createrole, createdb, replication, inherit, _ = attrs
    if superuser or bypassrls or createrole or createdb or replication:
        raise SqlAccessError(f"role {name} is SUPERUSER, BYPASSRLS, CREATEROLE, CREATEDB or REPLICATION: "
                             "row-level security would not bind it, or it could grant itself more")
    if not inherit:
        raise SqlAccessError(f"role {name} is NOINHERIT: it would not use kb_sql_reader's grants "
                             f"(alter role {name} inherit)")
    others = [r[0] for r in conn.execute(
        "select g.rolname from pg_catalog.pg_auth_members m join pg_catalog.pg_roles g on g.oid = m.roleid"
        " where m.member = %s and g.rolname <> %s order by 1", [oid, READER])]
    if others:
        raise SqlAccessError(f"role {name} is a member of {', '.join(others)}: it could SET ROLE (or inherit) "
                             "beyond its tenant; use a role of its own")
    members = [r[0] for r in conn.execute(
        "select r.rolname from pg_catalog.pg_auth_members m join pg_catalog.pg_roles r on r.oid = m.member"
        " where m.roleid = %s order by 1", [oid])]
    if members:
        raise SqlAccessError(f"role {name} is granted to {', '.join(members)}: they would act through it")
    owner = conn.execute("select datdba = %s from pg_catalog.pg_database where datname = current_database()",
                         [oid]).fetchone()[0]
    if owner:
        raise SqlAccessError(f"role {name} owns this database")


def grant(conn: psycopg.Connection, tenant: UUID, *, role: str | None = None, password: str | None = None,
          app_role: str) -> Access:
    """Give ``role`` (default :func:`default_role`) read access to ``tenant`` only, in one
    transaction: the login role created when missing (LOGIN INHERIT, no other attribute),
    made a member of kb_sql_reader, mapped in kb.sql_access. ``password``: set as a SCRAM
    verifier computed here, so the clear text never reaches the server (nor its logs); None
    keeps the role's password (a new role has none: it logs in only by another method, or
    after ``alter role ... password``). Granting again the same role and tenant is a no-op
    (with a password: sets it); a role mapped to another tenant is refused."""
    tenant = UUID(str(tenant))
    name = check_role_name(role or default_role(tenant), app_role=app_role)
    ident = sql.Identifier(name)
    with conn.transaction():
        mapped = conn.execute("select tenant_id from kb.sql_access where role_name = %s", [name]).fetchone()
        if mapped and mapped[0] != tenant:
            raise SqlAccessError(f"role {name} already reads tenant {mapped[0]}: revoke it first")
        attrs = _role(conn, name)
        created = False
        if attrs is None:
            conn.execute(sql.SQL("create role {} login inherit nosuperuser nocreatedb nocreaterole noreplication"
                                 " nobypassrls").format(ident))
            attrs = _role(conn, name)
            created = True
        else:
            _check_existing(conn, name, attrs[0], attrs[1:])
        if password is not None:
            if not password:
                raise SqlAccessError("an empty password")
            verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
            conn.execute(sql.SQL("alter role {} password {}").format(ident, sql.Literal(verifier.decode())))
        version = conn.info.server_version
        # PostgreSQL 16+: membership without SET, so the role cannot even SET ROLE kb_sql_reader
        # (it inherits the grants, which is all it needs)
        option = sql.SQL(" with inherit true, set false") if version >= 160000 else sql.SQL("")
        conn.execute(sql.SQL("grant {} to {}").format(sql.Identifier(READER), ident) + option)
        row = conn.execute(
            "insert into kb.sql_access (role_name, tenant_id, created) values (%s, %s, %s)"
            " on conflict (role_name) do update set tenant_id = excluded.tenant_id"
            " returning created, granted_at", [name, tenant, created]).fetchone()
    return Access(name, tenant, bool(row[0]), row[1])


def revoke(conn: psycopg.Connection, *, tenant: UUID | None = None, role: str | None = None) -> list[Access]:
    """Remove the SQL access of ``role``, or of every role mapped to ``tenant``, in one
    transaction: the mapping deleted, the membership of kb_sql_reader revoked (its grants stop
    at the next statement of an open session too), its open sessions on this database ended
    where the connecting role may, and a role that `grant` created dropped (when it still
    holds a privilege elsewhere in the cluster it is kept with NOLOGIN instead)."""
    if (tenant is None) == (role is None):
        raise SqlAccessError("name a tenant or a role")
    with conn.transaction():
        if role is not None:
            rows = conn.execute("delete from kb.sql_access where role_name = %s"
                                " returning role_name::text, tenant_id, created", [role]).fetchall()
            if not rows and _role(conn, role) is not None and conn.execute(
                    "select pg_catalog.pg_has_role(%s, %s, 'MEMBER')", [role, READER]).fetchone()[0]:
                rows = [(role, None, False)]  # a member without a mapping: take the membership back
        else:
            rows = conn.execute("delete from kb.sql_access where tenant_id = %s"
                                " returning role_name::text, tenant_id, created", [UUID(str(tenant))]).fetchall()
        out = []
        for name, tid, created in rows:
            ident = sql.Identifier(name)
            if _role(conn, name) is None:
                out.append(Access(name, tid, created))
                continue
            conn.execute(sql.SQL("revoke {} from {}").format(sql.Identifier(READER), ident))
            if created:
                try:
                    with conn.transaction():
                        conn.execute(sql.SQL("drop role {}").format(ident))
                except psycopg.errors.DependentObjectsStillReferenced:
                    conn.execute(sql.SQL("alter role {} nologin").format(ident))
            out.append(Access(name, tid, created))
    # after the commit: a session still open loses the grants at its next statement anyway;
    # ending it also ends a statement that is running (needs pg_signal_backend or a superuser)
    for a in out:
        try:
            with conn.transaction():
                conn.execute(
                    "select pg_catalog.pg_terminate_backend(pid) from pg_catalog.pg_stat_activity"
                    " where usename = %s and datname = current_database() and pid <> pg_catalog.pg_backend_pid()",
                    [a.role])
        except psycopg.errors.InsufficientPrivilege:
            pass
    return out


def list_access(conn: psycopg.Connection) -> list[Access]:
    """Every mapping, with whether its role still logs in and is still a member of the group."""
    rows = conn.execute(
        "select a.role_name::text, a.tenant_id, a.created, a.granted_at, r.rolcanlogin,"
        " case when r.oid is null then null else pg_catalog.pg_has_role(r.oid, %s, 'MEMBER') end"
        " from kb.sql_access a left join pg_catalog.pg_roles r on r.rolname = a.role_name"
        " order by a.tenant_id, a.role_name", [READER]).fetchall()
    return [Access(*r) for r in rows]
