"""`kb-rerank` commands: the HTTP API and its tokens (serve, token)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

from kb_rerank.cli.common import command, uuid_arg
from kb_rerank.core import keys
from kb_rerank.core.dev import DEMO_TENANT, DEV_JWT_SECRET
from kb_rerank.core.settings import Settings


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


def register(sub) -> None:
    sv = command(sub, "serve", help="run the HTTP API (uvicorn)")
    sv.add_argument("--host", default=None, help="default KB_HOST (127.0.0.1)")
    sv.add_argument("--port", type=int, default=None, help="default KB_PORT (8000)")
    sv.add_argument("--dev", action="store_true",
                    help="without KB_JWT_SECRET/KB_JWT_PUBLIC_KEY/KB_JWT_JWKS_URL: use a fixed development secret "
                         "(printed); then only a loopback --host (127.0.0.1, ::1, localhost) is accepted")
    sv.add_argument("--log-format", choices=["json", "text"], default=None,
                    help="json: one object a line with trace_id, tenant_id, route, status, duration (default "
                         "KB_LOG_FORMAT, json); text: plain lines")
    sv.set_defaults(func=cmd_serve)

    tk = command(sub, "token", help="mint a Bearer token for a tenant (KB_JWT_SECRET, else the dev secret)")
    tk.add_argument("--tenant", type=uuid_arg, required=True,
                    help=f"the tenant's UUID, any but the nil and max UUIDs (the demo tenant: {DEMO_TENANT})")
    tk.add_argument("--ttl", type=int, default=3600, help="seconds (default 3600)")
    tk.set_defaults(func=cmd_token)
