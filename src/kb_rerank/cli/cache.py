"""`kb-rerank` commands: the caches (evict)."""

from __future__ import annotations

from kb_rerank.cli.common import command
from kb_rerank.core.settings import Settings


def cmd_evict(args, settings: Settings) -> int:
    """Delete expired cache rows of all tenants (cron: `*/15 * * * * kb-rerank evict`). Runs
    as the maintenance role (KB_MAINT_DATABASE_URL) or the owner: the app role may not."""
    import json

    from kb_rerank.db import database as db
    from kb_rerank.cache.eviction import evict_expired

    total = 0
    with db.connect_owner(settings, settings.maint_database_url, autocommit=True) as conn:
        while True:
            n = evict_expired(conn, args.batch)
            total += n
            if n < args.batch:
                break
    print(json.dumps({"evicted": total}) if args.json else
          f"evicted {total} expired cache row{'' if total == 1 else 's'}")
    return 0


def register(sub) -> None:
    ev = command(sub, "evict", help="delete expired cache rows of all tenants, as the maintenance role or the owner "
                      "(cron: */15 * * * * kb-rerank evict)")
    ev.add_argument("--batch", type=int, default=10000,
                    help="rows deleted per statement (default 10000): smaller batches hold locks for less time")
    ev.add_argument("--json", action="store_true", help='print {"evicted": N} instead of a sentence')
    ev.set_defaults(func=cmd_evict)
