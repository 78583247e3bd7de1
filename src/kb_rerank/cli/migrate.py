"""`kb-rerank` commands: schema migrations (migrate, downgrade)."""

from __future__ import annotations

import sys

from kb_rerank.cli.common import command
from kb_rerank.core.settings import Settings


def cmd_migrate(args, settings: Settings) -> int:
    from kb_rerank.db import database as db

    if args.sql:
        db.migrate_sql(settings, sys.stdout, revision=args.revision)
        return 0
    import psycopg

    url = db.owner_url(settings)
    with psycopg.connect(url, autocommit=True) as conn:
        db.check_migration_role(conn)  # before reading anything: a role migrate refuses is told why
        before = db.current_revision(conn)
    db.migrate(settings, url, revision=args.revision)
    with psycopg.connect(url) as conn:
        after = db.current_revision(conn)
        note = db.sql_rerank_note(conn)
    print(f"database already at {after}: nothing to apply" if after == before else
          f"migrated {before or 'an empty database'} to {after}")
    if note:
        print(note)
    return 0


def cmd_downgrade(args, settings: Settings) -> int:
    import psycopg

    from kb_rerank.db import database as db

    from alembic.util import CommandError

    url = db.owner_url(settings)
    try:
        db.downgrade(settings, url, revision=args.revision)
    except (CommandError, db.ForwardOnly) as exc:  # forward-only: refused before the database is touched
        print(f"kb-rerank: error: downgrade {args.revision}: {exc}", file=sys.stderr)
        return 1
    with psycopg.connect(url) as conn:
        print(f"database at revision {db.current_revision(conn) or 'base (no kb schema)'}")
    return 0


def register(sub) -> None:
    m = command(sub, "migrate", help="apply migrations (alembic upgrade)")
    m.add_argument("--revision", default="head", help="target revision (default head, the latest)")
    m.add_argument("--sql", action="store_true",
                   help="print the SQL of the pending upgrade for review (versioned files, version-table updates, "
                        "the idempotent layer); apply nothing")
    m.set_defaults(func=cmd_migrate)

    dg = command(sub, "downgrade", help="refused: migrations are forward-only; a database goes back by restoring the "
                                        "backup made before the upgrade (docs/operations.md)")
    dg.add_argument("--revision", default="-1", help="the revision that would be the target (nothing is changed)")
    dg.set_defaults(func=cmd_downgrade)
