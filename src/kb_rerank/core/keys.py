"""Server-side keys: the audit MAC key and the query-hash key (docs/security.md).

A key comes from its setting (``KB_AUDIT_KEY``, ``KB_QUERY_HASH_KEY``) when set. When unset
(a single-machine install: ``make demo``, the embedded server, tests), it is read from
``<data_dir>/keys/<name>.key``, created on first use with 32 random bytes (hex, mode 0600).
Several replicas must share one key: set the variable on all of them.
The database roles never hold these keys: that is what makes a keyed value unforgeable
from SQL.

:func:`check_secret` (placeholder and low-entropy secrets refused) lives here, below the
HTTP layer that checks the JWT secret and ops token with it (so that no import circle runs through the HTTP package).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from pathlib import Path

from kb_rerank.core.settings import Settings

MIN_KEY_BYTES = 32
MIN_SECRET_BYTES = 32  # an HS256 secret: RFC 7518 section 3.2, key >= hash output size (SHA-256)


class KeyConfigError(ValueError):
    """A configured key is too short or unreadable."""


def _check(name: str, key: bytes) -> bytes:
    if len(key) < MIN_KEY_BYTES:
        raise KeyConfigError(f"the {name} key must be at least {MIN_KEY_BYTES} bytes, got {len(key)}")
    return key


# Secrets shipped in this repository or in well-known examples: anyone can read them.
# Compared after lower-casing and dropping everything but letters and digits.
_KNOWN_PLACEHOLDERS = (
    "changemetoasecretofatleast32bytes",  # docker/compose.yaml of early releases
    "kbrerankdevsecretdonotuseinproduction",  # dev.DEV_JWT_SECRET (`serve --dev` only)
    "your256bitsecret",  # jwt.io's default
)
_PLACEHOLDER_WORDS = ("changeme", "example", "placeholder", "replaceme", "yoursecret", "your256bitsecret",
                      "secretsecret", "donotuse", "insecure", "notasecret")
_MIN_DISTINCT_CHARS = 8  # 32 random hex digits have 14 on average; fewer than 8 has p < 1e-6
_LONG_RUN = re.compile(r"(.)\1{7}")  # one character 8 times in a row (p ~ 1e-7 in 64 random hex digits)


def check_secret(name: str, value: str, *, min_bytes: int = MIN_SECRET_BYTES) -> None:
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


def key_file(settings: Settings, name: str) -> Path:
    return settings.data_dir / "keys" / f"{name}.key"


def server_key(settings: Settings, name: str, configured: str | None) -> bytes:
    """The key ``name`` ('audit', 'query_hash'): ``configured`` (the setting's value) when
    given, else the key file under data_dir, created on first use."""
    if configured:
        return _check(name, configured.encode("utf-8"))
    path = key_file(settings, name)
    try:
        return _check(name, path.read_text(encoding="ascii").strip().encode("ascii"))
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    value = secrets.token_hex(32)
    # O_EXCL: two processes starting at once agree on the first file written
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return _check(name, path.read_text(encoding="ascii").strip().encode("ascii"))
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(value + "\n")
    return value.encode("ascii")


def fingerprint(key: bytes) -> str:
    """A short public id of a key (first 16 hex of SHA-256 over a domain label and the key),
    stored beside what it keyed so that verification after a rotation picks the right key."""
    return hashlib.sha256(b"kb-rerank key id\x00" + key).hexdigest()[:16]


# (setting's environment variable, Settings field) of every server key
KEY_SETTINGS = (("KB_AUDIT_KEY", "audit_key"), ("KB_QUERY_HASH_KEY", "query_hash_key"))


def check_configured(settings: Settings, *, require: bool) -> None:
    """Start-up check of the server keys (``kb-rerank serve``). A configured key must be a
    strong secret (no placeholder, enough entropy). With ``require`` (a deployment: the app
    role's URL is given and --dev is not), an unset key is an error: the generated key file
    is per machine and per data folder, so replicas would disagree and a container restart
    without a volume would change every query hash and orphan every audit MAC."""
    missing = []
    for env_name, field_name in KEY_SETTINGS:
        value = getattr(settings, field_name)
        if value:
            check_secret(env_name, value)
        elif require:
            missing.append(env_name)
    if missing:
        raise KeyConfigError(
            f"set {' and '.join(missing)} (each at least {MIN_KEY_BYTES} random bytes, e.g. `openssl rand -hex 32`,"
            " the same on every replica); a generated key file is used only with the embedded server or --dev")
