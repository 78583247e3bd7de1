"""`kb-rerank` commands: the demo (demo)."""

from __future__ import annotations

import os
import sys
import time

from kb_rerank.cli.common import app_conn, command
from kb_rerank.cli.search import print_results, run_search
from kb_rerank.core.dev import DEMO_TENANT, DEV_JWT_SECRET
from kb_rerank.core.settings import Settings


# The sample knowledge base ships inside the package (kb_rerank/demo_kb).
DEMO_KB = "demo_kb"


DEMO_QUERIES = [
    "ERR_402",
    "how do I emit hóa đơn",
    "hoa don dien tu",
    "transfer ownership of my workspace to a colleague",
    "what changed in v2.3.1",
]


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
    with app_conn(settings) as conn, resources.as_file(resources.files("kb_rerank") / DEMO_KB) as kb_dir:
        report = ingest_paths(conn, DEMO_TENANT, [kb_dir], embedder, settings, progress=False)
        print(f"sample knowledge base ({DEMO_KB}) for tenant {DEMO_TENANT}: {report.summary()}")
        for q in DEMO_QUERIES:
            rows = run_search(conn, settings, embedder, DEMO_TENANT, q, "hybrid", settings.candidates)
            print(f"\nhybrid search {q!r}: {len(rows)} candidates, top 5")
            print_results(rows[:5])
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


def register(sub) -> None:
    dm = command(sub, "demo", help="migrate, ingest the sample knowledge base, run example searches, "
                                    "then one HTTP call to the rerank API")
    dm.add_argument("--no-http", action="store_true", help="skip starting the HTTP server")
    dm.set_defaults(func=cmd_demo)
