"""One body decoder and real body limits on
every JSON route, and `kb-rerank serve` with nothing but the app role's URL.

* Item 10: deeply nested JSON answered 500 on /v2/rerank and /v1/kb/context (the rerank
  route answered 400). Every malformed body now gets the same 4xx JSON on all three routes.
* Item 5: /v2/rerank accepted 64 MiB at the route and checked KB_V2_MAX_BODY_BYTES after
  reading the whole body (four parallel 60 MB posts grew the server by ~350 MB). Each
  route's limit is now its setting, enforced while reading; tested on a real server process.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from litestar.testing import TestClient

from kb_rerank.endpoints.search.route import PATH as RERANK_PATH
from kb_rerank.app import create_app
from kb_rerank.testing.tiny_model import build_tiny_cross_encoder
from kb_rerank.endpoints.context.route import PATH as CONTEXT_PATH
from kb_rerank.endpoints.v2_rerank.route import PATH as V2_RERANK_PATH

from tests.live_server import SECRET, FakeReranker, bearer, serve_process

# a valid body of each route, to which each case adds its defect
VALID = {
    RERANK_PATH: {"query": "recurring invoice"},
    CONTEXT_PATH: {"query": "recurring invoice"},
    V2_RERANK_PATH: {"query": "recurring invoice", "documents": ["an invoice repeats every month"]},
}
ROUTES = list(VALID)
DEPTH = 10_000


def _json(obj) -> bytes:
    import json

    return json.dumps(obj).encode()


def _nested_in_field(path: str) -> bytes:
    field = "documents" if path == V2_RERANK_PATH else "query"
    other = {k: v for k, v in VALID[path].items() if k != field}
    head = _json(other)[:-1] + (b", " if other else b"")
    return head + b'"' + field.encode() + b'": ' + b"[" * DEPTH + b"]" * DEPTH + b"}"


# (name, body builder, status, error, field); field None: the body as a whole
CASES = [
    ("array_depth_10000", lambda p: b"[" * DEPTH + b"]" * DEPTH, 400, "invalid_json", None),
    ("object_depth_10000", lambda p: b'{"q":' * DEPTH + b"1" + b"}" * DEPTH, 400, "invalid_json", None),
    ("depth_10000_in_a_field", _nested_in_field, 400, "invalid_json", None),
    ("invalid_utf8", lambda p: _json(VALID[p])[:-1] + b', "x": "\xff\xfe\xfd"}', 400, "invalid_json", None),
    ("not_json", lambda p: b"{not json", 400, "invalid_json", None),
    ("truncated", lambda p: _json(VALID[p])[:-3], 400, "invalid_json", None),
    ("empty", lambda p: b"", 400, "invalid_json", None),
    ("not_an_object", lambda p: b"[1, 2]", 422, "invalid_request", None),
    ("query_wrong_type", lambda p: _json({**VALID[p], "query": 5}), 422, "invalid_request", "query"),
    ("unknown_field", lambda p: _json({**VALID[p], "bogus": 1}), 422, "invalid_request", "bogus"),
    ("missing_query", lambda p: _json({k: v for k, v in VALID[p].items() if k != "query"}), 422,
     "invalid_request", "query"),
]


@pytest.fixture(scope="module")
def client(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


def _rows(owner_conn, tenant) -> tuple[int, int]:
    return tuple(owner_conn.execute(f"select count(*) from kb.{t} where tenant_id = %s", [tenant]).fetchone()[0]
                 for t in ("kb_rerank_cache", "kb_rerank_audit"))


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("name,build,status,error,field", CASES, ids=[c[0] for c in CASES])
def test_malformed_bodies_same_answer_on_every_route(client, owner_conn, path, name, build, status, error, field):
    tenant = uuid.uuid4()
    r = client.post(path, content=build(path), headers={**bearer(tenant), "content-type": "application/json"})
    assert r.status_code == status, (name, r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert body["error"] == error and body["field"] == field and body["detail"], body
    assert _rows(owner_conn, tenant) == (0, 0)  # a rejected request writes nothing


def test_v2_field_paths_are_named(client):
    base = VALID[V2_RERANK_PATH]
    for doc, field in (({"text": "a", "zz": 1}, "documents[0].zz"), ({"text": 5}, "documents[0].text"),
                       ({"text": "a", "metadata": {"updated_at": "nope"}}, "documents[0].metadata.updated_at")):
        r = client.post(V2_RERANK_PATH, json={**base, "documents": [doc]}, headers=bearer(uuid.uuid4()))
        assert r.status_code == 422 and r.json()["field"] == field, r.text


@pytest.mark.parametrize("path", [CONTEXT_PATH, V2_RERANK_PATH])
@pytest.mark.parametrize("extra, field", [
    ({"recency_weight": 1.621614858874118e+308, "half_life_days": 1.621614858874118e+308}, "recency_weight"),
    ({"half_life_days": 1e308}, "half_life_days"),
    ({"authority_weight": 1e300}, "authority_weight"),
])
def test_numbers_that_would_overflow_the_composite_are_422(client, path, extra, field):
    """The schema fuzzer found a 500: a recency weight of 1.6e308 overflowed the composite
    score. Every caller number that enters it is bounded and named when out of range."""
    r = client.post(path, json={**VALID[path], **extra}, headers=bearer(uuid.uuid4()))
    assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_v2_caller_scores_and_authority_are_finite(client):
    base = VALID[V2_RERANK_PATH]
    for doc, field in (({"text": "a", "scores": {"bm25": 1e300}}, "documents[0].scores.bm25"),
                       ({"text": "a", "metadata": {"authority": 1e300}}, "documents[0].metadata.authority")):
        r = client.post(V2_RERANK_PATH, json={**base, "documents": [doc]}, headers=bearer(uuid.uuid4()))
        assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_v2_nul_in_any_echoed_string_is_422(client):
    """NUL in a document id (echoed in the answer, stored in jsonb) was a 500 (fuzzer)."""
    base = VALID[V2_RERANK_PATH]
    for body, field in (({**base, "documents": [{"text": "a", "id": "x\u0000"}]}, "documents[0].id"),
                        ({**base, "documents": [{"text": "a", "metadata": {"source": "\u0000"}}]},
                         "documents[0].metadata.source"),
                        ({**base, "model": "m\u0000"}, "model")):
        r = client.post(V2_RERANK_PATH, json=body, headers=bearer(uuid.uuid4()))
        assert r.status_code == 422 and r.json()["field"] == field, r.text


def test_valid_bodies_still_served(client, sample_tenant):
    for path in ROUTES:
        r = client.post(path, json=VALID[path], headers=bearer(sample_tenant))
        assert r.status_code == 200, (path, r.text[:300])


# --------------------------------------------------------------------------- item 5: limits


LIMITS = {"max_body_bytes": 20_000, "v2_max_body_bytes": 50_000}
SETTING_OF = {RERANK_PATH: "max_body_bytes", CONTEXT_PATH: "max_body_bytes", V2_RERANK_PATH: "v2_max_body_bytes"}


def _post_handler(app, path):
    for route in app.routes:
        if route.path == path:
            return route.route_handler_map["POST"][0]
    raise AssertionError(f"no route {path}")


def test_each_route_limit_is_its_setting(settings, embedder):
    """The limit Litestar enforces while reading (request_max_body_size resolved for the
    route) is the route's setting; /v2/rerank's was a 64 MiB ceiling."""
    for limits in (LIMITS, {"max_body_bytes": 65536, "v2_max_body_bytes": 4194304}):
        app = create_app(settings.with_(jwt_secret=SECRET, **limits), reranker=FakeReranker(), embedder=embedder)
        for path in ROUTES:
            assert _post_handler(app, path).resolve_request_max_body_size() == limits[SETTING_OF[path]], path


@pytest.mark.parametrize("path", ROUTES)
def test_over_the_limit_is_413_json_under_is_parsed(settings, embedder, owner_conn, path):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0, **LIMITS),
                     reranker=FakeReranker(), embedder=embedder)
    limit = LIMITS[SETTING_OF[path]]
    tenant = uuid.uuid4()
    h = {**bearer(tenant), "content-type": "application/json"}
    with TestClient(app, raise_server_exceptions=False) as c:
        # exactly the limit is read and parsed (400: not JSON); one byte more is 413
        assert c.post(path, content=b"x" * limit, headers=h).status_code == 400
        for content in (b"x" * (limit + 1), (b"x" * 1000 for _ in range(limit // 1000 + 1))):  # sized, chunked
            r = c.post(path, content=content, headers=h)
            assert r.status_code == 413, r.text[:200]
            assert r.json() == {"error": "payload_too_large", "field": None,
                                "detail": f"request body over {limit} bytes"}
        # a Content-Length over the limit is refused before any byte is read
        r = c.post(path, content=b"{}", headers={**h, "content-length": str(limit + 1)})
        assert r.status_code == 413
    assert _rows(owner_conn, tenant) == (0, 0)


# --------------------------------------------------------------------------- real server process


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class RssSampler:
    """Largest RSS of ``pid`` seen every 5 ms while running."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss(self.pid))
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


BIG = 60 * 1000 * 1000  # 60 MB per post, 4 in parallel
# Bound on the server's growth while four 60 MB posts are refused: at most one limit (4 MiB)
# per request is ever held. Measured: see the test's print (new code +~10 MB; the landed code
# +~350 MB since it read each body whole).
MAX_GROWTH = 64 * 1024 * 1024


def _post_big(base: str, headers: dict, chunked: bool) -> tuple[int | None, str]:
    prefix = b'{"query": "q", "documents": ["'
    if chunked:
        def gen():
            yield prefix
            block = b"a" * (1 << 20)
            for _ in range(BIG // len(block)):
                yield block
            yield b'"]}'
        content = gen()
    else:
        content = prefix + b"a" * BIG + b'"]}'
    try:
        r = httpx.post(base + V2_RERANK_PATH, content=content, headers={**headers, "content-type": "application/json"},
                       timeout=120)
        return r.status_code, r.text
    except httpx.TransportError as exc:  # the server may close a connection still sending
        return None, type(exc).__name__


@pytest.fixture(scope="module")
def app_url_only_server(app_url, tmp_path_factory):
    """`kb-rerank serve` in a child process whose environment holds only the app role's URL:
    no KB_DATABASE_URL (owner), no KB_APP_PASSWORD, and a data dir that does not exist (so
    the embedded server cannot be started behind our back)."""
    tmp = tmp_path_factory.mktemp("limits-server")
    model_dir = build_tiny_cross_encoder(tmp / "ce", seed=0)
    nodata = tmp / "no-embedded-server-here"
    env = {"KB_DATABASE_URL": "", "KB_APP_PASSWORD": "", "KB_APP_DATABASE_URL": app_url, "KB_DATA_DIR": str(nodata),
           "KB_JWT_SECRET": SECRET, "KB_RERANKER_MODEL": str(model_dir), "KB_RATE_LIMIT_PER_MINUTE": "0",
           "KB_WORKERS": "1", "KB_AUDIT_KEY": "a3f1" + secrets.token_hex(20), "KB_QUERY_HASH_KEY": secrets.token_hex(24)}
    with serve_process(env, tmp / "server.log") as (base, proc):
        yield base, proc
    assert not nodata.exists()  # nothing written locally: no embedded server, no generated key file


def test_serve_with_only_the_app_url(app_url_only_server, owner_conn):
    base, proc = app_url_only_server
    tenant = uuid.uuid4()
    for path in ROUTES:
        r = httpx.post(base + path, json=VALID[path], headers=bearer(tenant), timeout=60)
        assert r.status_code == 200, (path, r.text[:300])
    assert owner_conn.execute("select count(*) from kb.kb_rerank_audit where tenant_id = %s",
                              [tenant]).fetchone()[0] == len(ROUTES)


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
def test_oversized_posts_refused_without_growing_the_server(app_url_only_server, chunked):
    base, proc = app_url_only_server
    headers = bearer(uuid.uuid4())
    # warm: one small v2 request, so the first-use allocations are in the baseline
    assert httpx.post(base + V2_RERANK_PATH, json=VALID[V2_RERANK_PATH], headers=headers, timeout=60).status_code == 200
    time.sleep(0.2)
    before = _rss(proc.pid)
    t0 = time.monotonic()
    with RssSampler(proc.pid) as sampler, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: _post_big(base, headers, chunked), range(4)))
    elapsed = time.monotonic() - t0
    growth = sampler.peak - before
    print(f"\nLIMITS: 4 x {BIG / 1e6:.0f} MB {'chunked' if chunked else 'with Content-Length'} to /v2/rerank: "
          f"{[r[0] for r in results]} in {elapsed:.1f}s; server RSS {before / 2**20:.0f} MiB -> peak "
          f"{sampler.peak / 2**20:.0f} MiB (+{growth / 2**20:.1f} MiB)")
    for status, text in results:
        assert status == 413 or status is None, (status, text[:200])
    assert any(status == 413 for status, _ in results), results  # the answer reaches the client
    for status, text in results:
        if status == 413:
            assert '"payload_too_large"' in text
    assert growth < MAX_GROWTH, f"server grew {growth / 2**20:.0f} MiB"
    # and it still serves
    assert httpx.post(base + V2_RERANK_PATH, json=VALID[V2_RERANK_PATH], headers=headers, timeout=60).status_code == 200
