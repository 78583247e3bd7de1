"""The search playground: ``GET /playground``, a plain HTML page with its script and style
sheet (shipped in the package under ``kb_rerank/playground``, no build step), which calls
the three JSON routes from the browser exactly as any other client would (Bearer token,
JSON body, same origin).

* ``GET /playground`` -- the page; ``GET /playground/assets/{name}`` -- its script and
  style sheet (a fixed list: nothing else under the folder is served).
* ``GET /playground/config.json`` -- what the page needs from the server: the accepted
  ``source`` values (from :data:`kb_rerank.core.settings.SOURCES`, so the page holds no second
  copy) and whether the demo-token button is offered.
* ``POST /playground/dev-token`` -- ONLY under ``kb-rerank serve --dev`` with the public
  development secret (:data:`kb_rerank.core.dev.DEV_JWT_SECRET`): a token for the demo tenant.
  Anyone can already mint such tokens with that secret, so the route gives nothing away;
  with any other secret (or without ``--dev``) the route does not exist (404).

The playground's answers carry a strict Content-Security-Policy (scripts, styles and
requests from this origin only, no inline script, no framing); the API routes' headers are
not touched.
"""

from __future__ import annotations

from importlib import resources

from litestar import Request, Response, get, post
from litestar.exceptions import NotFoundException

from kb_rerank.core.settings import SOURCES, Settings

PACKAGE_DIR = "endpoints/playground/static"
# name -> media type (Litestar adds "; charset=utf-8" to text/*): the only files served from the folder
ASSETS = {
    "playground.js": "text/javascript",
    "playground.css": "text/css",
}
HEADERS = {
    # the page's script is a file (script-src 'self'), never inline; fetch() only to this origin;
    # img-src data: for the empty favicon (no request for /favicon.ico)
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                                "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
DEV_TOKEN_TTL_S = 3600


def _read(name: str) -> bytes:
    return (resources.files("kb_rerank") / PACKAGE_DIR / name).read_bytes()


def dev_token_enabled(settings: Settings, dev: bool) -> bool:
    """The demo-token route exists only with ``--dev`` AND the public development secret."""
    from kb_rerank.core.dev import DEV_JWT_SECRET

    return dev and settings.jwt_secret == DEV_JWT_SECRET


def playground_routes(settings: Settings, *, dev: bool) -> list:
    """The playground's route handlers for an app built with ``settings`` / ``dev``."""
    files = {name: _read(name) for name in ("index.html", *ASSETS)}  # small: read once per app
    dev_token = dev_token_enabled(settings, dev)
    config = {"sources": list(SOURCES), "dev_token": dev_token}

    @get("/playground", include_in_schema=False, sync_to_thread=False)
    def page() -> Response[bytes]:
        return Response(files["index.html"], media_type="text/html", headers=HEADERS)

    @get("/playground/assets/{name:str}", include_in_schema=False, sync_to_thread=False)
    def asset(name: str) -> Response[bytes]:
        if name not in ASSETS:
            raise NotFoundException()
        return Response(files[name], media_type=ASSETS[name], headers=HEADERS)

    @get("/playground/config.json", include_in_schema=False, sync_to_thread=False)
    def page_config() -> Response[dict]:
        return Response(config, headers=HEADERS)

    routes = [page, asset, page_config]
    if dev_token:
        from kb_rerank.core.dev import DEMO_TENANT
        from kb_rerank.http.auth import mint_token

        @post("/playground/dev-token", include_in_schema=False, sync_to_thread=False, status_code=200)
        def dev_token_handler(request: Request) -> Response[dict]:
            cfg = request.app.state.jwt
            ttl = min(DEV_TOKEN_TTL_S, cfg.max_lifetime_s)
            return Response({"token": mint_token(DEMO_TENANT, cfg, ttl_s=ttl), "tenant_id": str(DEMO_TENANT),
                             "expires_in_s": ttl}, headers=HEADERS)

        routes.append(dev_token_handler)
    return routes
