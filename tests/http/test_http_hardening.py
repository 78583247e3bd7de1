"""The HTTP server's defences against cheap floods, and its docs page:

* a 4xx writes no traceback (a flood of 404s or 401s wrote ~1.8 KB of log each); a 500 still does;
* slow request heads are closed after KB_HTTP_HEADER_TIMEOUT_S, connections over
  KB_HTTP_LIMIT_CONCURRENCY get 503, an idle keep-alive connection is closed, an oversized
  request head is refused -- on a real uvicorn server built by the same function as `kb-rerank serve`;
* X-Forwarded-For is ignored unless KB_FORWARDED_ALLOW_IPS names the peer (a forged header
  gave every request a fresh per-address bucket);
* /schema is a page without script or third-party origin, under a strict CSP, and KB_DOCS_PAGE
  removes it (the OpenAPI document stays);
* `serve --dev` refuses a non-loopback host.

None of these needs the database: the servers run without the lifespan (the routes used, the
unknown path, the auth guard, /healthz and /schema, do not touch the pool).
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import socket
import time
from typing import Iterator

import httpx
import pytest
import uvicorn
from litestar import get
from litestar.testing import TestClient

from kb_rerank.cli import main as cli
from kb_rerank.http import server
from kb_rerank.app import create_app
from kb_rerank.core.logs import JsonFormatter
from kb_rerank.core.settings import Settings

from tests.live_server import SECRET, free_port, run_server

RERANK = "/v1/kb/search/rerank"


def _settings(**kw) -> Settings:
    return Settings().with_(jwt_secret=SECRET, **kw)


# --------------------------------------------------------------------------- logs


@contextlib.contextmanager
def _captured_logs() -> Iterator[io.StringIO]:
    """What `serve`'s root handler would write (JSON lines, INFO and up), into a buffer."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    # the test client's own records (httpx logs each request it sends) are not the server's
    handler.addFilter(lambda record: not record.name.startswith(("httpx", "httpcore")))
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield buf
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


def _boom_app(settings: Settings):
    app = create_app(settings)

    @get("/test-boom", sync_to_thread=False)
    def boom() -> None:
        raise RuntimeError("test failure inside a handler")

    app.register(boom)
    return app


def test_4xx_floods_write_no_traceback_and_bounded_bytes():
    """Old code: LoggingConfig(log_exceptions="always") logged every 404 and 401 at ERROR with
    its traceback (about 1.8 KB each). Now a 4xx writes at most its access record."""
    n = 150
    app = _boom_app(_settings())
    client = TestClient(app)  # not entered: no lifespan, no database
    with _captured_logs() as buf:
        for i in range(n):
            assert client.get(f"/no-such-path-{i}").status_code == 404
            assert client.post(RERANK, json={"query": "q"},
                               headers={"Authorization": "Bearer not-a-token"}).status_code == 401
    out = buf.getvalue()
    assert "Traceback" not in out
    assert '"level": "ERROR"' not in out
    # one access record a request at most (~250 bytes); a traceback each would be ~1.8 KB
    assert len(out.encode()) <= 2 * n * 400, len(out)
    assert len(out.splitlines()) <= 2 * n


def test_a_500_still_logs_its_traceback():
    app = _boom_app(_settings())
    client = TestClient(app, raise_server_exceptions=False)
    with _captured_logs() as buf:
        assert client.get("/test-boom").status_code == 500
    errors = [line for line in buf.getvalue().splitlines() if '"level": "ERROR"' in line]
    assert len(errors) == 1, buf.getvalue()
    assert "Traceback" in errors[0] and "test failure inside a handler" in errors[0]


# --------------------------------------------------------------------------- a real server


@contextlib.contextmanager
def _serve(settings: Settings) -> Iterator[tuple[int, uvicorn.Server]]:
    """uvicorn with `kb-rerank serve`'s config (server.server_config) on a free loopback port,
    in a thread; the app without its lifespan (no database)."""
    port = free_port()
    config = server.server_config(create_app(settings), settings, host="127.0.0.1", port=port,
                                  lifespan="off", timeout_graceful_shutdown=2)
    srv = uvicorn.Server(config)
    with run_server(srv, startup_timeout=30, stop_timeout=15):
        yield port, srv


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.settimeout(5)
    return s


def _closed_by_server(s: socket.socket) -> bool:
    """True when the server has closed the connection (EOF or reset), without waiting."""
    s.setblocking(False)
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionError:
        return True
    finally:
        s.setblocking(True)


def _status(raw: bytes) -> int:
    m = re.match(rb"HTTP/1\.1 (\d{3})", raw)
    assert m, raw[:200]
    return int(m.group(1))


def _read_response(s: socket.socket) -> int:
    """Read one whole response (head, then Content-Length bytes of body); its status."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = s.recv(65536)
        assert chunk, raw
        raw += chunk
    head, body = raw.split(b"\r\n\r\n", 1)
    m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while m and len(body) < int(m.group(1)):
        chunk = s.recv(65536)
        assert chunk
        body += chunk
    return _status(head)


def _get(port: int, path: str = "/healthz") -> int:
    with _connect(port) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        return _read_response(s)


def test_slow_headers_are_closed_and_connections_over_the_limit_get_503():
    """Old code: 300 connections sending one header line every 2 s all stayed open (uvicorn has
    no header timeout, and no limit_concurrency was set)."""
    limit, timeout_s = 4, 1.5
    with _serve(_settings(http_limit_concurrency=limit, http_header_timeout_s=timeout_s)) as (port, _):
        assert _get(port) == 200
        slow = [_connect(port) for _ in range(limit)]
        for s in slow:
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.2)
        # the slow connections fill the limit: a complete request is answered 503 at once
        assert _get(port) == 503
        # drip one header line every 0.3 s: the deadline is on the whole head, not per line
        t0 = time.monotonic()
        closed: set[int] = set()
        while len(closed) < len(slow) and time.monotonic() - t0 < timeout_s + 3:
            for i, s in enumerate(slow):
                if i in closed:
                    continue
                if _closed_by_server(s):
                    closed.add(i)
                    continue
                with contextlib.suppress(OSError):
                    s.sendall(f"X-Drip-{int((time.monotonic() - t0) * 10)}: 1\r\n".encode())
            time.sleep(0.3)
        elapsed = time.monotonic() - t0
        for s in slow:
            s.close()
        assert len(closed) == len(slow), f"{len(slow) - len(closed)} slow connections still open after {elapsed:.1f} s"
        assert elapsed >= timeout_s - 0.5
        # the limit frees up once they are gone
        assert _get(port) == 200


def test_idle_keep_alive_connection_is_closed_and_big_heads_are_refused():
    with _serve(_settings(http_keep_alive_s=1, http_header_timeout_s=5, http_max_header_bytes=4096)) as (port, _):
        with _connect(port) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _read_response(s) == 200
            t0 = time.monotonic()
            assert s.recv(4096) == b""  # blocks until the server closes (socket timeout 5 s)
            assert 0.5 <= time.monotonic() - t0 < 4
        with _connect(port) as s:
            # a head still incomplete past KB_HTTP_MAX_HEADER_BYTES: refused, not buffered on
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 8000)
            assert _read_response(s) == 400


def _bad_token_statuses(port: int, n: int, forwarded) -> list[int]:
    out = []
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as c:
        for i in range(n):
            out.append(c.post(RERANK, json={"query": "q"}, headers={
                "Authorization": "Bearer not-a-token", "X-Forwarded-For": forwarded(i)}).status_code)
    return out


BUCKET = {"address_rate_limit_burst": 5, "address_rate_limit_per_minute": 1}


def test_forged_x_forwarded_for_does_not_reset_the_address_bucket():
    """Old code: uvicorn's defaults trusted X-Forwarded-For from 127.0.0.1, so each forged
    address got a fresh bucket (900 bad-token posts: 900 x 401, no 429)."""
    with _serve(_settings(**BUCKET)) as (port, _):
        statuses = _bad_token_statuses(port, 12, lambda i: f"198.51.100.{i + 1}")
    assert statuses[:5] == [401] * 5
    assert set(statuses[5:]) == {429}, statuses


def test_x_forwarded_for_is_honoured_from_a_configured_proxy():
    with _serve(_settings(forwarded_allow_ips="127.0.0.1", **BUCKET)) as (port, _):
        # each forwarded address has its own bucket ...
        assert _bad_token_statuses(port, 12, lambda i: f"198.51.100.{i + 1}") == [401] * 12
        # ... and one forwarded address is still limited
        same = _bad_token_statuses(port, 8, lambda i: "203.0.113.7")
    assert same[:5] == [401] * 5 and set(same[5:]) == {429}, same


def test_forwarded_allow_ips_parsing_and_serve_defaults():
    cfg = server.server_config("x:y", _settings())
    assert cfg.proxy_headers is False and cfg.limit_concurrency == 1000 and cfg.timeout_keep_alive == 5
    assert cfg.header_timeout_s == 10.0 and cfg.h11_max_incomplete_event_size == 16384
    assert cfg.http is server.HeaderTimeoutProtocol
    cfg = server.server_config("x:y", _settings(forwarded_allow_ips=" 10.0.0.1, 10.1.0.0/16 ,"))
    assert cfg.proxy_headers is True and cfg.forwarded_allow_ips == ["10.0.0.1", "10.1.0.0/16"]


# --------------------------------------------------------------------------- docs page


def test_docs_page_has_no_external_origin_and_a_strict_csp():
    """Old code: /schema was Swagger UI loaded from a CDN, without integrity hashes or CSP."""
    client = TestClient(create_app(_settings()))
    r = client.get("/schema")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    page = r.text
    assert "<script" not in page.lower()
    # every URL in the page is relative to this origin (no scheme, no //host)
    for url in re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)["']""", page, flags=re.I):
        assert url.startswith(("/", "#", "data:")) and not url.startswith("//"), url
    assert not re.search(r"https?://", page.split("</style>")[0])
    csp = r.headers["content-security-policy"]
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives["default-src"] == ["'none'"]
    assert "script-src" not in directives  # falls back to 'none'
    assert directives["frame-ancestors"] == ["'none'"]
    assert all(src.startswith("'sha256-") for src in directives["style-src"])
    assert r.headers["x-content-type-options"] == "nosniff"
    assert RERANK in page and "/v2/rerank" in page  # the routes are documented on it
    assert client.get("/schema/openapi.json").json()["paths"][RERANK]


def test_docs_page_setting_removes_the_page_and_keeps_the_document():
    client = TestClient(create_app(_settings(docs_page=False)))
    assert client.get("/schema").status_code == 404
    assert client.get("/schema/swagger").status_code == 404
    r = client.get("/schema/openapi.json")
    assert r.status_code == 200 and RERANK in r.json()["paths"]


def test_docs_page_escapes_the_document():
    from kb_rerank.endpoints.docs.route import render_reference

    page = render_reference({"info": {"title": "<script>alert(1)</script>"},
                             "paths": {"/x": {"get": {"summary": "<img src=x onerror=alert(1)>",
                                                      "responses": {"200": {"description": "ok"}}}}}},
                            "/schema/openapi.json")
    assert "<script>" not in page and "<img" not in page and "&lt;script&gt;" in page


# --------------------------------------------------------------------------- serve --dev


@pytest.fixture
def no_keys(monkeypatch):
    """No key in the environment (serve --dev then uses the development secret); serve's
    uvicorn run replaced by a recorder."""
    for var in ("KB_JWT_SECRET", "KB_JWT_PUBLIC_KEY", "KB_JWT_JWKS_URL", "KB_HOST", "KB_SERVE_DEV"):
        monkeypatch.setenv(var, "")  # recorded, so that what cmd_serve sets is undone after the test
        monkeypatch.delenv(var)
    started: list = []
    monkeypatch.setattr(server, "run", lambda config: started.append(config) or 0)
    monkeypatch.setattr("kb_rerank.cli.serve._check_embedded_database", lambda s: None)  # no database here
    return started


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", "example.org", "127.0.0.2x"])
def test_serve_dev_refuses_a_non_loopback_host(no_keys, capsys, host):
    assert cli.main(["serve", "--dev", "--host", host]) == 2
    assert not no_keys
    err = capsys.readouterr().err
    assert "loopback" in err and repr(host) in err


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_serve_dev_accepts_a_loopback_host(no_keys, host):
    assert cli.main(["serve", "--dev", "--host", host]) == 0
    assert len(no_keys) == 1 and no_keys[0].host == host
    assert no_keys[0].proxy_headers is False


def test_serve_dev_with_an_own_secret_may_listen_anywhere(no_keys, monkeypatch):
    monkeypatch.setenv("KB_JWT_SECRET", SECRET)
    assert cli.main(["serve", "--dev", "--host", "0.0.0.0"]) == 0
    assert len(no_keys) == 1
