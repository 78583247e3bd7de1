"""`kb-rerank` commands: the embedded PostgreSQL (db)."""

from __future__ import annotations

import os
import sys

from kb_rerank.cli.common import command
from kb_rerank.core.settings import Settings


def cmd_db(args, settings: Settings) -> int:
    from kb_rerank.db import database as db

    if args.action == "start":
        if settings.database_url:
            print("KB_DATABASE_URL is set: the embedded server is not used", file=sys.stderr)
            return 1
        created = not (settings.data_dir / "pg" / "PG_VERSION").exists()
        url = db.start_embedded(settings, create=True)
        print(f"embedded PostgreSQL running, data in {settings.data_dir}"
              + (" (created; next: kb-rerank migrate)" if created else ""), file=sys.stderr)
        print(url)  # stdout: the owner URL alone, for scripts
    elif args.action == "stop":
        print("stopped" if db.stop_embedded(settings) else f"not running (data directory {settings.data_dir})")
    elif args.action == "url":
        print(db.app_url(settings) if args.app else db.owner_url(settings))
    elif args.action == "psql":
        psql = db.psql_path()
        if psql is None:
            print("kb-rerank: error: no psql found (neither the embedded server's nor one on PATH)", file=sys.stderr)
            return 1
        url = db.owner_url(settings) if args.owner else db.app_url(settings)
        os.execv(psql, [psql, url, *getattr(args, "psql_args", [])])
    return 0


def register(sub) -> None:
    d = command(sub, "db", help="the embedded PostgreSQL: start (creating it), stop, print its URL, open psql")
    d.add_argument("action", choices=["start", "stop", "url", "psql"],
                   help="start: create (in the data directory) or start the server, print the owner URL; stop; "
                        "url: print the owner URL (--app: the app role's); psql: open psql on it")
    d.add_argument("--app", action="store_true", help="with url: the app role's URL")
    d.add_argument("--owner", action="store_true", help="with psql: connect as the owner instead of the app role (KB_APP_ROLE) "
                   "(psql's own arguments go after --)")
    d.set_defaults(func=cmd_db)
