"""Bearer JWT verification for the multi-tenant API.

A request carries ``Authorization: Bearer <jwt>``; the token's tenant claim
(``tenant_id`` by default) selects the tenant every query is scoped to.

Security rules enforced here:

* Exactly one key source is configured: ``secret`` (HS256), ``public_key`` (PEM: RSA ->
  RS256, EC P-256 -> ES256, Ed25519 -> EdDSA) **or** ``jwks_url`` (an identity provider's
  JWK Set, :class:`JwksKeys`: the key is picked by the token's ``kid`` and carries its own
  algorithm). The algorithm list handed to :func:`jwt.decode` is the key's single
  algorithm, so a token cannot choose its own algorithm: ``alg: none``, an HS256 token
  against a public-key config (HMAC keyed with the public key) or an RS256 token against an
  HS256 config are all rejected. JWKS keys of type ``oct`` (shared secrets) are refused.
* ``exp`` is required; ``nbf`` and ``iat`` are checked when present (``iat`` in
  the future beyond the leeway counts as "not yet valid"); ``leeway_s`` is
  applied to all three.
* ``iss`` / ``aud`` are required and must match when configured. When no audience is
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
* :func:`check_secret` (in :mod:`kb_rerank.core.keys`, re-exported here) refuses placeholder and low-entropy secrets (the example
  deployment's, the development secret, one repeated character...); the API and
  ``kb-rerank serve`` call it at start-up.

The tenant claim is ``tenant_id`` unless configured; a dotted name (``app_metadata.tenant_id``)
reads a nested claim when no top-level claim has that exact name (namespaced claims such as
``https://example.com/tenant_id`` contain dots too).

Every rejection raises :class:`AuthError` whose ``reason`` is one of
:data:`REASONS` (a short machine-readable string, safe to return to clients).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
import uuid
from dataclasses import dataclass
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import jwt
from jwt import PyJWK, PyJWKClient, PyJWKClientError, PyJWKSetError
from jwt import algorithms as _jwt_algorithms
from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from kb_rerank.http.body import ApiError
from kb_rerank.http.telemetry import TENANT_ID, trace_id_from_headers
from kb_rerank.core.keys import check_secret  # noqa: F401 - part of this module's interface
from kb_rerank.core.limits import Limits

__all__ = [
    "REASONS",
    "AuthError",
    "JwksKeys",
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
        "wrong_scheme",  # another scheme than Bearer ("Token ...", "Basic ..."), or a bare token
        "malformed",  # "Bearer" with more than one token, undecodable token, badly typed claims
        "invalid_signature",  # signature mismatch, or alg other than the configured one
        "expired",  # exp (+ leeway) in the past
        "not_yet_valid",  # nbf or iat (- leeway) in the future
        "missing_exp",  # token without an exp claim
        "bad_audience",  # aud missing/mismatching (or present while none is configured)
        "bad_issuer",  # iss missing/mismatching when an issuer is configured
        "missing_tenant",  # tenant claim absent
        "bad_tenant",  # tenant claim present but not a UUID string, or the nil / max UUID
        "lifetime_too_long",  # exp further than max_lifetime_s (+ leeway) away, or exp - iat longer
        "unknown_key",  # JWKS: no key with the token's kid (after the bounded refetch)
    }
)

SCHEME_DETAIL = "use Authorization: Bearer <token>"

log = logging.getLogger(__name__)

# The asymmetric algorithms a public key or a JWKS key may carry (a JWKS key's own `alg`, or
# the one its kty/crv implies). No HMAC from a JWKS: a published shared secret is no secret.
PUBLIC_KEY_ALGORITHMS = ("RS256", "ES256", "EdDSA")

_MIN_HMAC_KEY_BYTES = 32  # RFC 7518 section 3.2: key >= hash output size (SHA-256)
_MIN_RSA_BITS = 2048
_LOOPBACK_HOSTS = ("localhost",)
_MAX_TOKEN_CHARS = 16_384  # far above any sane JWT; bounds the work an attacker can cause
_NOT_TENANTS = (uuid.UUID(int=0), uuid.UUID(int=(1 << 128) - 1))  # nil and max UUID: sentinels

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
    """JWT verification settings. Exactly one of ``secret`` / ``public_key`` / ``jwks_url``.

    * ``secret`` -> HS256 (shared secret, >= 32 bytes UTF-8).
    * ``public_key`` -> PEM public key: RSA >= 2048 bits (RS256), EC P-256 (ES256) or
      Ed25519 (EdDSA) (needs the ``cryptography`` package, i.e. ``pyjwt[crypto]``).
    * ``jwks_url`` -> keys from a JWK Set (https, or http to a loopback address), fetched
      and cached by :class:`JwksKeys` (``jwks_*`` below).
    """

    secret: str | None = None
    public_key: str | None = None  # PEM
    issuer: str | None = None
    audience: str | None = None
    leeway_s: int = 30
    tenant_claim: str = "tenant_id"
    max_lifetime_s: int = 86400  # exp at most this far ahead, and exp - iat at most this
    jwks_url: str | None = None
    jwks_timeout_s: float = 5.0  # one fetch
    jwks_max_age_s: float = 300.0  # keys refetched when older
    jwks_min_refresh_s: float = 30.0  # an unknown kid refetches at most once per this

    def __post_init__(self) -> None:
        if sum(x is not None for x in (self.secret, self.public_key, self.jwks_url)) != 1:
            raise ValueError("JwtConfig needs exactly one of secret (HS256), public_key (RS256, ES256, EdDSA) "
                             "or jwks_url")
        if self.secret is not None:
            if len(self.secret.encode("utf-8")) < _MIN_HMAC_KEY_BYTES:
                raise ValueError(
                    f"HS256 secret must be at least {_MIN_HMAC_KEY_BYTES} bytes (RFC 7518 section 3.2)"
                )
        elif self.public_key is not None:
            _public_key(self.public_key)  # validates (and caches) the PEM now
        else:
            _check_jwks_url(self.jwks_url)
        if isinstance(self.leeway_s, bool) or not isinstance(self.leeway_s, int) or self.leeway_s < 0:
            raise ValueError("leeway_s must be a non-negative int")
        if not self.tenant_claim:
            raise ValueError("tenant_claim must be a non-empty claim name")
        if isinstance(self.max_lifetime_s, bool) or not isinstance(self.max_lifetime_s, int) \
                or self.max_lifetime_s <= 0:
            raise ValueError("max_lifetime_s must be a positive int (seconds)")

    @property
    def algorithm(self) -> str | None:
        """The single accepted algorithm of a static key (``HS256``, ``RS256``, ``ES256`` or
        ``EdDSA``); None with a JWKS, where each key carries its own."""
        if self.secret is not None:
            return "HS256"
        if self.public_key is not None:
            return _public_key(self.public_key)[1]
        return None


def _check_jwks_url(url: str | None) -> None:
    """https, or plain http only to a loopback address (a sidecar or a test): keys fetched
    in clear over a network could be replaced by anyone on the path."""
    parts = urlsplit(url or "")
    host = (parts.hostname or "").lower()
    if parts.scheme == "https" and host:
        return
    if parts.scheme == "http" and host:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host in _LOOPBACK_HOSTS
        if loopback:
            return
    raise ValueError(f"KB_JWT_JWKS_URL={url!r} must be an https URL (plain http only to a loopback address)")


def _require_crypto() -> None:
    if not _jwt_algorithms.has_crypto:
        raise RuntimeError(
            "RS256, ES256 and EdDSA need the 'cryptography' package (install pyjwt[crypto])"
        )


@lru_cache(maxsize=8)
def _public_key(pem: str | None) -> tuple[Any, str]:
    """Parse and check a PEM public key once (cached per PEM string): (key, its algorithm)."""
    _require_crypto()
    from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, EllipticCurvePublicKey
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    if not pem or not pem.strip():
        raise ValueError("public_key must be a PEM-encoded public key (RSA, EC P-256 or Ed25519)")
    try:
        key = load_pem_public_key(pem.encode("utf-8"))
    except (ValueError, TypeError) as exc:
        raise ValueError(f"public_key is not a PEM-encoded public key: {exc}") from exc
    if isinstance(key, RSAPublicKey):
        if key.key_size < _MIN_RSA_BITS:
            raise ValueError(f"RSA public key is {key.key_size} bits; at least {_MIN_RSA_BITS} required")
        return key, "RS256"
    if isinstance(key, EllipticCurvePublicKey) and isinstance(key.curve, SECP256R1):
        return key, "ES256"
    if isinstance(key, Ed25519PublicKey):
        return key, "EdDSA"
    raise ValueError("public_key must be an RSA (RS256), EC P-256 (ES256) or Ed25519 (EdDSA) public key")


def _verification_key(cfg: JwtConfig) -> Any:
    return cfg.secret if cfg.secret is not None else _public_key(cfg.public_key)[0]


class JwksUnavailable(Exception):
    """The JWK Set could not be fetched and no earlier copy is held (answered 503)."""


class JwksKeys:
    """The keys of ``cfg.jwks_url``, fetched with PyJWT's :class:`~jwt.PyJWKClient` (its JWK
    Set cache holds them ``jwks_max_age_s``) on a worker thread with a timeout, so the event
    loop never waits on the network. A token whose ``kid`` is not in the set refetches it
    (a provider's key rotation) at most once per ``jwks_min_refresh_s``: tokens with random
    ``kid`` values cannot turn into a flood of fetches. One fetch at a time (a lock); when a
    fetch fails, the last good set keeps serving (logged), else 503."""

    def __init__(self, cfg: JwtConfig) -> None:
        if cfg.jwks_url is None:
            raise ValueError("JwksKeys needs a config with jwks_url")
        self._cfg = cfg
        self._client = PyJWKClient(cfg.jwks_url, cache_jwk_set=True, lifespan=cfg.jwks_max_age_s,
                                   timeout=cfg.jwks_timeout_s)
        self._last: dict[str, PyJWK] | None = None  # the last good set, by kid
        self._last_fetch = float("-inf")  # monotonic time of the last fetch attempt
        self._lock = asyncio.Lock()
        self.fetches = 0  # fetch attempts (tests, logs)

    def _cached(self) -> dict[str, PyJWK] | None:
        """The set while PyJWKClient's cache holds it (no I/O)."""
        cache = self._client.jwk_set_cache
        data = cache.get() if cache is not None else None
        return self._last if data is not None and self._last is not None else None

    def _fetch(self) -> dict[str, PyJWK]:
        keys = self._client.get_jwk_set(refresh=True).keys
        usable = {}
        for k in keys:
            if k.algorithm_name in PUBLIC_KEY_ALGORITHMS and k.public_key_use in (None, "sig"):
                usable[k.key_id or ""] = k
        return usable

    async def _refresh(self) -> dict[str, PyJWK]:
        self.fetches += 1
        self._last_fetch = time.monotonic()
        try:
            keys = await asyncio.wait_for(asyncio.to_thread(self._fetch), self._cfg.jwks_timeout_s + 1.0)
        except (PyJWKClientError, PyJWKSetError, asyncio.TimeoutError, OSError, ValueError) as exc:
            log.warning("JWKS fetch failed: %s", type(exc).__name__)
            if self._last is None:
                raise JwksUnavailable(str(exc)) from None
            return self._last
        self._last = keys
        return keys

    async def key_for(self, token: str) -> PyJWK:
        """The key that verifies ``token``: by its ``kid``, or the only key of a one-key set
        when the token has none. Raises :class:`AuthError` (``malformed``, ``unknown_key``)
        or :class:`JwksUnavailable`."""
        try:
            kid = jwt.get_unverified_header(token).get("kid")
        except jwt.InvalidTokenError as exc:
            raise AuthError("malformed", str(exc)) from None
        if kid is not None and not isinstance(kid, str):
            raise AuthError("malformed", "kid must be a string")
        keys = self._cached()
        if keys is None or (kid is not None and kid not in keys):
            async with self._lock:  # one fetch at a time; the others then read its result
                keys = self._cached()
                recent = time.monotonic() - self._last_fetch < self._cfg.jwks_min_refresh_s
                if keys is None:  # expired, or never fetched
                    if recent:  # a fetch has just failed: no second one yet
                        if self._last is None:
                            raise JwksUnavailable("the last fetch failed")
                        keys = self._last
                    else:
                        keys = await self._refresh()
                elif kid is not None and kid not in keys and not recent:  # a rotation, maybe
                    keys = await self._refresh()
        if kid is None:
            if len(keys) == 1:
                return next(iter(keys.values()))
            raise AuthError("malformed", "token without kid, and the JWKS has several keys")
        if kid not in keys:
            raise AuthError("unknown_key", "no key with the token's kid in the JWKS")
        return keys[kid]


def verify_token(token: str, cfg: JwtConfig, key: PyJWK | None = None) -> dict[str, Any]:
    """Verify ``token`` (the bare JWT, no "Bearer ") and return its claims. ``key``: the
    JWKS key (:meth:`JwksKeys.key_for`) of a ``jwks_url`` config; static keys come from ``cfg``.

    Checks signature (configured algorithm only), ``exp`` (required), ``nbf`` /
    ``iat`` (when present), ``iss`` / ``aud`` (when configured) and the lifetime cap.
    Does not look at the tenant claim. Raises :class:`AuthError`.
    """
    if not token:
        raise AuthError("missing_token")
    if len(token) > _MAX_TOKEN_CHARS:
        raise AuthError("malformed", "token too long")
    claims = _decode(token, cfg, key)
    # PyJWT has checked that int() takes exp (and iat when present): numbers or numeric strings.
    exp = int(claims["exp"])
    iat = int(claims["iat"]) if claims.get("iat") is not None else None
    if exp > time.time() + cfg.max_lifetime_s + cfg.leeway_s:
        raise AuthError("lifetime_too_long", f"exp is more than {cfg.max_lifetime_s} s in the future")
    if iat is not None and exp - iat > cfg.max_lifetime_s:
        raise AuthError("lifetime_too_long", f"exp - iat is more than {cfg.max_lifetime_s} s")
    return claims


def _decode(token: str, cfg: JwtConfig, jwk: PyJWK | None) -> dict[str, Any]:
    if cfg.jwks_url is not None:
        if jwk is None:
            raise ValueError("a jwks_url config verifies with the key JwksKeys.key_for returns")
        key, algorithm = jwk, jwk.algorithm_name
    else:
        key, algorithm = _verification_key(cfg), cfg.algorithm
    required = ["exp"] + (["aud"] if cfg.audience is not None else []) + (["iss"] if cfg.issuer is not None else [])
    try:
        return jwt.decode(
            token,
            key=key,
            algorithms=[algorithm],  # one algorithm only: no alg confusion, no "none"
            audience=cfg.audience,
            issuer=cfg.issuer,
            leeway=cfg.leeway_s,
            options={
                "require": required,
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
        raise AuthError("wrong_scheme", SCHEME_DETAIL)
    if len(parts) == 1:
        raise AuthError("missing_token", "Bearer without a token")
    if len(parts) != 2:
        raise AuthError("malformed", "expected 'Bearer <token>'")
    return parts[1]


def _claim(claims: dict[str, Any], name: str) -> Any:
    """The claim ``name``; a dotted name walks nested objects when no top-level claim has
    that exact name."""
    if name in claims:
        return claims[name]
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _parse_tenant(claims: dict[str, Any], claim: str) -> uuid.UUID:
    value = _claim(claims, claim)
    if value is None:
        raise AuthError("missing_tenant", f"claim {claim!r} missing")
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

    HS256 configs sign with ``cfg.secret``; public-key configs need ``private_key``
    (PEM, matching ``cfg.public_key``). Claims: ``sub``, the tenant claim,
    ``iat``, ``exp = iat + ttl_s`` and ``iss`` / ``aud`` when configured.
    """
    tenant = tenant_id if isinstance(tenant_id, uuid.UUID) else uuid.UUID(str(tenant_id))
    if ttl_s <= 0:
        raise ValueError("ttl_s must be positive")
    now = int(time.time())
    payload: dict[str, Any] = {"sub": subject, "iat": now, "exp": now + ttl_s}
    *parents, last = cfg.tenant_claim.split(".")
    node = payload
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = str(tenant)
    if cfg.issuer is not None:
        payload["iss"] = cfg.issuer
    if cfg.audience is not None:
        payload["aud"] = cfg.audience
    if cfg.algorithm == "HS256":
        if private_key is not None:
            raise ValueError("private_key given but the config is HS256 (secret)")
        return jwt.encode(payload, cfg.secret, algorithm="HS256")
    if cfg.algorithm is None:
        raise ValueError("a jwks_url config cannot mint: tokens come from the identity provider")
    if not private_key:
        raise ValueError(f"{cfg.algorithm} config: mint_token needs private_key (PEM)")
    _require_crypto()
    return jwt.encode(payload, private_key, algorithm=cfg.algorithm)


async def auth_guard(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    state = connection.app.state
    headers = connection.headers
    scope_state = connection.scope.setdefault("state", {})
    tid = scope_state.get("trace_id") or trace_id_from_headers(headers.get("traceparent"), headers.get("x-trace-id"))
    scope_state["trace_id"] = tid
    limits: Limits = state.limits  # 429s are LimitExceeded, answered with the trace id set above
    # per client address, before the token is verified: floods of bad tokens are bounded too
    limits.charge_address(connection.client.host if connection.client else None)
    cfg: JwtConfig = state.jwt
    try:
        token = _parse_bearer(headers.get("authorization"))
        key = await state.jwks.key_for(token) if cfg.jwks_url is not None else None
        tenant = _parse_tenant(verify_token(token, cfg, key), cfg.tenant_claim)
    except AuthError as exc:
        state.metrics.rejected.labels("unauthorized").inc()
        # the scheme's fix is the one detail worth telling (the others would help forge a token)
        raise ApiError(401, {"error": "unauthorized", "reason": exc.reason,
                             **({"detail": SCHEME_DETAIL} if exc.reason == "wrong_scheme" else {})},
                       headers={"WWW-Authenticate": 'Bearer realm="kb-rerank"', "X-Trace-Id": tid}) from None
    except JwksUnavailable:
        state.metrics.rejected.labels("jwks_unavailable").inc()
        raise ApiError(503, {"error": "identity_keys_unavailable",
                             "detail": "the identity provider's keys (KB_JWT_JWKS_URL) could not be fetched"},
                       headers={"Retry-After": "5", "X-Trace-Id": tid}) from None
    scope_state["tenant"] = tenant
    TENANT_ID.set(str(tenant))  # every log record of the rest of the request (kb_rerank.core.logs)
    limits.charge(tenant)  # 1 token: the whole cost of a cache hit; costly work is charged before it starts
