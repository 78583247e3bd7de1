"""The `kb-rerank` command line (argparse): the parser built from the command groups, one
module each under kb_rerank.cli, each registering its own sub-commands and their help with
``register(sub)`` (:data:`GROUPS`, in the order `kb-rerank --help` lists them), and the
dispatch. What a user reads is the parser's text (DESCRIPTION, EPILOG, each option's help),
never these docstrings."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import nullcontext

from kb_rerank import __version__
from kb_rerank.cli import (audit, cache, curate, db, demo, eval, guard, ingest, mcp, migrate, model, search, serve,
                           sql_access)
from kb_rerank.core.settings import Settings, SettingsError

DESCRIPTION = """\
Hybrid search (BM25 and pgvector, fused in PostgreSQL) and cross-encoder rerank for
multi-tenant knowledge bases. `kb-rerank COMMAND --help` describes a command."""
EPILOG = """\
first steps:
  kb-rerank demo                             an embedded PostgreSQL in ./.kb-data, the sample
                                             knowledge base, a few searches, one HTTP call
  kb-rerank db start && kb-rerank migrate    the same server, with an empty schema
  kb-rerank ingest DOCS/ --tenant UUID       your documents, for one tenant
  kb-rerank serve --dev                      the HTTP API on http://127.0.0.1:8000 (/playground)

settings: KB_* variables, from the environment or from the nearest .env file (this folder
or a parent; the environment wins); .env.example lists them all.
data directory (the embedded server): KB_DATA_DIR, else the nearest .kb-data in this folder
or a parent, else ./.kb-data, which only `db start` and `demo` create.
"""


# the command groups, in the order `kb-rerank --help` lists their commands
GROUPS = (db, migrate, ingest, guard, search, demo, serve, cache, audit, curate, sql_access, model, eval, mcp)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kb-rerank", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log at INFO level (the embedded server, the migrations) and show the traceback of an error")
    p.add_argument("--version", action="version", version=f"kb-rerank {__version__}",
                   help="print the installed version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(sub)
    return p


def _setup_logging(verbose: bool) -> None:
    """Log records to stderr (INFO with -v, else WARNING). alembic's plugin set-up lines are
    noise at any level; `migrate` prints its own summary."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # `kb-rerank db psql [--owner] -- <psql arguments>`
        i = argv.index("--")
        argv, passthrough = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    args.psql_args = passthrough
    _setup_logging(args.verbose)
    try:  # every KB_* variable typed and bounded before any work: the message names the variable
        settings = Settings.from_env()
    except SettingsError as exc:
        print(f"kb-rerank: error: {exc}", file=sys.stderr)
        return 2
    import psycopg
    from tqdm.contrib.logging import logging_redirect_tqdm

    from kb_rerank.db import database as db
    from kb_rerank.core.extras import MissingExtra

    try:
        # only `db start` and `demo` create an embedded server; log lines are written above the
        # progress bars (tqdm.write), not into them (serve configures its own logging)
        with db.no_implicit_server(), logging_redirect_tqdm() if args.command != "serve" else nullcontext():
            return args.func(args, settings)
    except (db.NoEmbeddedServer, db.NotMigrated) as exc:  # the next step to take, in one line
        if args.verbose:
            raise
        print(f"kb-rerank: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump a traceback
        if args.verbose or not isinstance(exc, (db.DatabaseSetupError, MissingExtra, ValueError, OSError,
                                                psycopg.OperationalError)):
            raise
        print(f"kb-rerank: error: {_one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
