"""`kb-rerank` commands: manual curation lists (curate)."""

from __future__ import annotations

import sys
from pathlib import Path

from kb_rerank.cli.common import TENANT_HELP, command, uuid_arg
from kb_rerank.core import session
from kb_rerank.core.settings import Settings


def cmd_curate(args, settings: Settings) -> int:
    from kb_rerank.endpoints.search import curation
    from kb_rerank.cache import store as cache
    from kb_rerank.db import database as db
    from kb_rerank.core.query import normalize_query, query_hash, query_hash_key

    normalized = normalize_query(args.query)
    qh = query_hash(normalized, query_hash_key(settings))
    old_qh = None
    if args.action == "rekey":
        old_qh = _previous_query_hash(args, normalized, settings)
        if old_qh is None:
            return 2
    with db.connect_app(settings) as conn:
        with session.tenant_transaction(conn, args.tenant):
            if args.action == "rekey":
                # After a rotation of the query-hash key (or an upgrade from plain SHA-256
                # hashes, migration 0010): move the list pinned under the previous hash of
                # this query to its hash under the current key, in one transaction.
                if session.run(conn, curation.exists, qh):
                    print(f"kb-rerank: error: query_hash {qh} already has a curated list (clear it first)",
                          file=sys.stderr)
                    return 1
                n = session.run(conn, curation.move, old_qh, qh)
                session.run(conn, cache.invalidate, "manual_curation")
                print(f"moved {n} curated chunk(s) from query_hash {old_qh} to {qh}")
            elif args.action == "add":
                if not args.chunk:
                    print("kb-rerank: error: curate add needs --chunk UUID [UUID ...]", file=sys.stderr)
                    return 2
                start = session.run(conn, curation.append, qh, args.chunk, args.note)
                session.run(conn, cache.invalidate, "manual_curation")
                print(f"added {len(args.chunk)} chunk(s) at positions {start}..{start + len(args.chunk) - 1}"
                      f" for query_hash {qh}")
            elif args.action == "list":
                rows = session.run(conn, curation.entries, qh)
                print(f"query_hash {qh}: {len(rows)} curated chunk(s)")
                for pos, chunk, note in rows:
                    print(f"  {pos:3d}  {chunk}" + (f"  {note}" if note else ""))
            else:
                n = session.run(conn, curation.clear, qh)
                session.run(conn, cache.invalidate, "manual_curation")
                print(f"cleared {n} curated chunk(s) for query_hash {qh}")
    return 0


def _previous_query_hash(args, normalized: str, settings: Settings) -> str | None:
    """The hash the query had before: under ``--old-key-file`` (the previous key, as
    KB_QUERY_HASH_KEY or the key file held it), or plain SHA-256 (``--legacy-sha256``:
    lists pinned before migration 0010)."""
    import hashlib

    from kb_rerank.core.keys import KeyConfigError, server_key
    from kb_rerank.core.query import query_hash

    if args.legacy_sha256 == bool(args.old_key_file):
        print("kb-rerank: error: curate rekey needs exactly one of --old-key-file PATH, --legacy-sha256",
              file=sys.stderr)
        return None
    if args.legacy_sha256:
        return hashlib.sha256(normalized.encode("utf-8")).hexdigest()
    try:
        old_text = Path(args.old_key_file).read_text(encoding="utf-8").strip()
        old = server_key(settings, "previous query_hash", old_text) if old_text else b""
        if not old:
            raise KeyConfigError("the file is empty")
    except (OSError, UnicodeDecodeError, KeyConfigError) as exc:
        print(f"kb-rerank: error: --old-key-file: {exc}", file=sys.stderr)
        return None
    return query_hash(normalized, old)


def register(sub) -> None:
    cu = command(sub, "curate", help="manual curation lists (source manual_curation)")
    cu.add_argument("action", choices=["add", "list", "clear", "rekey"],
                    help="rekey: move the list pinned under the query's previous hash (after a rotation of"
                         " KB_QUERY_HASH_KEY) to its hash under the current key")
    cu.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
    cu.add_argument("--query", required=True, help="the query whose results are pinned (normalised as searches are)")
    cu.add_argument("--chunk", type=uuid_arg, nargs="+", default=[], help="chunk ids, in result order (add)")
    cu.add_argument("--note", default=None, help="add: a note stored with the chunks")
    cu.add_argument("--old-key-file", default=None, help="rekey: file holding the previous query-hash key")
    cu.add_argument("--legacy-sha256", action="store_true",
                    help="rekey: the list was pinned before migration 0010 (plain SHA-256 query hash)")
    cu.set_defaults(func=cmd_curate)
