"""`kb-rerank` commands: SQL access for one tenant (sql-access)."""

from __future__ import annotations

import sys

from kb_rerank.cli.common import command_group, TENANT_HELP, command, uuid_arg
from kb_rerank.core.settings import Settings


def cmd_sql_access(args, settings: Settings) -> int:
    """SQL access for one tenant: grant, revoke, list (the owner URL, like `migrate`)."""
    from kb_rerank.db import database as db
    from kb_rerank.db import sql_access

    password = None
    if getattr(args, "password_stdin", False):
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            print("kb-rerank: error: sql-access grant: --password-stdin read an empty password", file=sys.stderr)
            return 2
    with db.connect_owner(settings) as conn:
        try:
            if args.sql_access_action == "grant":
                a = sql_access.grant(conn, args.tenant, role=args.role, password=password, app_role=settings.app_role)
                print(f"{a.role} reads tenant {a.tenant} ({'created' if a.created else 'existing role'};"
                      f" {'password set' if password is not None else 'no password set by this command'})")
            elif args.sql_access_action == "revoke":
                done = sql_access.revoke(conn, tenant=args.tenant, role=args.role)
                if not done:
                    print("kb-rerank: error: sql-access revoke: no SQL access matched", file=sys.stderr)
                    return 1
                for a in done:
                    print(f"revoked {a.role}" + (f" (tenant {a.tenant})" if a.tenant else "")
                          + (": role dropped" if a.created else ": role kept, no longer a member of kb_sql_reader"))
            else:
                for a in sql_access.list_access(conn):
                    state = ("role missing" if a.can_login is None else
                             ("login" if a.can_login else "nologin") + ("" if a.member else ", not a member"))
                    print(f"{a.tenant}  {a.role}  {state}  granted {a.granted_at:%Y-%m-%d %H:%M}")
        except sql_access.SqlAccessError as exc:
            print(f"kb-rerank: error: sql-access {args.sql_access_action}: {exc}", file=sys.stderr)
            return 1
    return 0


def register(sub) -> None:
    sq_sub = command_group(sub, "sql-access", dest="sql_access_action",
                           help="SQL access for one tenant: a login role of its own that reads that "
                                "tenant's rows only (owner URL)")
    sg = command(sq_sub, "grant", help="create (or adopt) a login role, member of kb_sql_reader, mapped to the "
                                        "tenant; it ignores auth.tenant_id")
    sg.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
    sg.add_argument("--role", default=None, help="login role name (default kb_tenant_<tenant hex>)")
    sg.add_argument("--password-stdin", action="store_true",
                    help="read the role's password from the first line of stdin (stored as a SCRAM verifier)")
    sg.set_defaults(func=cmd_sql_access)
    sr = command(sq_sub, "revoke", help="remove a role's (or every role of a tenant's) SQL access; a role "
                                         "`grant` created is dropped")
    who = sr.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", type=uuid_arg, default=None, help="every role of this tenant")
    who.add_argument("--role", default=None, help="this login role")
    sr.set_defaults(func=cmd_sql_access)
    sl = command(sq_sub, "list", help="every login role with SQL access and its tenant")
    sl.set_defaults(func=cmd_sql_access, tenant=None, role=None)
