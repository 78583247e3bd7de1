"""The `kb-rerank` command line."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from uuid import UUID

from .settings import Settings

DEMO_TENANT = UUID("00000000-0000-4000-8000-000000000001")
EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples" / "kb"
DEMO_QUERIES = [
    "ERR_402",
    "how do I emit hóa đơn",
    "hoa don dien tu",
    "transfer ownership of my workspace to a colleague",
    "what changed in v2.3.1",
]


def _uuid(value: str) -> UUID:
    try:
        return UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {value!r}") from None


def _app_conn(settings: Settings):
    import psycopg

    from . import db

    conn = psycopg.connect(db.app_url(settings))
    db.configure_connection(conn)
    db.check_embedding_dim(conn, settings)
    return conn


def cmd_db(args, settings: Settings) -> int:
    from . import db

    if args.action == "start":
        if settings.database_url:
            print("KB_DATABASE_URL is set: the embedded server is not used", file=sys.stderr)
            return 1
        print(db.start_embedded(settings))
    elif args.action == "stop":
        print("stopped" if db.stop_embedded(settings) else "not running")
    elif args.action == "url":
        print(db.app_url(settings) if args.app else db.owner_url(settings))
    return 0


def cmd_migrate(args, settings: Settings) -> int:
    from . import db

    url = db.migrate(settings, revision=args.revision)
    import psycopg

    with psycopg.connect(url) as conn:
        print(f"database at revision {db.current_revision(conn)}")
    return 0


def cmd_downgrade(args, settings: Settings) -> int:
    from . import db

    db.downgrade(settings, revision=args.revision)
    print(f"downgraded to {args.revision}")
    return 0


def cmd_ingest(args, settings: Settings) -> int:
    from .embed import get_embedder
    from .ingest import ingest_paths

    embedder = get_embedder(settings)
    with _app_conn(settings) as conn:
        t0 = time.perf_counter()
        report = ingest_paths(conn, args.tenant, args.paths, embedder, settings, progress=not args.quiet)
        dt = time.perf_counter() - t0
    print(f"{report.summary()} in {dt:.1f}s")
    for bad in report.bad_files:
        print(f"skipped {bad.path}: {bad.reason}", file=sys.stderr)
    return 0


def _print_results(rows, mode: str) -> None:
    if not rows:
        print("  (no results)")
    for i, r in enumerate(rows, 1):
        ranks = f"lex={r.lexical_rank or '-'} sem={r.semantic_rank or '-'}"
        snippet = " ".join(r.snippet.split())[:90]
        print(f"  {i:2d}. {r.score:8.4f}  {ranks:16s} {r.doc_title[:40]:40s} | {snippet}")


def run_search(conn, settings: Settings, embedder, tenant: UUID, query: str, mode: str, k: int):
    from . import search
    from .db import tenant_transaction

    with tenant_transaction(conn, tenant):
        if mode == "lexical":
            return search.lexical(conn, query, k, k1=settings.bm25_k1, b=settings.bm25_b)
        emb = embedder.embed_query(query)
        if mode == "semantic":
            return search.semantic(conn, emb, k)
        return search.hybrid(conn, query, emb, k, rrf_k=settings.rrf_k)


def cmd_search(args, settings: Settings) -> int:
    from .embed import get_embedder

    embedder = None if args.mode == "lexical" else get_embedder(settings)
    with _app_conn(settings) as conn:
        rows = run_search(conn, settings, embedder, args.tenant, args.query, args.mode, args.k)
    print(f"{args.mode} search for {args.query!r}: {len(rows)} results")
    _print_results(rows[: args.limit], args.mode)
    return 0


def cmd_demo(args, settings: Settings) -> int:
    from . import db
    from .embed import get_embedder
    from .ingest import ingest_paths

    t0 = time.perf_counter()
    url = db.migrate(settings)
    print(f"database ready: {db.app_url(settings)} (owner {url})")
    embedder = get_embedder(settings)
    with _app_conn(settings) as conn:
        report = ingest_paths(conn, DEMO_TENANT, [EXAMPLES_DIR], embedder, settings, progress=False)
        print(f"sample knowledge base ({EXAMPLES_DIR.name}) for tenant {DEMO_TENANT}: {report.summary()}")
        for q in DEMO_QUERIES:
            rows = run_search(conn, settings, embedder, DEMO_TENANT, q, "hybrid", settings.candidates)
            print(f"\nhybrid search {q!r}: {len(rows)} candidates, top 5")
            _print_results(rows[:5], "hybrid")
    print(f"\ndemo done in {time.perf_counter() - t0:.1f}s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kb-rerank", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("db", help="embedded PostgreSQL: start, stop, print URL")
    d.add_argument("action", choices=["start", "stop", "url"])
    d.add_argument("--app", action="store_true", help="with url: the app role's URL")
    d.set_defaults(func=cmd_db)

    m = sub.add_parser("migrate", help="apply migrations (alembic upgrade)")
    m.add_argument("--revision", default="head")
    m.set_defaults(func=cmd_migrate)

    dg = sub.add_parser("downgrade", help="revert migrations (alembic downgrade)")
    dg.add_argument("--revision", default="base")
    dg.set_defaults(func=cmd_downgrade)

    i = sub.add_parser("ingest", help="ingest Markdown/text files or a BEIR corpus.jsonl for a tenant")
    i.add_argument("paths", nargs="+")
    i.add_argument("--tenant", type=_uuid, required=True)
    i.add_argument("--quiet", action="store_true", help="no progress bar")
    i.set_defaults(func=cmd_ingest)

    s = sub.add_parser("search", help="run a search from the command line")
    s.add_argument("query")
    s.add_argument("--tenant", type=_uuid, default=DEMO_TENANT)
    s.add_argument("--mode", choices=["hybrid", "lexical", "semantic"], default="hybrid")
    s.add_argument("-k", type=int, default=20, help="top-k of each list")
    s.add_argument("--limit", type=int, default=10, help="rows to print")
    s.set_defaults(func=cmd_search)

    dm = sub.add_parser("demo", help="migrate, ingest the sample knowledge base, run example searches")
    dm.set_defaults(func=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = Settings.from_env()
        return args.func(args, settings)
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump a traceback
        from .db import DatabaseSetupError

        if args.verbose or not isinstance(exc, (DatabaseSetupError, ValueError, OSError)):
            raise
        print(f"kb-rerank: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
