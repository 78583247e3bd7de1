"""`kb-rerank` commands: the audit log (audit)."""

from __future__ import annotations

import argparse
import sys

from kb_rerank.cli.common import command_group, command, uuid_arg
from kb_rerank.core import session
from kb_rerank.core.settings import Settings


# exit codes of `audit verify`: 0 verified, 1 a chain broken or a row forged, 2 nothing
# could be verified (no privilege, no rows visible)
AUDIT_OK, AUDIT_BROKEN, AUDIT_UNVERIFIABLE = 0, 1, 2


def _audit_access_problem(conn, tenant) -> str | None:
    """Why this connection cannot verify the audit log (all tenants, or ``tenant``), or None."""
    from kb_rerank.audit.archive import access

    user, superuser, bypassrls, exists, can_select, can_verify, can_hash, can_checkpoints = session.run(conn, access)
    if not exists:
        return "kb.kb_rerank_audit does not exist in this database: run `kb-rerank migrate` (or check KB_DATABASE_URL)"
    missing = [what for what, ok in (("SELECT on kb.kb_rerank_audit", can_select),
                                     ("EXECUTE on kb.audit_verify()", can_verify),
                                     ("EXECUTE on kb.audit_row_hash(kb.kb_rerank_audit)", can_hash),
                                     ("SELECT on kb.audit_checkpoints", can_checkpoints)) if not ok]
    if missing:
        return (f"role {user} lacks {', '.join(missing)}: run `kb-rerank audit verify` with the owner URL "
                "(KB_DATABASE_URL), not the app or maintenance role (docs/operations.md)")
    if tenant is None and not (superuser or bypassrls):
        return (f"role {user} is bound by row-level security on kb.kb_rerank_audit (neither superuser nor BYPASSRLS; "
                "RLS is forced, so the table owner is bound too): without --tenant it would see no tenant's rows. "
                "Run it as a superuser or BYPASSRLS role, or verify one tenant at a time with --tenant")
    return None


def cmd_audit(args, settings: Settings) -> int:
    """Verify the SQL hash chains (kb.audit_verify) AND every row's MAC with the audit key
    (KB_AUDIT_KEY, plus KB_AUDIT_OLD_KEYS after a rotation), as the owner: all tenants, or
    one with --tenant. Exit 1 when a chain is broken or a row is forged; exit 2 when nothing
    could be verified: the role lacks the privilege, or sees no audit row at all (unless
    --allow-empty). Both checks read one snapshot (REPEATABLE READ), so they see the same rows."""
    import psycopg

    from kb_rerank.audit import store as audit
    from kb_rerank.db import database as db

    audit_keys = audit.verify_keys(settings)
    with db.connect_owner(settings) as conn:
        problem = _audit_access_problem(conn, args.tenant)
        conn.rollback()
        if problem:
            print(f"kb-rerank: error: audit verify: {problem}", file=sys.stderr)
            return AUDIT_UNVERIFIABLE
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        try:
            if args.tenant is None:
                with conn.transaction():
                    rows = session.run(conn, audit.verify)
                    macs = session.run(conn, audit.verify_macs, audit_keys)
            else:
                with session.tenant_transaction(conn, args.tenant):
                    rows = [r for r in session.run(conn, audit.verify) if r.tenant_id == args.tenant]
                    macs = session.run(conn, audit.verify_macs, audit_keys, tenant_id=args.tenant)
        except psycopg.errors.InsufficientPrivilege as exc:
            print(f"kb-rerank: error: audit verify: permission denied: {exc}", file=sys.stderr)
            return AUDIT_UNVERIFIABLE
    broken = [r for r in rows if not r.ok]
    checked = sum(r.rows_checked or 0 for r in rows)
    for r in broken:
        print(f"BROKEN: tenant {r.tenant_id}: first broken seq {r.first_broken_seq} "
              f"(audit_id {r.first_broken_audit_id}): {r.reason}")
    for p in macs.problems:
        print(f"FORGED: tenant {p.tenant_id} seq {p.seq}: {p.reason}")
    if broken or macs.problems:
        return AUDIT_BROKEN
    if checked != macs.checked + macs.legacy:  # no problem left: every row counted once or the other
        print(f"kb-rerank: error: audit verify: the chain check saw {checked} rows, the MAC check "
              f"{macs.checked + macs.legacy}", file=sys.stderr)
        return AUDIT_BROKEN
    if checked == 0:
        scope = f"tenant {args.tenant}" if args.tenant is not None else "any tenant"
        if not args.allow_empty:
            print(f"kb-rerank: error: audit verify: no audit rows visible for {scope}: nothing was verified "
                  "(a wrong database, tenant or role?); --allow-empty accepts an empty log", file=sys.stderr)
            return AUDIT_UNVERIFIABLE
        print(f"OK: no audit rows for {scope} (--allow-empty)")
        return AUDIT_OK
    print(f"OK: {checked} audit rows of {len(rows)} tenant(s) verified; {macs.checked} MACs verified"
          + (f", {macs.legacy} rows written before the chain was keyed" if macs.legacy else "")
          + (f"; {macs.checkpoints} signed checkpoint(s) of archived months verified" if macs.checkpoints else ""))
    return AUDIT_OK


def _month(value: str):
    import datetime as dt

    try:
        return dt.datetime.strptime(value, "%Y-%m").date()
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a month (YYYY-MM): {value!r}") from None


def cmd_audit_partitions(args, settings: Settings) -> int:
    """Create the audit log's month partitions from this month to --ahead months later
    (cron, monthly), moving rows of those months out of the default partition."""
    import datetime as dt

    from kb_rerank.db import database as db
    from kb_rerank.audit import archive as audit_archive

    today = dt.datetime.now(dt.timezone.utc).date().replace(day=1)
    with db.connect_owner(settings) as conn:
        problem = _audit_access_problem(conn, None)
        if problem:
            print(f"kb-rerank: error: audit partitions: {problem}", file=sys.stderr)
            return AUDIT_UNVERIFIABLE
        with conn.transaction():
            for i in range(args.ahead + 1):
                y, m = divmod(today.month - 1 + i, 12)
                name = session.run(conn, audit_archive.add_month, today.replace(year=today.year + y, month=m + 1))
                if name:
                    print(f"created kb.{name}")
    return 0


def cmd_audit_archive(args, settings: Settings) -> int:
    """Drop the audit log's month partitions before --before, after writing for each tenant
    with rows in them a checkpoint (its last dropped row's seq and row_hash) MAC'd with the
    audit key. In one transaction that appends wait for: the log is verified (chains and
    MACs) first and again after the drop, and nothing is committed unless both pass.
    Dump the partitions first (`pg_dump -t kb.kb_rerank_audit_YYYY_MM`) to keep them."""
    import psycopg

    from kb_rerank.db import database as db
    from kb_rerank.audit import store as audit, archive as audit_archive

    audit_keys = audit.verify_keys(settings)
    key = audit.AuditKey(audit_keys[0])
    with db.connect_owner(settings) as conn:
        problem = _audit_access_problem(conn, None)
        conn.rollback()
        if problem:
            print(f"kb-rerank: error: audit archive: {problem}", file=sys.stderr)
            return AUDIT_UNVERIFIABLE
        with conn.transaction() as tx:
            session.run(conn, audit_archive.lock)  # appends wait; reads go on
            months = [(name, m) for name, m in session.run(conn, audit_archive.months) if m < args.before]
            if not months:
                print(f"nothing to archive: no month partition before {args.before:%Y-%m}")
                return 0
            bad = [r for r in session.run(conn, audit.verify) if not r.ok]
            macs = session.run(conn, audit.verify_macs, audit_keys)
            if bad or macs.problems:
                print("kb-rerank: error: audit archive: the log does not verify now (run `kb-rerank audit verify`); "
                      "nothing archived", file=sys.stderr)
                return AUDIT_BROKEN
            names = [n for n, _ in months]
            # per tenant: the last dropped row, which must come before every row that stays
            lasts = session.run(conn, audit_archive.last_seqs, names)
            for t, last in lasts:
                kept_first = session.run(conn, audit_archive.first_kept_seq, t, names)
                if kept_first is not None and kept_first <= last:
                    print(f"kb-rerank: error: audit archive: tenant {t} has row {kept_first} outside the months "
                          f"to drop but before their last row {last}; nothing archived", file=sys.stderr)
                    raise psycopg.Rollback(tx)
                row_hash = session.run(conn, audit_archive.row_hash, t, last)
                session.run(
                    conn, audit_archive.write_checkpoint, t, last, row_hash, args.before,
                    audit.mac(key.key, audit.checkpoint_canonical(t, last, row_hash, args.before)), key.key_id)
            for n in names:
                session.run(conn, audit_archive.drop_partition, n)
            bad = [r for r in session.run(conn, audit.verify) if not r.ok]
            macs = session.run(conn, audit.verify_macs, audit_keys)
            if bad or macs.problems:
                print("kb-rerank: error: audit archive: the remaining log would not verify; nothing archived",
                      file=sys.stderr)
                raise psycopg.Rollback(tx)
            if args.dry_run:
                print(f"would drop {', '.join(names)}; {len(lasts)} tenant checkpoint(s) (dry run: nothing done)")
                raise psycopg.Rollback(tx)
            print(f"dropped {', '.join(names)}; {len(lasts)} tenant checkpoint(s) written; the rest verifies")
            return 0
    return AUDIT_BROKEN if not args.dry_run else 0


def register(sub) -> None:
    au_sub = command_group(sub, "audit", dest="audit_action", help="audit log tools")
    av = command(au_sub, "verify", help="verify the audit hash chains and MACs (exit 1 when broken or forged, "
                                         "2 when nothing could be verified: no privilege or no rows)")
    av.add_argument("--tenant", type=uuid_arg, default=None,
                    help="check one tenant (default: all tenants, which needs a superuser or BYPASSRLS role); "
                         "runs with the owner URL and the audit key")
    av.add_argument("--allow-empty", action="store_true",
                    help="exit 0 when no audit row is visible (a new installation); by default that is exit 2")
    av.set_defaults(func=cmd_audit)
    ap = command(au_sub, "partitions", help="create the audit log's month partitions from this month on (cron, "
                                             "monthly); rows of those months move out of the default partition")
    ap.add_argument("--ahead", type=int, default=1, help="months after this one (default 1)")
    ap.set_defaults(func=cmd_audit_partitions)
    aa = command(au_sub, "archive", help="drop the audit log's months before --before, writing a signed chain "
                                          "checkpoint per tenant so the rest still verifies (dump them first)")
    aa.add_argument("--before", type=_month, required=True, help="YYYY-MM: months before this one go")
    aa.add_argument("--dry-run", action="store_true", help="check and report, drop nothing")
    aa.set_defaults(func=cmd_audit_archive)
