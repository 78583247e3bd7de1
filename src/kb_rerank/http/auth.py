"""Bearer JWT verification for the multi-tenant API.

A request carries ``Authorization: Bearer <jwt>``; the token's tenant claim
(``tenant_id`` by default) selects the tenant every query is scoped to.

Security rules enforced here:

* Exactly one key is configured: ``secret`` (HS256) **or** ``public_key``
  (RS256, PEM). The algorithm list handed to :func:`jwt.decode` is that single
  algorithm, so a token cannot choose its own algorithm: ``alg: none``, an
  HS256 token against an RS256 config (HMAC keyed with the public key) or an
  RS256 token against an HS256 config are all rejected.
* ``exp`` is required; ``nbf`` and ``iat`` are checked when present (``iat`` in
  the future beyond the leeway counts as "not yet valid"); ``leeway_s`` is
  applied to all three.
* ``iss`` / ``aud`` must match when configured. When no audience is
  configured, a token that *carries* an ``aud`` claim is rejected (PyJWT's
  default, per RFC 7519 section 4.1.3: a recipient that does not identify
  with the audience must reject the token).
* HS256 secrets must be at least 32 bytes (RFC 7518 section 3.2); RSA keys must be at
  least 2048 bits. Both are checked when the :class:`JwtConfig` is built.
* Lifetime is capped (``max_lifetime_s``, default 24 h): a token whose ``exp`` is more
  than that (+ leeway) in the future, or whose ``exp - iat`` is longer, is rejected
  (``lifetime_too_long``): a leaked long-lived token would otherwise work for years.
* The nil UUID and the max UUID are not tenants (``bad_tenant``): they are sentinels
  (``pair_cache.NO_CHUNK`` is the nil UUID), never a real tenant's id.
* :func:`check_secret` refuses placeholder and low-entropy secrets (the example
  deployment's, the development secret, one repeated character...); the API and
  ``kb-rerank serve`` call it at start-up.

Every rejection raises :class:`AuthError` whose ``reason`` is one of
:data:`REASONS` (a short machine-readable string, safe to return to clients).
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jwt
from jwt import algorithms as _jwt_algorithms
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from kb_rerank.http.body import ApiError
from kb_rerank.http.telemetry import trace_id_from_headers
from kb_rerank.pipeline.limits import Limits

__all__ = [
    "REASONS",
    "AuthError",
    "JwtConfig",
    "check_secret",
    "mint_token",
    "tenant_from_authorization",
    "verify_token",
]

#: Every value :attr:`AuthError.reason` can take.
REASONS = frozenset(
    {
        "missing_token",  # no/empty Authorization header, or "Bearer" without a token
        "malformed",  # not "Bearer <token>", undecodable token, badly typed claims
        "invalid_signature",  # signature mismatch, or alg other than the configured one
        "expired",  # exp (+ leeway) in the past
        "not_yet_valid",  # nbf or iat (- leeway) in the future
        "missing_exp",  # token without an exp claim
        "bad_audience",  # aud missing/mismatching (or present while none is configured)
        "bad_issuer",  # iss missing/mismatching when an issuer is configured
        "missing_tenant",  # tenant claim absent
        "bad_tenant",  # tenant claim present but not a UUID string, or the nil / max UUID
        "lifetime_too_long",  # exp further than max_lifetime_s (+ leeway) away, or exp - iat longer
    }
)

_MIN_HMAC_KEY_BYTES = 32  # RFC 7518 section 3.2: key >= hash output size (SHA-256)
_MIN_RSA_BITS = 2048
_MAX_TOKEN_CHARS = 16_384  # far above any sane JWT; bounds the work an attacker can cause
_NOT_TENANTS = (uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1))  # nil and max UUID: sentinels

# Secrets shipped in this repository or in well-known examples: anyone can read them.
# Compared after lower-casing and dropping everything but letters and digits.
_KNOWN_PLACEHOLDERS = (
    "changemetoasecretofatleast32bytes",  # docker/compose.yaml before issue 13
    "kbrerankdevsecretdonotuseinproduction",  # cli.DEV_JWT_SECRET (`serve --dev` only)
    "your256bitsecret",  # jwt.io's default
)
_PLACEHOLDER_WORDS = ("changeme", "example", "placeholder", "replaceme", "yoursecret", "your256bitsecret",
                      "secretsecret", "donotuse", "insecure", "notasecret")
_MIN_DISTINCT_CHARS = 8  # 32 random hex digits have 14 on average; fewer than 8 has p < 1e-6
_LONG_RUN = re.compile(r"(.)\1{7}")  # one character 8 times in a row (p ~ 1e-7 in 64 random hex digits)


def check_secret(name: str, value: str, *, min_bytes: int = _MIN_HMAC_KEY_BYTES) -> None:
    """Raise ValueError naming ``name`` when ``value`` is too short, a known placeholder
    (or contains a placeholder word such as 'change-me' or 'example'), or of low entropy
    (fewer than 8 distinct characters, one short unit repeated, or a long run of one character). Generate one with
    ``openssl rand -hex 32``."""
    hint = "; generate one with `openssl rand -hex 32`"
    if len(value.encode("utf-8")) < min_bytes:
        raise ValueError(f"{name} must be at least {min_bytes} bytes{hint}")
    folded = "".join(ch for ch in value.lower() if ch.isalnum())
    if folded in _KNOWN_PLACEHOLDERS or any(w in folded for w in _PLACEHOLDER_WORDS):
        raise ValueError(f"{name} is a placeholder or published example value, which anyone can read{hint}")
    n = len(value)
    periodic = any(n % k == 0 and value == value[:k] * (n // k) for k in range(1, n // 2 + 1))
    if len(set(value)) < _MIN_DISTINCT_CHARS or periodic or _LONG_RUN.search(value):
        raise ValueError(f"{name} has too little entropy (too few distinct characters or a repeated pattern){hint}")


class AuthError(Exception):
    """Authentication failed; ``reason`` is a short machine string from :data:`REASONS`."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        if reason not in REASONS:  # programming error, not a client error
            raise ValueError(f"unknown AuthError reason {reason!r}")
        self.reason = reason
        self.detail = detail or reason
        super().__init__(f"{reason}: {self.detail}" if detail else reason)


@dataclass(frozen=True)
class JwtConfig:
    """JWT verification settings. Exactly one of ``secret`` / ``public_key`` must be set.

    * ``secret`` -> HS256 (shared secret, >= 32 bytes UTF-8).
    * ``public_key`` -> RS256 (PEM-encoded RSA public key, >= 2048 bits; needs
      the ``cryptography`` package, i.e. ``pyjwt[crypto]``).
    """

    secret: str | None = None
    public_key: str | None = None  # PEM
    issuer: str | None = None
    audience: str | None = None
    leeway_s: int = 30
    tenant_claim: str = "tenant_id"
    max_lifetime_s: int = 86400  # exp at most this far ahead, and exp - iat at most this

    def __post_init__(self) -> None:
        if (self.secret is None) == (self.public_key is None):
            raise ValueError("JwtConfig needs exactly one of secret (HS256) or public_key (RS256)")
        if self.secret is not None:
            if len(self.secret.encode("utf-8")) < _MIN_HMAC_KEY_BYTES:
                raise ValueError(
                    f"HS256 secret must be at least {_MIN_HMAC_KEY_BYTES} bytes (RFC 7518 section 3.2)"
                )
        else:
            _rsa_public_key(self.public_key)  # validates (and caches) the PEM now
        if isinstance(self.leeway_s, bool) or not isinstance(self.leeway_s, int) or self.leeway_s < 0:
            raise ValueError("leeway_s must be a non-negative int")
        if not self.tenant_claim:
            raise ValueError("tenant_claim must be a non-empty claim name")
        if isinstance(self.max_lifetime_s, bool) or not isinstance(self.max_lifetime_s, int) \
                or self.max_lifetime_s <= 0:
            raise ValueError("max_lifetime_s must be a positive int (seconds)")

    @property
    def algorithm(self) -> str:
        """The single accepted algorithm: ``"HS256"`` or ``"RS256"``."""
        return "HS256" if self.secret is not None else "RS256"


def _require_crypto() -> None:
    if not _jwt_algorithms.has_crypto:
        raise RuntimeError(
            "RS256 needs the 'cryptography' package (install pyjwt[crypto])"
        )


@lru_cache(maxsize=8)
def _rsa_public_key(pem: str | None) -> Any:
    """Parse and check a PEM RSA public key once (cached per PEM string)."""
    _require_crypto()
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if not pem or not pem.strip():
        raise ValueError("public_key must be a PEM-encoded RSA public key")
    try:
        key = load_pem_public_key(pem.encode("utf-8"))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"public_key is not a PEM-encoded public key: {exc}") from exc
    if not isinstance(key, RSAPublicKey):
        raise ValueError("public_key must be an RSA public key (RS256)")
    if key.key_size < _MIN_RSA_BITS:
        raise ValueError(f"RSA public key is {key.key_size} bits; at least {_MIN_RSA_BITS} required")
    return key


def _verification_key(cfg: JwtConfig) -> Any:
    return cfg.secret if cfg.secret is not None else _rsa_public_key(cfg.public_key)


def verify_token(token: str, cfg: JwtConfig) -> dict[str, Any]:
    """Verify ``token`` (the bare JWT, no "Bearer ") and return its claims.

    Checks signature (configured algorithm only), ``exp`` (required), ``nbf`` /
    ``iat`` (when present), ``iss`` / ``aud`` (when configured) and the lifetime cap.
    Does not look at the tenant claim. Raises :class:`AuthError`.
    """
    if not token:
        raise AuthError("missing_token")
    if len(token) > _MAX_TOKEN_CHARS:
        raise AuthError("malformed", "token too long")
    claims = _decode(token, cfg)
    # PyJWT has checked that int() takes exp (and iat when present): numbers or numeric strings.
    exp = int(claims["exp"])
    iat = int(claims["iat"]) if claims.get("iat") is not None else None
    if exp > time.time() + cfg.max_lifetime_s + cfg.leeway_s:
        raise AuthError("lifetime_too_long", f"exp is more than {cfg.max_lifetime_s} s in the future")
    if iat is not None and exp - iat > cfg.max_lifetime_s:
        raise AuthError("lifetime_too_long", f"exp - iat is more than {cfg.max_lifetime_s} s")
    return claims


def _decode(token: str, cfg: JwtConfig) -> dict[str, Any]:
    try:
        return jwt.decode(
            token,
            key=_verification_key(cfg),
            algorithms=[cfg.algorithm],  # one algorithm only: no alg confusion, no "none"
            audience=cfg.audience,
            issuer=cfg.issuer,
            leeway=cfg.leeway_s,
            options={
                "require": ["exp"],
                "verify_signature": True,
                "verify_exp": True,
                "verify_nbf": True,
                "verify_iat": True,
                "verify_aud": True,
                "verify_iss": True,
                "strict_aud": False,
                "enforce_minimum_key_length": True,
            },
        )
    except jwt.InvalidSignatureError as exc:
        raise AuthError("invalid_signature", str(exc)) from None
    except jwt.InvalidAlgorithmError as exc:
        # alg "none", HS256 against an RS256 config, RS256 against HS256, ...
        raise AuthError("invalid_signature", str(exc)) from None
    except jwt.ExpiredSignatureError as exc:
        raise AuthError("expired", str(exc)) from None
    except jwt.ImmatureSignatureError as exc:
        raise AuthError("not_yet_valid", str(exc)) from None
    except jwt.InvalidAudienceError as exc:
        raise AuthError("bad_audience", str(exc)) from None
    except jwt.InvalidIssuerError as exc:
        raise AuthError("bad_issuer", str(exc)) from None
    except jwt.MissingRequiredClaimError as exc:
        reason = {"exp": "missing_exp", "aud": "bad_audience", "iss": "bad_issuer"}.get(
            exc.claim, "malformed"
        )
        raise AuthError(reason, str(exc)) from None
    except jwt.InvalidTokenError as exc:  # DecodeError, bad iat/sub/jti types, ...
        raise AuthError("malformed", str(exc)) from None


def _parse_bearer(header: str | None) -> str:
    if header is None or not header.strip():
        raise AuthError("missing_token")
    parts = header.split()
    if parts[0].lower() != "bearer":
        raise AuthError("malformed", "authorization scheme must be Bearer")
    if len(parts) == 1:
        raise AuthError("missing_token", "Bearer without a token")
    if len(parts) != 2:
        raise AuthError("malformed", "expected 'Bearer <token>'")
    return parts[1]


def _parse_tenant(claims: dict[str, Any], claim: str) -> uuid.UUID:
    if claims.get(claim) is None:
        raise AuthError("missing_tenant", f"claim {claim!r} missing")
    value = claims[claim]
    if not isinstance(value, str):
        raise AuthError("bad_tenant", f"claim {claim!r} must be a UUID string")
    try:
        tenant = uuid.UUID(value)
    except ValueError:
        raise AuthError("bad_tenant", f"claim {claim!r} is not a UUID") from None
    if tenant in _NOT_TENANTS:
        raise AuthError("bad_tenant", f"claim {claim!r} is a reserved UUID (nil or max)")
    return tenant


def tenant_from_authorization(header: str | None, cfg: JwtConfig) -> uuid.UUID:
    """Return the tenant UUID from an ``Authorization: Bearer <jwt>`` header value.

    The scheme is matched case-insensitively. Raises :class:`AuthError` for a
    missing/garbled header, an invalid token (see :func:`verify_token`) or a
    missing (``missing_tenant``) / non-UUID (``bad_tenant``) tenant claim.
    """
    token = _parse_bearer(header)
    claims = verify_token(token, cfg)
    return _parse_tenant(claims, cfg.tenant_claim)


def mint_token(
    tenant_id: uuid.UUID | str,
    cfg: JwtConfig,
    *,
    private_key: str | None = None,
    ttl_s: int = 3600,
    subject: str = "dev",
) -> str:
    """Mint a token accepted by :func:`tenant_from_authorization` (development/tests).

    HS256 configs sign with ``cfg.secret``; RS256 configs need ``private_key``
    (PEM, matching ``cfg.public_key``). Claims: ``sub``, the tenant claim,
    ``iat``, ``exp = iat + ttl_s`` and ``iss`` / ``aud`` when configured.
    """
    tenant = tenant_id if isinstance(tenant_id, uuid.UUID) else uuid.UUID(str(tenant_id))
    if ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    now = int(time.time())
    payload: dict[str, Any] = {
        "sub": subject,
        cfg.tenant_claim: str(tenant),
        "iat": now,
        "exp": now + ttl_s,
    }
    if cfg.issuer is not None:
        payload["iss"] = cfg.issuer
    if cfg.audience is not None:
        payload["aud"] = cfg.audience
    if cfg.algorithm == "HS256":
        if private_key is not None:
            raise ValueError("private_key given but the config is HS256 (secret)")
        return jwt.encode(payload, cfg.secret, algorithm="HS256")
    if not private_key:
        raise ValueError("RS256 config: mint_token needs private_key (PEM)")
    _require_crypto()
    return jwt.encode(payload, private_key, algorithm="RS256")


def auth_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    state = connection.app.state
    headers = connection.headers
    tid = trace_id_from_headers(headers.get("traceparent"), headers.get("x-trace-id"))
    connection.scope.setdefault("state", {})["trace_id"] = tid
    limits: Limits = state.limits  # 429s are LimitExceeded, answered with the trace id set above
    # per client address, before the token is verified: floods of bad tokens are bounded too
    limits.charge_address(connection.client.host if connection.client else None)
    try:
        tenant = tenant_from_authorization(headers.get("authorization"), state.jwt)
    except AuthError as exc:
        state.metrics.rejected.labels("unauthorized").inc()
        raise ApiError(401, {"error": "unauthorized", "reason": exc.reason},
                       headers={"WWW-Authenticate": 'Bearer realm="kb-rerank"', "X-Trace-Id": tid}) from None
    connection.scope["state"]["tenant"] = tenant
    limits.charge(tenant)  # 1 token: the whole cost of a cache hit; costly work is charged before it starts
