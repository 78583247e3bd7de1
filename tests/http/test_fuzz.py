"""Hostile input on the HTTP API: hypothesis bodies and strings (never a 5xx, 4xx are JSON
with an error field, a rejected request writes no row), schemathesis against the OpenAPI
schema in process, the search SQL functions with hypothesis text, JWT attacks at the
HTTP level (those test_rerank_route.py does not have), streamed oversized bodies, rate limiting."""

from __future__ import annotations

import time
import uuid

import jwt as pyjwt
import pytest
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from litestar.testing import TestClient

from kb_rerank.core.limits import RateLimiter
from kb_rerank.app import create_app
from kb_rerank.core.session import tenant_transaction

from tests.helpers import basis
from tests.live_server import OPS, OPS_TOKEN, SECRET, URL, FakeReranker, bearer

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=50),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
QUERY = st.text(alphabet=st.characters(codec="utf-8"), min_size=0, max_size=80)  # NUL, surrogates excluded by codec
BODY = st.one_of(
    JSON,
    st.fixed_dictionaries({"query": QUERY | JSON}, optional={"source": st.sampled_from(
        ["hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation", "", "BM25", "x" * 300]) | JSON,
        "extra": JSON}),
)


@pytest.fixture(scope="module")
def fuzz_app(settings, embedder):
    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def _rows(owner_conn, tenant):
    return tuple(owner_conn.execute(f"select count(*) from kb.{t} where tenant_id = %s", [tenant]).fetchone()[0]
                 for t in ("kb_rerank_cache", "kb_rerank_audit"))


TRIED = {"bodies": 0, "raw": 0, "sql": 0, "schemathesis": 0}


@hsettings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=BODY)
def test_random_json_bodies_never_5xx_and_rejections_write_nothing(fuzz_app, owner_conn, sample_tenant, body):
    TRIED["bodies"] += 1
    before = _rows(owner_conn, sample_tenant)
    r = fuzz_app.post(URL, json=body, headers=bearer(sample_tenant))
    assert r.status_code < 500, r.text
    payload = r.json()
    if r.status_code >= 400:
        assert payload["error"]
        assert _rows(owner_conn, sample_tenant) == before
    else:
        assert r.status_code == 200 and all(0 <= x["rerank_score"] <= 1 for x in payload["results"])


@hsettings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=300) | st.text(max_size=200).map(lambda s: s.encode("utf-8", "surrogatepass")),
       ctype=st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", ""]))
def test_random_raw_bodies_never_5xx(fuzz_app, owner_conn, sample_tenant, raw, ctype):
    TRIED["raw"] += 1
    before = _rows(owner_conn, sample_tenant)
    r = fuzz_app.post(URL, content=raw, headers={**bearer(sample_tenant), "content-type": ctype})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        assert r.json()["error"]
        assert _rows(owner_conn, sample_tenant) == before


def test_nul_huge_numbers_deep_nesting(fuzz_app, owner_conn, sample_tenant):
    before = _rows(owner_conn, sample_tenant)
    deep = b'{"query": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    for raw in (b'{"query": "a\\u0000b"}', b'{"query": 1e999999}', b'{"query": "x", "source": 123456789012345678901234567890}',
                deep, b'{"query": "\\ud800"}', b'{"query": "ok"}' + b" " * 10 + b"{}", b"\xff\xfe"):
        r = fuzz_app.post(URL, content=raw, headers={**bearer(sample_tenant), "content-type": "application/json"})
        assert 400 <= r.status_code < 500, (raw[:40], r.status_code, r.text[:200])
        assert r.json()["error"]
    assert _rows(owner_conn, sample_tenant) == before


def test_streamed_oversized_body_is_413_and_writes_nothing(fuzz_app, owner_conn, sample_tenant):
    before = _rows(owner_conn, sample_tenant)

    def chunks():
        yield b'{"query": "'
        for _ in range(100):
            yield b"a" * 1000
        yield b'"}'

    r = fuzz_app.post(URL, content=chunks(), headers={**bearer(sample_tenant), "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "payload_too_large"
    assert _rows(owner_conn, sample_tenant) == before


def test_schemathesis_openapi_in_process(settings, embedder, sample_tenant):
    import schemathesis
    from schemathesis.checks import not_a_server_error
    from schemathesis.python import asgi
    from schemathesis.specs.openapi.checks import response_schema_conformance

    app = create_app(settings.with_(jwt_secret=SECRET, rate_limit_per_minute=0), reranker=FakeReranker(),
                     embedder=embedder)
    schema = schemathesis.openapi.from_asgi("/schema/openapi.json", app)
    headers = bearer(sample_tenant)
    with asgi.get_client(app) as session:  # one lifespan (pool, model) for every case
        for operation in schema.get_all_operations():
            op = operation.ok()

            @hsettings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
            @given(case=op.as_strategy())
            def run(case):
                TRIED["schemathesis"] += 1
                case.call_and_validate(session=session, headers=headers,
                                       checks=[not_a_server_error, response_schema_conformance])

            run()
    assert TRIED["schemathesis"] > 0


@hsettings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(max_size=200).filter(lambda s: "\x00" not in s))
def test_search_functions_with_random_text(app_conn, sample_tenant, text):
    TRIED["sql"] += 1
    with tenant_transaction(app_conn, sample_tenant):
        for sql, params in (("select count(*) from kb.search_lexical(%s, 20)", [text]),
                            ("select count(*) from kb.search_hybrid(%s, %s, 20)", [text, basis(1)]),
                            ("select count(*) from kb.search_term_counts(%s)", [text]), ("select kb.to_tsv(%s)", [text])):
            app_conn.execute(sql, params).fetchone()


# --------------------------------------------------------------------------- JWT at the HTTP level


def _rsa():
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return priv, pub


def _claims(tenant, **kw):
    now = int(time.time())
    c = {"tenant_id": str(tenant), "exp": now + 300, "iat": now, "iss": "kb-issuer", "aud": "kb-api"}
    c.update(kw)
    return {k: v for k, v in c.items() if v is not None}


def _tamper(token: str, tenant) -> str:
    import base64
    import json

    h, p, sig = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4)))
    claims["tenant_id"] = str(tenant)
    p2 = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"{h}.{p2}.{sig}"


def test_jwt_attacks_are_401_and_write_nothing(settings, embedder, owner_conn):
    priv, pub = _rsa()
    victim = uuid.uuid4()
    now = int(time.time())
    hs = settings.with_(jwt_secret=SECRET, jwt_issuer="kb-issuer", jwt_audience="kb-api", rate_limit_per_minute=0)
    rs = settings.with_(jwt_secret=None, jwt_public_key=pub, jwt_issuer="kb-issuer", jwt_audience="kb-api",
                        rate_limit_per_minute=0)
    good_hs = pyjwt.encode(_claims(victim), SECRET, algorithm="HS256")
    good_rs = pyjwt.encode(_claims(victim), priv, algorithm="RS256")
    cases = [
        (hs, {
            "alg_none": (pyjwt.encode(_claims(victim), None, algorithm="none"), None),
            "rs256_token_on_hs_config": (good_rs, "invalid_signature"),
            "expired": (pyjwt.encode(_claims(victim, exp=now - 600, iat=now - 900), SECRET), "expired"),
            "not_yet_valid_nbf": (pyjwt.encode(_claims(victim, nbf=now + 600), SECRET), "not_yet_valid"),
            "iat_in_future": (pyjwt.encode(_claims(victim, iat=now + 600), SECRET), "not_yet_valid"),
            "wrong_audience": (pyjwt.encode(_claims(victim, aud="other"), SECRET), "bad_audience"),
            "no_audience": (pyjwt.encode(_claims(victim, aud=None), SECRET), "bad_audience"),
            "wrong_issuer": (pyjwt.encode(_claims(victim, iss="evil"), SECRET), "bad_issuer"),
            "no_exp": (pyjwt.encode(_claims(victim, exp=None), SECRET), "missing_exp"),
            "tampered_payload": (_tamper(good_hs, uuid.uuid4()), "invalid_signature"),
            "missing_tenant": (pyjwt.encode(_claims(victim, tenant_id=None), SECRET), "missing_tenant"),
            "bad_tenant": (pyjwt.encode(_claims(victim, tenant_id="'; set role postgres; --"), SECRET), "bad_tenant"),
            "huge": ("a" * 20000, "malformed"),
        }),
        (rs, {
            "hs256_signed_with_public_key": (pyjwt.encode(_claims(victim), pub.encode(), algorithm="HS256")
                                             if _hmac_allows_pem() else _forge_hs_with(pub, victim), "invalid_signature"),
            "tampered_payload_rs": (_tamper(good_rs, uuid.uuid4()), "invalid_signature"),
            "alg_none_rs": (pyjwt.encode(_claims(victim), None, algorithm="none"), None),
        }),
    ]
    for s, tokens in cases:
        app = create_app(s, reranker=FakeReranker(), embedder=embedder)
        with TestClient(app) as client:
            good = good_hs if s is hs else good_rs
            assert client.post(URL, json={"query": "jwt ok"}, headers={"Authorization": f"Bearer {good}"}).status_code == 200
            for name, (token, reason) in tokens.items():
                r = client.post(URL, json={"query": "jwt attack"}, headers={"Authorization": f"Bearer {token}"})
                assert r.status_code == 401, (name, r.text)
                body = r.json()
                assert body["error"] == "unauthorized" and body["reason"], name
                if reason:
                    assert body["reason"] == reason, (name, body)
    # only the two good requests wrote anything for the victim
    assert owner_conn.execute("select count(*) from kb.kb_rerank_audit where tenant_id = %s", [victim]).fetchone()[0] == 2


def _hmac_allows_pem() -> bool:
    try:
        pyjwt.encode({"a": 1}, b"-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----", algorithm="HS256")
        return True
    except Exception:
        return False


def _forge_hs_with(pub: str, tenant) -> str:
    """HS256 keyed with the PEM public key, built by hand (PyJWT refuses to do it)."""
    import base64
    import hashlib
    import hmac
    import json

    def b64(b):
        return base64.urlsafe_b64encode(b).rstrip(b"=").decode()

    h = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    p = b64(json.dumps(_claims(tenant)).encode())
    sig = hmac.new(pub.encode(), f"{h}.{p}".encode(), hashlib.sha256).digest()
    return f"{h}.{p}.{b64(sig)}"


# --------------------------------------------------------------------------- rate limiting


def test_rate_limit_per_tenant_429_with_retry_after(settings, embedder, owner_conn):
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, rate_limit_per_minute=60,
                                    rate_limit_burst=5, rate_cost_per_embedding=0,
                                    rate_cost_per_pair=0),  # one token a request here (costs: test_limits)
                     reranker=FakeReranker(), embedder=embedder)
    noisy, quiet = uuid.uuid4(), uuid.uuid4()
    with TestClient(app) as client:
        statuses = [client.post(URL, json={"query": f"rate {i}"}, headers=bearer(noisy)).status_code for i in range(5)]
        assert statuses == [200] * 5
        r = client.post(URL, json={"query": "rate over"}, headers=bearer(noisy))
        assert r.status_code == 429 and r.json()["error"] == "rate_limited"
        assert 1 <= int(r.headers["retry-after"]) <= 2 and r.headers["x-trace-id"]
        # invalid bodies count too, and are 429 before parsing
        assert client.post(URL, content=b"{bad", headers=bearer(noisy)).status_code == 429
        # another tenant is not affected
        assert client.post(URL, json={"query": "rate quiet"}, headers=bearer(quiet)).status_code == 200
        time.sleep(1.1)  # one token refills per second
        assert client.post(URL, json={"query": "rate after wait"}, headers=bearer(noisy)).status_code == 200
        assert 'kb_rerank_rejected_total{reason="rate_limited"} 2.0' in client.get("/metrics", headers=OPS).text
    # the refused requests wrote nothing: 6 answered requests, 6 audit rows
    assert owner_conn.execute("select count(*) from kb.kb_rerank_audit where tenant_id = %s", [noisy]).fetchone()[0] == 6
    assert owner_conn.execute("select count(*) from kb.kb_rerank_audit where tenant_id = %s", [quiet]).fetchone()[0] == 1


def test_rate_limiter_unit_disable_refill_and_bounded_memory():
    now = [0.0]
    rl = RateLimiter(60, 2, max_tenants=3, clock=lambda: now[0])
    assert [rl.acquire("a") for _ in range(3)] == [0.0, 0.0, 1.0]
    now[0] += 0.5
    assert rl.acquire("a") == pytest.approx(0.5)
    now[0] += 0.5
    assert rl.acquire("a") == 0.0
    for t in range(10):
        rl.acquire(f"t{t}")
    assert len(rl) <= 3
    off = RateLimiter(0, 60)
    assert all(off.acquire("x") == 0.0 for _ in range(1000)) and len(off) == 0


def test_report_inputs_tried():
    print(f"\nFUZZ inputs tried: {TRIED}")
