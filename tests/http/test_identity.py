"""Identity that fits real providers: keys from a JWKS served on loopback
(fetched off the event loop, cached, rotation by ``kid`` with a bounded refetch), ES256 and
EdDSA besides HS256/RS256, the tenant at a dotted claim path, audience and issuer required
when configured, secrets from ``*_FILE`` variables."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt as pyjwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm
from litestar.testing import TestClient

from kb_rerank.app import create_app, jwt_config
from kb_rerank.http.auth import AuthError, JwksKeys, JwksUnavailable, JwtConfig, tenant_from_authorization
from kb_rerank.core.settings import Settings, SettingsError

from tests.live_server import FakeReranker

URL = "/v1/kb/search/rerank"
AUD, ISS = "kb-api", "https://id.example.test/"


# --------------------------------------------------------------------------- keys and a JWKS server


def es256_key():
    return ec.generate_private_key(ec.SECP256R1())


def eddsa_key():
    return ed25519.Ed25519PrivateKey.generate()


def rs256_key():
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwk(private_key, kid: str) -> dict:
    pub = private_key.public_key()
    algo = {ec.EllipticCurvePrivateKey: ECAlgorithm, ed25519.Ed25519PrivateKey: OKPAlgorithm,
            rsa.RSAPrivateKey: RSAAlgorithm}
    cls = next(a for base, a in algo.items() if isinstance(private_key, base))
    return {**cls.to_jwk(pub, as_dict=True), "kid": kid, "use": "sig"}


def alg_of(private_key) -> str:
    if isinstance(private_key, ec.EllipticCurvePrivateKey):
        return "ES256"
    if isinstance(private_key, ed25519.Ed25519PrivateKey):
        return "EdDSA"
    return "RS256"


def pem(private_key) -> str:
    return private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def token(private_key, kid: str | None, tenant, *, claim: str = "tenant_id", aud=AUD, iss=ISS, alg=None,
          ttl: int = 600) -> str:
    now = int(time.time())
    payload: dict = {"sub": "u1", "iat": now, "exp": now + ttl}
    if aud is not None:
        payload["aud"] = aud
    if iss is not None:
        payload["iss"] = iss
    *parents, last = claim.split(".")
    node = payload
    for p in parents:
        node = node.setdefault(p, {})
    node[last] = str(tenant)
    headers = {"kid": kid} if kid is not None else None
    return pyjwt.encode(payload, private_key, algorithm=alg or alg_of(private_key), headers=headers)


class JwksServer:
    """A JWK Set on 127.0.0.1 (a ThreadingHTTPServer in a thread); ``keys`` can change while
    it runs (a provider's rotation); ``hits`` counts the fetches; ``delay_s`` slows them;
    ``hold``, when set, keeps a fetch waiting until that event is set (at most 10 s)."""

    def __init__(self, keys: list[dict]) -> None:
        self.keys, self.hits, self.delay_s = list(keys), 0, 0.0
        self.hold: threading.Event | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                outer.hits += 1
                if outer.hold is not None:
                    outer.hold.wait(10.0)
                if outer.delay_s:
                    time.sleep(outer.delay_s)
                body = json.dumps({"keys": outer.keys}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # quiet
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/.well-known/jwks.json"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "JwksServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def app_client(settings, embedder, **changes):
    s = settings.with_(jwt_secret=None, jwt_audience=AUD, jwt_issuer=ISS, rate_limit_per_minute=0,
                       address_rate_limit_per_minute=0, **changes)
    app = create_app(s, reranker=FakeReranker(), embedder=embedder)
    with TestClient(app) as client:
        yield client, app


def search(client, tok: str):
    return client.post(URL, json={"query": "ERR_402 payment", "source": "lexical_only"},
                       headers={"Authorization": "Bearer " + tok})


# --------------------------------------------------------------------------- through the app


def test_jwks_es256_and_eddsa_with_rotation_and_dotted_tenant_claim(settings, embedder, sample_tenant):
    k1, k2 = es256_key(), eddsa_key()
    with JwksServer([jwk(k1, "k1")]) as idp, \
            app_client(settings, embedder, jwt_jwks_url=idp.url, jwt_jwks_min_refresh_s=0.0,
                       jwt_tenant_claim="app_metadata.tenant_id") as (client, _app):
        r = search(client, token(k1, "k1", sample_tenant, claim="app_metadata.tenant_id"))
        assert r.status_code == 200, r.text
        assert r.json()["results"], "the tenant came from app_metadata.tenant_id: its documents are found"
        assert idp.hits == 1
        # cached: a second request fetches nothing
        assert search(client, token(k1, "k1", sample_tenant, claim="app_metadata.tenant_id")).status_code == 200
        assert idp.hits == 1
        # an EdDSA key the provider does not publish yet: refetched once, still unknown -> 401
        r = search(client, token(k2, "k2", sample_tenant, claim="app_metadata.tenant_id"))
        assert r.status_code == 401 and r.json() == {"error": "unauthorized", "reason": "unknown_key"}
        assert idp.hits == 2
        # the provider rotates: k2 is published; the next token with kid k2 is accepted
        idp.keys = [jwk(k1, "k1"), jwk(k2, "k2")]
        r = search(client, token(k2, "k2", sample_tenant, claim="app_metadata.tenant_id"))
        assert r.status_code == 200, r.text
        assert idp.hits == 3
        # the tenant claim at the top level is not what this config reads
        r = search(client, token(k1, "k1", sample_tenant))
        assert r.status_code == 401 and r.json()["reason"] == "missing_tenant"


@pytest.mark.parametrize("aud,iss,reason", [
    ("someone-else", ISS, "bad_audience"),
    (None, ISS, "bad_audience"),  # required when configured
    (AUD, "https://evil.example.test/", "bad_issuer"),
    (AUD, None, "bad_issuer"),
])
def test_jwks_wrong_or_missing_audience_and_issuer_are_401_json(settings, embedder, sample_tenant, aud, iss, reason):
    k1 = es256_key()
    with JwksServer([jwk(k1, "k1")]) as idp, app_client(settings, embedder, jwt_jwks_url=idp.url) as (client, _):
        assert search(client, token(k1, "k1", sample_tenant)).status_code == 200
        r = search(client, token(k1, "k1", sample_tenant, aud=aud, iss=iss))
        assert r.status_code == 401
        assert r.headers["content-type"].startswith("application/json")
        assert r.json() == {"error": "unauthorized", "reason": reason}


def test_jwks_refuses_alg_confusion_and_unknown_kids_refetch_bounded(settings, embedder, sample_tenant):
    k1 = rs256_key()
    with JwksServer([jwk(k1, "k1")]) as idp, \
            app_client(settings, embedder, jwt_jwks_url=idp.url, jwt_jwks_min_refresh_s=60.0) as (client, _):
        assert search(client, token(k1, "k1", sample_tenant)).status_code == 200
        assert idp.hits == 1
        # an HS256 token keyed with the published public key (the classic confusion)
        forged = pyjwt.encode({"tenant_id": str(sample_tenant), "aud": AUD, "iss": ISS, "exp": int(time.time()) + 60},
                              "x" * 40, algorithm="HS256", headers={"kid": "k1"})
        r = search(client, forged)
        assert r.status_code == 401 and r.json()["reason"] == "invalid_signature"
        # twenty tokens with made-up kids: at most one refetch per jwt_jwks_min_refresh_s (60 s)
        other = es256_key()
        for i in range(20):
            r = search(client, token(other, f"random-{i}", sample_tenant))
            assert r.status_code == 401 and r.json()["reason"] == "unknown_key"
        assert idp.hits <= 2


def test_jwks_unreachable_is_503_json(settings, embedder, sample_tenant):
    k1 = es256_key()
    idp = JwksServer([jwk(k1, "k1")])
    url = idp.url
    idp.httpd.server_close()  # nothing listens there
    with app_client(settings, embedder, jwt_jwks_url=url, jwt_jwks_timeout_s=1.0) as (client, _):
        r = search(client, token(k1, "k1", sample_tenant))
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "identity_keys_unavailable" and "Retry-After" in r.headers


# --------------------------------------------------------------------------- the key cache alone


def test_jwks_fetch_runs_off_the_event_loop_with_a_timeout():
    k1 = es256_key()
    tenant = uuid.uuid4()
    with JwksServer([jwk(k1, "k1")]) as idp:
        cfg = JwtConfig(jwks_url=idp.url, jwks_timeout_s=2.0)
        keys = JwksKeys(cfg)
        # the provider answers only once the event loop has run while the fetch was pending:
        # a fetch that blocked the loop would wait the hold's 10 s out and fail the check below
        idp.hold = threading.Event()

        async def run() -> bool:
            fetch = asyncio.create_task(keys.key_for(token(k1, "k1", tenant)))
            while idp.hits == 0 and not fetch.done():
                await asyncio.sleep(0.001)
            idp.hold.set()  # the loop ran while the provider held the fetch
            key = await fetch
            assert key.key_id == "k1"
            return True

        t0 = time.monotonic()
        assert asyncio.run(run())
        assert time.monotonic() - t0 < 9.0, "the fetch blocked the event loop until the provider gave up holding it"
        idp.hold = None
        # a provider slower than the timeout: 503 (JwksUnavailable) in about the timeout, not its delay
        idp.delay_s = 5.0
        slow = JwksKeys(JwtConfig(jwks_url=idp.url, jwks_timeout_s=0.3))
        t0 = time.monotonic()
        with pytest.raises(JwksUnavailable):
            asyncio.run(slow.key_for(token(k1, "k1", tenant)))
        assert time.monotonic() - t0 < 2.5
        idp.delay_s = 0.0


def test_jwks_last_good_keys_serve_when_a_refetch_fails():
    k1 = es256_key()
    idp = JwksServer([jwk(k1, "k1")])
    with idp:
        keys = JwksKeys(JwtConfig(jwks_url=idp.url, jwks_max_age_s=0.2, jwks_min_refresh_s=0.0,
                                  jwks_timeout_s=1.0))
        tok = token(k1, "k1", uuid.uuid4())
        assert asyncio.run(keys.key_for(tok)).key_id == "k1"
    time.sleep(0.3)  # the cache expired, and the provider is gone
    assert asyncio.run(keys.key_for(tok)).key_id == "k1"
    assert keys.fetches == 2


# --------------------------------------------------------------------------- static keys, claims, settings


@pytest.mark.parametrize("make", [es256_key, eddsa_key, rs256_key])
def test_static_public_keys_of_each_algorithm(make):
    key = make()
    cfg = JwtConfig(public_key=pem(key), audience=AUD, issuer=ISS)
    assert cfg.algorithm == alg_of(key)
    tenant = uuid.uuid4()
    assert tenant_from_authorization("Bearer " + token(key, None, tenant), cfg) == tenant
    # a token of another key of the same kind: invalid signature
    with pytest.raises(AuthError) as e:
        tenant_from_authorization("Bearer " + token(make(), None, tenant), cfg)
    assert e.value.reason == "invalid_signature"


def test_other_curves_are_refused():
    with pytest.raises(ValueError, match="P-256"):
        JwtConfig(public_key=pem(ec.generate_private_key(ec.SECP384R1())))


def test_tenant_claim_paths():
    secret = "kb-rerank-identity-test-secret-0a1b2c3d4e5f"
    tenant = uuid.uuid4()
    now = int(time.time())
    nested = JwtConfig(secret=secret, tenant_claim="app_metadata.tenant_id")
    tok = pyjwt.encode({"app_metadata": {"tenant_id": str(tenant)}, "exp": now + 60}, secret, algorithm="HS256")
    assert tenant_from_authorization("Bearer " + tok, nested) == tenant
    # a namespaced claim whose name has dots (Auth0's custom claims) is read as it is
    ns = "https://kb.example.test/tenant_id"
    tok = pyjwt.encode({ns: str(tenant), "exp": now + 60}, secret, algorithm="HS256")
    assert tenant_from_authorization("Bearer " + tok, JwtConfig(secret=secret, tenant_claim=ns)) == tenant
    tok = pyjwt.encode({"app_metadata": "x", "exp": now + 60}, secret, algorithm="HS256")
    with pytest.raises(AuthError) as e:
        tenant_from_authorization("Bearer " + tok, nested)
    assert e.value.reason == "missing_tenant"


@pytest.mark.parametrize("url,ok", [
    ("https://id.example.com/.well-known/jwks.json", True),
    ("http://127.0.0.1:8080/jwks", True),
    ("http://localhost/jwks", True),
    ("http://id.example.com/jwks", False),  # keys in clear over a network
    ("ftp://id.example.com/jwks", False),
    ("jwks.json", False),
])
def test_jwks_url_must_be_https_or_loopback(url, ok):
    if ok:
        JwtConfig(jwks_url=url)
    else:
        with pytest.raises(ValueError, match="KB_JWT_JWKS_URL"):
            JwtConfig(jwks_url=url)


def test_one_key_source_only():
    with pytest.raises(ValueError, match="KB_JWT_PUBLIC_KEY and KB_JWT_JWKS_URL"):
        jwt_config(Settings(jwt_public_key=pem(es256_key()), jwt_jwks_url="https://id.example.com/jwks"))


def test_secrets_from_files(tmp_path):
    secret = "kb-rerank-file-secret-9f8e7d6c5b4a3210"
    key = es256_key()
    (tmp_path / "secret").write_text(secret + "\n")
    (tmp_path / "pub.pem").write_text(pem(key))
    (tmp_path / "audit").write_text("a" * 8 + "0123456789abcdef0123456789abcdef\n")
    s = Settings.from_env({"KB_JWT_SECRET_FILE": str(tmp_path / "secret"),
                           "KB_AUDIT_KEY_FILE": str(tmp_path / "audit"),
                           "KB_OPS_TOKEN_FILE": str(tmp_path / "secret")})
    assert s.jwt_secret == secret and s.ops_token == secret  # the trailing newline dropped
    assert s.audit_key == "a" * 8 + "0123456789abcdef0123456789abcdef"
    s = Settings.from_env({"KB_JWT_PUBLIC_KEY_FILE": str(tmp_path / "pub.pem")})
    assert jwt_config(s).algorithm == "ES256"
    with pytest.raises(SettingsError, match="both KB_JWT_SECRET and KB_JWT_SECRET_FILE"):
        Settings.from_env({"KB_JWT_SECRET": secret, "KB_JWT_SECRET_FILE": str(tmp_path / "secret")})
    with pytest.raises(SettingsError, match="KB_JWT_SECRET_FILE=.*cannot read"):
        Settings.from_env({"KB_JWT_SECRET_FILE": str(tmp_path / "missing")})
    # a non-secret setting has no _FILE form
    assert Settings.from_env({"KB_POOL_MAX_FILE": str(tmp_path / "secret")}).pool_max == Settings().pool_max
