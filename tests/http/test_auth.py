"""Tests for kb_rerank.http.auth (bearer JWT -> tenant UUID)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid

import jwt
import pytest

from kb_rerank.http.auth import AuthError, JwtConfig, mint_token, tenant_from_authorization, verify_token

SECRET = "s3cret-for-tests-only-0123456789abcdef"  # >= 32 bytes
TENANT = uuid.UUID("0b6f4c1e-6d0a-4c1b-9a55-1f2e3d4c5b6a")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _segment(obj: dict) -> str:
    return _b64(json.dumps(obj, separators=(",", ":")).encode("utf-8"))


def _claims(**overrides) -> dict:
    now = int(time.time())
    claims = {"sub": "t", "tenant_id": str(TENANT), "iat": now, "exp": now + 600}
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


def _hs(claims: dict, secret: str = SECRET) -> str:
    return jwt.encode(claims, secret, algorithm="HS256")


def _reason(header: str | None, cfg: JwtConfig) -> str:
    with pytest.raises(AuthError) as ei:
        tenant_from_authorization(header, cfg)
    return ei.value.reason


@pytest.fixture
def hs_cfg() -> JwtConfig:
    return JwtConfig(secret=SECRET)


@pytest.fixture(scope="module")
def rsa_keys() -> tuple[str, str]:
    """(private_pem, public_pem) for a fresh 2048-bit RSA key."""
    # cryptography is a dependency (pyjwt[crypto]): imported, never skipped
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public_pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private_pem, public_pem


@pytest.fixture
def rs_cfg(rsa_keys) -> JwtConfig:
    return JwtConfig(public_key=rsa_keys[1])


# --------------------------------------------------------------------------- config


def test_config_needs_exactly_one_key():
    with pytest.raises(ValueError):
        JwtConfig()
    with pytest.raises(ValueError):
        JwtConfig(secret=SECRET, public_key="-----BEGIN PUBLIC KEY-----")


def test_config_rejects_short_secret_and_bad_leeway():
    with pytest.raises(ValueError):
        JwtConfig(secret="short")
    with pytest.raises(ValueError):
        JwtConfig(secret=SECRET, leeway_s=-1)


def test_config_rejects_bad_public_key(rsa_keys):
    with pytest.raises(ValueError):
        JwtConfig(public_key="not a pem")
    with pytest.raises(ValueError):  # a private key is not a public key
        JwtConfig(public_key=rsa_keys[0])


def test_config_algorithm(hs_cfg, rs_cfg):
    assert hs_cfg.algorithm == "HS256"
    assert rs_cfg.algorithm == "RS256"


# --------------------------------------------------------------------------- round trips


def test_hs256_round_trip(hs_cfg):
    token = mint_token(TENANT, hs_cfg)
    assert jwt.get_unverified_header(token)["alg"] == "HS256"
    assert tenant_from_authorization(f"Bearer {token}", hs_cfg) == TENANT


def test_hs256_round_trip_str_tenant_and_issuer_audience():
    cfg = JwtConfig(secret=SECRET, issuer="https://idp.example", audience="kb-rerank")
    token = mint_token(str(TENANT), cfg, subject="alice")
    claims = verify_token(token, cfg)
    assert claims["iss"] == "https://idp.example" and claims["aud"] == "kb-rerank"
    assert claims["sub"] == "alice"
    assert tenant_from_authorization(f"Bearer {token}", cfg) == TENANT


def test_rs256_round_trip(rsa_keys, rs_cfg):
    token = mint_token(TENANT, rs_cfg, private_key=rsa_keys[0])
    assert jwt.get_unverified_header(token)["alg"] == "RS256"
    assert tenant_from_authorization(f"Bearer {token}", rs_cfg) == TENANT


def test_custom_tenant_claim():
    cfg = JwtConfig(secret=SECRET, tenant_claim="org")
    token = mint_token(TENANT, cfg)
    assert "org" in jwt.decode(token, options={"verify_signature": False})
    assert tenant_from_authorization(f"Bearer {token}", cfg) == TENANT


def test_mint_token_rs256_needs_private_key(hs_cfg, rs_cfg, rsa_keys):
    with pytest.raises(ValueError):
        mint_token(TENANT, rs_cfg)
    with pytest.raises(ValueError):
        mint_token(TENANT, hs_cfg, private_key=rsa_keys[0])


def test_mint_token_argument_checks(hs_cfg):
    with pytest.raises(ValueError):
        mint_token("not-a-uuid", hs_cfg)
    with pytest.raises(ValueError):
        mint_token(TENANT, hs_cfg, ttl_s=0)


# --------------------------------------------------------------------------- header parsing


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER", "bEaReR"])
def test_scheme_is_case_insensitive(hs_cfg, scheme):
    token = mint_token(TENANT, hs_cfg)
    assert tenant_from_authorization(f"{scheme} {token}", hs_cfg) == TENANT
    assert tenant_from_authorization(f"  {scheme}   {token}  ", hs_cfg) == TENANT


@pytest.mark.parametrize("header", [None, "", "   ", "Bearer", "Bearer   "])
def test_missing_token(hs_cfg, header):
    assert _reason(header, hs_cfg) == "missing_token"


def test_garbled_headers(hs_cfg):
    token = mint_token(TENANT, hs_cfg)
    assert _reason(f"Basic {token}", hs_cfg) == "wrong_scheme"
    assert _reason(f"Token {token}", hs_cfg) == "wrong_scheme"
    assert _reason(token, hs_cfg) == "wrong_scheme"  # no scheme at all
    assert _reason(f"Bearer {token} extra", hs_cfg) == "malformed"
    assert _reason("Bearer not.a.jwt", hs_cfg) == "malformed"
    assert _reason("Bearer abc", hs_cfg) == "malformed"
    assert _reason("Bearer " + "a" * 20000, hs_cfg) == "malformed"


# --------------------------------------------------------------------------- signature / algorithm


def test_wrong_secret(hs_cfg):
    token = _hs(_claims(), secret="another-secret-also-32-bytes-long!!")
    assert _reason(f"Bearer {token}", hs_cfg) == "invalid_signature"


def test_tampered_payload(hs_cfg):
    header, _payload, sig = mint_token(TENANT, hs_cfg).split(".")
    forged = _segment(_claims(tenant_id=str(uuid.uuid4())))
    assert _reason(f"Bearer {header}.{forged}.{sig}", hs_cfg) == "invalid_signature"


def test_tampered_payload_rs256(rsa_keys, rs_cfg):
    header, _payload, sig = mint_token(TENANT, rs_cfg, private_key=rsa_keys[0]).split(".")
    forged = _segment(_claims(tenant_id=str(uuid.uuid4())))
    assert _reason(f"Bearer {header}.{forged}.{sig}", rs_cfg) == "invalid_signature"


@pytest.mark.parametrize("alg", ["none", "None", "NONE"])
def test_alg_none_rejected(hs_cfg, alg):
    unsigned = f"{_segment({'alg': alg, 'typ': 'JWT'})}.{_segment(_claims())}."
    assert _reason(f"Bearer {unsigned}", hs_cfg) == "invalid_signature"


def test_alg_none_rejected_rs256(rs_cfg):
    unsigned = f"{_segment({'alg': 'none', 'typ': 'JWT'})}.{_segment(_claims())}."
    assert _reason(f"Bearer {unsigned}", rs_cfg) == "invalid_signature"


def test_hs256_token_with_public_key_as_secret_rejected(rsa_keys, rs_cfg):
    """Classic HS/RS confusion: HMAC-sign with the (public) RSA key bytes.

    Crafted by hand because PyJWT itself refuses to use a PEM as an HMAC key.
    """
    public_pem = rsa_keys[1]
    signing_input = f"{_segment({'alg': 'HS256', 'typ': 'JWT'})}.{_segment(_claims())}"
    sig = hmac.new(public_pem.encode(), signing_input.encode(), hashlib.sha256).digest()
    forged = f"{signing_input}.{_b64(sig)}"
    assert _reason(f"Bearer {forged}", rs_cfg) == "invalid_signature"


def test_hs256_token_rejected_by_rs256_config(rs_cfg):
    assert _reason(f"Bearer {_hs(_claims())}", rs_cfg) == "invalid_signature"


def test_rs256_token_rejected_by_hs256_config(rsa_keys, hs_cfg):
    token = jwt.encode(_claims(), rsa_keys[0], algorithm="RS256")
    assert _reason(f"Bearer {token}", hs_cfg) == "invalid_signature"


def test_other_rsa_key_rejected(rs_cfg):
    from cryptography.hazmat.primitives.asymmetric import rsa

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode(_claims(), other, algorithm="RS256")
    assert _reason(f"Bearer {token}", rs_cfg) == "invalid_signature"


# --------------------------------------------------------------------------- time claims / leeway


def test_expired(hs_cfg):
    now = int(time.time())
    token = _hs(_claims(iat=now - 7200, exp=now - 3600))
    assert _reason(f"Bearer {token}", hs_cfg) == "expired"


def test_exp_required(hs_cfg):
    token = _hs(_claims(exp=None))
    assert _reason(f"Bearer {token}", hs_cfg) == "missing_exp"


def test_non_numeric_exp_is_malformed(hs_cfg):
    token = _hs(_claims(exp="tomorrow"))
    assert _reason(f"Bearer {token}", hs_cfg) == "malformed"


def test_leeway_on_exp():
    now = int(time.time())
    token = _hs(_claims(iat=now - 100, exp=now - 10))  # expired 10 s ago
    assert tenant_from_authorization(f"Bearer {token}", JwtConfig(secret=SECRET, leeway_s=30)) == TENANT
    assert _reason(f"Bearer {token}", JwtConfig(secret=SECRET, leeway_s=0)) == "expired"
    assert _reason(f"Bearer {token}", JwtConfig(secret=SECRET, leeway_s=5)) == "expired"


def test_nbf_and_leeway():
    now = int(time.time())
    soon = _hs(_claims(nbf=now + 10))  # valid in 10 s: inside a 30 s leeway
    assert tenant_from_authorization(f"Bearer {soon}", JwtConfig(secret=SECRET, leeway_s=30)) == TENANT
    assert _reason(f"Bearer {soon}", JwtConfig(secret=SECRET, leeway_s=0)) == "not_yet_valid"
    later = _hs(_claims(nbf=now + 120))
    assert _reason(f"Bearer {later}", JwtConfig(secret=SECRET, leeway_s=30)) == "not_yet_valid"
    past = _hs(_claims(nbf=now - 60))
    assert tenant_from_authorization(f"Bearer {past}", JwtConfig(secret=SECRET, leeway_s=0)) == TENANT


def test_iat_in_future(hs_cfg):
    now = int(time.time())
    token = _hs(_claims(iat=now + 3600, exp=now + 7200))
    assert _reason(f"Bearer {token}", hs_cfg) == "not_yet_valid"
    ok = _hs(_claims(iat=now + 10))  # within the default 30 s leeway (clock skew)
    assert tenant_from_authorization(f"Bearer {ok}", hs_cfg) == TENANT


def test_iat_optional(hs_cfg):
    token = _hs(_claims(iat=None))
    assert tenant_from_authorization(f"Bearer {token}", hs_cfg) == TENANT


# --------------------------------------------------------------------------- iss / aud


def test_issuer_checked_when_configured():
    cfg = JwtConfig(secret=SECRET, issuer="https://idp.example")
    assert _reason(f"Bearer {_hs(_claims(iss='https://evil.example'))}", cfg) == "bad_issuer"
    assert _reason(f"Bearer {_hs(_claims())}", cfg) == "bad_issuer"  # missing iss
    ok = _hs(_claims(iss="https://idp.example"))
    assert tenant_from_authorization(f"Bearer {ok}", cfg) == TENANT
    # not configured: any issuer is accepted
    assert tenant_from_authorization(f"Bearer {_hs(_claims(iss='x'))}", JwtConfig(secret=SECRET)) == TENANT


def test_audience_checked_when_configured():
    cfg = JwtConfig(secret=SECRET, audience="kb-rerank")
    assert _reason(f"Bearer {_hs(_claims(aud='other-api'))}", cfg) == "bad_audience"
    assert _reason(f"Bearer {_hs(_claims())}", cfg) == "bad_audience"  # missing aud
    ok = _hs(_claims(aud=["other-api", "kb-rerank"]))
    assert tenant_from_authorization(f"Bearer {ok}", cfg) == TENANT


def test_token_with_aud_rejected_when_no_audience_configured(hs_cfg):
    # RFC 7519 section 4.1.3 / PyJWT default: we do not identify with any audience.
    assert _reason(f"Bearer {_hs(_claims(aud='kb-rerank'))}", hs_cfg) == "bad_audience"


# --------------------------------------------------------------------------- tenant claim


def test_missing_tenant(hs_cfg):
    assert _reason(f"Bearer {_hs(_claims(tenant_id=None))}", hs_cfg) == "missing_tenant"


@pytest.mark.parametrize("value", ["acme", "", "1234", 42, ["0b6f4c1e-6d0a-4c1b-9a55-1f2e3d4c5b6a"], {"id": 1}])
def test_non_uuid_tenant(hs_cfg, value):
    assert _reason(f"Bearer {_hs(_claims(tenant_id=value))}", hs_cfg) == "bad_tenant"


def test_tenant_uuid_normalised(hs_cfg):
    token = _hs(_claims(tenant_id=str(TENANT).upper()))
    got = tenant_from_authorization(f"Bearer {token}", hs_cfg)
    assert isinstance(got, uuid.UUID) and got == TENANT


def test_auth_error_reason_and_message(hs_cfg):
    with pytest.raises(AuthError) as ei:
        tenant_from_authorization(None, hs_cfg)
    assert ei.value.reason == "missing_token"
    assert "missing_token" in str(ei.value)


# --------------------------------------------------------------------------- token lifetime, audience and issuer


DAY = 86400


def test_lifetime_capped_by_exp_far_in_the_future(hs_cfg):
    """A 100-year exp was accepted; now anything past max_lifetime_s (+ leeway) is refused."""
    now = int(time.time())
    century = _hs(_claims(iat=now, exp=now + 100 * 365 * DAY))
    assert _reason(f"Bearer {century}", hs_cfg) == "lifetime_too_long"
    no_iat = _hs(_claims(iat=None, exp=now + DAY + 3600))  # without iat, exp - now decides
    assert _reason(f"Bearer {no_iat}", hs_cfg) == "lifetime_too_long"
    as_string = _hs(_claims(iat=None, exp=str(now + 100 * 365 * DAY)))  # PyJWT takes numeric strings
    assert _reason(f"Bearer {as_string}", hs_cfg) == "lifetime_too_long"
    # exactly the default 24 h, and 24 h inside the leeway, are accepted
    assert tenant_from_authorization(f"Bearer {_hs(_claims(iat=now, exp=now + DAY))}", hs_cfg) == TENANT
    assert tenant_from_authorization(f"Bearer {_hs(_claims(iat=None, exp=now + DAY + 20))}", hs_cfg) == TENANT


def test_lifetime_capped_by_exp_minus_iat(hs_cfg):
    """A token issued long ago with a long life is refused even when its exp is near."""
    now = int(time.time())
    old_long = _hs(_claims(iat=now - 30 * DAY, exp=now + 3600))
    assert _reason(f"Bearer {old_long}", hs_cfg) == "lifetime_too_long"
    assert tenant_from_authorization(f"Bearer {_hs(_claims(iat=now - DAY + 60, exp=now + 60))}", hs_cfg) == TENANT


def test_lifetime_cap_is_configurable():
    now = int(time.time())
    week = _hs(_claims(iat=now, exp=now + 7 * DAY))
    assert tenant_from_authorization(f"Bearer {week}", JwtConfig(secret=SECRET, max_lifetime_s=7 * DAY)) == TENANT
    assert _reason(f"Bearer {week}", JwtConfig(secret=SECRET)) == "lifetime_too_long"
    short = JwtConfig(secret=SECRET, max_lifetime_s=300)
    assert _reason(f"Bearer {_hs(_claims(iat=now, exp=now + 600))}", short) == "lifetime_too_long"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError):
            JwtConfig(secret=SECRET, max_lifetime_s=bad)


def test_lifetime_setting_reaches_the_api_config():
    from kb_rerank.app import jwt_config
    from kb_rerank.core.settings import Settings

    assert jwt_config(Settings(jwt_secret=SECRET)).max_lifetime_s == DAY
    assert jwt_config(Settings.from_env({"KB_JWT_SECRET": SECRET, "KB_JWT_MAX_LIFETIME_S": "3600"})).max_lifetime_s == 3600


@pytest.mark.parametrize("value", ["00000000-0000-0000-0000-000000000000", "ffffffff-ffff-ffff-ffff-ffffffffffff",
                                   "FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF", "00000000000000000000000000000000"])
def test_nil_and_max_uuid_are_not_tenants(hs_cfg, value):
    assert _reason(f"Bearer {_hs(_claims(tenant_id=value))}", hs_cfg) == "bad_tenant"


def _no_server(*args, **kwargs):
    raise AssertionError("the server was started: the start-up checks let it through")


def test_both_keys_configured_is_a_startup_error(rsa_keys, monkeypatch, capsys):
    """Both KB_JWT_SECRET and KB_JWT_PUBLIC_KEY set silently chose HS256; now the app and
    `kb-rerank serve` refuse to start, naming both."""
    from kb_rerank.cli import main as cli
    from kb_rerank.app import create_app, jwt_config
    from kb_rerank.core.settings import Settings

    both = Settings(jwt_secret=SECRET, jwt_public_key=rsa_keys[1])
    for build in (jwt_config, create_app):
        with pytest.raises(ValueError) as ei:
            build(both)
        assert "KB_JWT_SECRET" in str(ei.value) and "KB_JWT_PUBLIC_KEY" in str(ei.value)
    monkeypatch.setenv("KB_JWT_SECRET", SECRET)
    monkeypatch.setenv("KB_JWT_PUBLIC_KEY", rsa_keys[1])
    monkeypatch.setattr("kb_rerank.http.server.run", _no_server)
    assert cli.main(["serve", "--port", "1"]) == 2  # refused before uvicorn starts
    err = capsys.readouterr().err
    assert "KB_JWT_SECRET" in err and "KB_JWT_PUBLIC_KEY" in err
    # each alone is fine
    assert jwt_config(Settings(jwt_secret=SECRET)).algorithm == "HS256"
    assert jwt_config(Settings(jwt_public_key=rsa_keys[1])).algorithm == "RS256"


# --------------------------------------------------------------------------- secrets


PLACEHOLDERS = [
    "change-me-to-a-secret-of-at-least-32-bytes",  # the old docker/compose.yaml value
    "kb-rerank-dev-secret-do-not-use-in-production",  # `serve --dev`'s public secret
    "CHANGEME-please-0123456789abcdefghijklmnop",
    "my-example-jwt-secret-for-the-kb-rerank-api",
    "secretsecretsecretsecretsecretsecret",
    "your-256-bit-secret-xxxxxxxxxxxxxxxxxxxxxxx",
    "a" * 64,
    "0123456701234567012345670123456701234567",  # one short unit repeated
    "abababababababababababababababab1",  # fewer than 8 distinct characters
]


@pytest.mark.parametrize("value", PLACEHOLDERS)
def test_placeholder_and_weak_secrets_refused(value):
    from kb_rerank.app import jwt_config
    from kb_rerank.http.auth import check_secret
    from kb_rerank.core.settings import Settings

    with pytest.raises(ValueError) as ei:
        check_secret("KB_JWT_SECRET", value)
    assert "KB_JWT_SECRET" in str(ei.value)
    with pytest.raises(ValueError):
        jwt_config(Settings(jwt_secret=value))
    with pytest.raises(ValueError) as ei:
        jwt_config(Settings(jwt_secret=SECRET, ops_token=value))
    assert "KB_OPS_TOKEN" in str(ei.value)


def test_random_secrets_accepted():
    import secrets

    from kb_rerank.http.auth import check_secret

    for _ in range(200):
        check_secret("KB_JWT_SECRET", secrets.token_hex(16))  # 32 hex digits, the shortest accepted form
        check_secret("KB_JWT_SECRET", secrets.token_urlsafe(32))
    check_secret("KB_JWT_SECRET", SECRET)


def test_serve_refuses_placeholder_secret_but_dev_mode_keeps_working(monkeypatch, capsys):
    from kb_rerank.cli import main as cli
    from kb_rerank.core.dev import DEV_JWT_SECRET

    monkeypatch.delenv("KB_JWT_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("KB_SERVE_DEV", raising=False)
    monkeypatch.setenv("KB_JWT_SECRET", "change-me-to-a-secret-of-at-least-32-bytes")
    monkeypatch.setattr("kb_rerank.http.server.run", _no_server)
    assert cli.main(["serve", "--port", "1"]) == 2
    assert "KB_JWT_SECRET" in capsys.readouterr().err
    # the development secret only with --dev
    monkeypatch.setenv("KB_JWT_SECRET", DEV_JWT_SECRET)
    assert cli.main(["serve", "--port", "1"]) == 2
    assert "placeholder" in capsys.readouterr().err
    started = []
    monkeypatch.setattr("kb_rerank.http.server.run", lambda *a, **kw: started.append((a, kw)) or 0)
    monkeypatch.setattr("kb_rerank.cli.serve._check_embedded_database", lambda s: None)  # no database here: the keys
    monkeypatch.delenv("KB_JWT_SECRET")
    assert cli.main(["serve", "--dev", "--port", "1"]) == 0 and started
    from kb_rerank.app import app_from_env

    assert app_from_env().state.jwt.secret == DEV_JWT_SECRET  # KB_SERVE_DEV=1 set by --dev
    monkeypatch.delenv("KB_SERVE_DEV")
    with pytest.raises(ValueError):
        app_from_env()


def test_serve_requires_strong_server_keys_in_a_deployment(monkeypatch, capsys, tmp_path):
    """A deployment (the app role's URL given, no --dev) must set KB_AUDIT_KEY and
    KB_QUERY_HASH_KEY: a generated key file is per machine, so replicas (or a container
    restarted without a volume) would disagree. A set key must not be a placeholder."""
    import secrets

    from kb_rerank.cli import main as cli

    started = []
    monkeypatch.setattr("kb_rerank.http.server.run", lambda *a, **kw: started.append(kw) or 0)
    monkeypatch.setenv("KB_JWT_SECRET", secrets.token_hex(32))
    monkeypatch.setenv("KB_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KB_APP_DATABASE_URL", "postgresql://kb_app@db/kb")
    for name in ("KB_AUDIT_KEY", "KB_QUERY_HASH_KEY", "KB_JWT_PUBLIC_KEY", "KB_OPS_TOKEN", "KB_SERVE_DEV"):
        monkeypatch.delenv(name, raising=False)
    assert cli.main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "KB_AUDIT_KEY" in err and "KB_QUERY_HASH_KEY" in err and not started
    monkeypatch.setenv("KB_AUDIT_KEY", "change-me-to-a-secret-of-at-least-32-bytes")
    monkeypatch.setenv("KB_QUERY_HASH_KEY", secrets.token_hex(32))
    assert cli.main(["serve", "--port", "1"]) == 2
    assert "KB_AUDIT_KEY" in capsys.readouterr().err and not started
    monkeypatch.setenv("KB_AUDIT_KEY", secrets.token_hex(32))
    assert cli.main(["serve", "--port", "1"]) == 0 and started
    assert not (tmp_path / "data").exists()  # no key file generated behind the operator's back
    # a single machine without the app URL (embedded server) may use the generated key files
    monkeypatch.delenv("KB_APP_DATABASE_URL")
    monkeypatch.setattr("kb_rerank.cli.serve._check_embedded_database", lambda s: None)  # no database here: the keys
    monkeypatch.delenv("KB_AUDIT_KEY")
    monkeypatch.delenv("KB_QUERY_HASH_KEY")
    assert cli.main(["serve", "--port", "1"]) == 0 and len(started) == 2


def test_token_command_refuses_a_lifetime_the_server_would_refuse(monkeypatch, capsys):
    from kb_rerank.cli import main as cli

    monkeypatch.delenv("KB_JWT_MAX_LIFETIME_S", raising=False)
    tenant = "6f1c2a4e-0000-4000-8000-000000000001"
    assert cli.main(["token", "--tenant", tenant, "--ttl", str(100 * 365 * 86400)]) == 2
    assert "KB_JWT_MAX_LIFETIME_S" in capsys.readouterr().err
    assert cli.main(["token", "--tenant", tenant, "--ttl", "600"]) == 0
    assert capsys.readouterr().out.count(".") == 2  # a JWT: header.payload.signature
