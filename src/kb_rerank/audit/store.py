"""Audit rows (kb.kb_rerank_audit) through kb.audit_append, and chain verification.

Rows are appended inside the caller's tenant transaction, so an audit row commits or
rolls back together with the work it describes (a cache write, for example). The row
never holds the query text: ``query_hash`` (HMAC-SHA256 of the normalised query:
kb_rerank.core.query.query_hash) only, and ``detail`` is a short machine reason.

Keyed chain: each row carries an HMAC-SHA256, computed here with the audit key
(``KB_AUDIT_KEY``, or the key file; kb_rerank.core.keys), over the canonical form below of the
row's caller-supplied fields, the tenant and a fresh random nonce. The database never holds
the key, so a writer with only database access (the app role, or kb.audit_append called
with made-up values) cannot produce a row that ``kb-rerank audit verify`` accepts; the SQL
chain (kb.audit_verify) still proves order and completeness. The MAC goes into the row's
SQL hash, and a MAC seen before for the tenant is refused (no replay).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import struct
import uuid
from dataclasses import dataclass

from kb_rerank.core import keys
from kb_rerank.core.settings import Settings

SERVED = "served"
CACHE_HIT = "cache_hit"
FALLBACK = "fallback"
REJECTED = "rejected"
KINDS = (SERVED, CACHE_HIT, FALLBACK, REJECTED)

# 0 info, 1 notice, 2 degraded (fallback), 3 error
SEVERITY = {SERVED: 0, CACHE_HIT: 0, FALLBACK: 2, REJECTED: 1}

APPEND = (
    "select kb.audit_append(%s::text, %s::smallint, %s::text, %s::text, %s::text, %s::text,"
    " %s::integer, %s::integer, %s::real, %s::text, %s::text, %s::text, %s::text)"
)
MAC_VERSION = "kb-audit-mac-v1"


def _real(value) -> str:
    """duration_ms as stored (float4, big-endian hex): the same for the double the service
    sends and the value read back, whatever its text form."""
    return "" if value is None else struct.pack(">f", float(value)).hex()


def canonical(tenant_id, nonce: str, kind: str, severity: int, source: str, query_hash: str, trace_id: str,
              model: str | None, candidate_count: int, returned_count: int, duration_ms, detail: str | None) -> bytes:
    """THE canonical form of an audit row for its MAC (defined here only): a JSON array
    (unambiguous whatever the fields hold) of a version label, the tenant, the nonce and the
    caller-supplied fields. seq, prev_hash and created_at are the database's, covered by the
    SQL chain instead."""
    # the tenant in the database's text form whatever the caller holds (UUID or string);
    # none set: the database refuses the append anyway
    tenant = "" if tenant_id is None else str(uuid.UUID(str(tenant_id)))
    fields = [MAC_VERSION, tenant, nonce, kind, int(severity), source, query_hash.rstrip(" "), trace_id,
              model, int(candidate_count or 0), int(returned_count or 0), _real(duration_ms), detail]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def mac(key: bytes, message: bytes) -> str:
    return hmac.new(key, message, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class AuditKey:
    key: bytes

    @property
    def key_id(self) -> str:
        return keys.fingerprint(self.key)

    @classmethod
    def from_settings(cls, settings: Settings) -> "AuditKey":
        return cls(keys.server_key(settings, "audit", settings.audit_key))


@dataclass(frozen=True)
class AuditRecord:
    kind: str
    source: str
    query_hash: str
    trace_id: str
    model: str | None = None
    candidate_count: int = 0
    returned_count: int = 0
    duration_ms: float | None = None
    detail: str | None = None
    severity: int | None = None

    def fields(self) -> list:
        if self.kind not in KINDS:
            raise ValueError(f"unknown audit kind {self.kind!r}")
        sev = SEVERITY[self.kind] if self.severity is None else self.severity
        return [self.kind, sev, self.source, self.query_hash, self.trace_id, self.model,
                self.candidate_count, self.returned_count, self.duration_ms, self.detail]

    def params(self, tenant_id, key: AuditKey) -> list:
        """The arguments of kb.audit_append: the fields, the MAC, its nonce and key id."""
        f = self.fields()
        nonce = secrets.token_hex(16)
        return f + [mac(key.key, canonical(tenant_id, nonce, *f)), nonce, key.key_id]


async def append(conn, record: AuditRecord, *, tenant_id, key: AuditKey) -> None:
    """Append one row in the caller's tenant transaction. ``tenant_id``: that transaction's
    tenant, which the MAC covers (the row is written for the transaction's tenant; a MAC over
    another would not verify). ``key``: the service's audit key (read once at start:
    ``Pipeline.audit_key``). No extra round trip: the caller knows its tenant."""
    await conn.execute(APPEND, record.params(tenant_id, key))


APPEND_ROW = APPEND.replace("select kb.audit_append(", "select * from kb.audit_append(", 1)


async def append_row(conn, record: AuditRecord, *, tenant_id=None, key: AuditKey | None = None) -> dict:
    """:func:`append` for administration and tests, returning the stored row as a dict; the
    tenant read from the transaction and the key from the environment's settings unless
    given."""
    if tenant_id is None:
        tenant_id = (await (await conn.execute("select kb.current_tenant()")).fetchone())[0]
    cur = await conn.execute(APPEND_ROW, record.params(tenant_id, key or AuditKey.from_settings(Settings.from_env())))
    return dict(zip([d.name for d in cur.description], await cur.fetchone()))


@dataclass(frozen=True)
class VerifyRow:
    tenant_id: object
    rows_checked: int
    first_broken_seq: int | None
    first_broken_audit_id: int | None
    reason: str | None

    @property
    def ok(self) -> bool:
        return self.first_broken_seq is None and self.first_broken_audit_id is None and not self.reason


async def verify(conn) -> list[VerifyRow]:
    """Run kb.audit_verify(): one row per tenant visible to the connection."""
    cur = await conn.execute(
        "select tenant_id, rows_checked, first_broken_seq, first_broken_audit_id, reason from kb.audit_verify()")
    rows = await cur.fetchall()
    return [VerifyRow(*r) for r in rows]


# --------------------------------------------------------------------------- MAC check

ROWS = ("select tenant_id, seq, kind, severity, source, query_hash, trace_id, model, candidate_count,"
        " returned_count, duration_ms, detail, mac, nonce, key_id from kb.kb_rerank_audit")


@dataclass(frozen=True)
class MacProblem:
    tenant_id: object
    seq: int
    reason: str  # 'forged' (MAC does not verify), 'unknown key', 'unkeyed after keyed rows'


@dataclass(frozen=True)
class MacReport:
    checked: int
    legacy: int  # rows written before the chain was keyed (no MAC), before any keyed row
    problems: list[MacProblem]
    checkpoints: int = 0  # signed chain checkpoints verified (retention: archived months)

    @property
    def ok(self) -> bool:
        return not self.problems


async def verify_macs(conn, audit_keys: list[bytes], tenant_id=None) -> MacReport:
    """Check every visible row's MAC with the key its key_id names (``audit_keys``: the
    current key and any old ones), and every signed chain checkpoint's. A bad row is
    reported by (tenant, seq); the rows after it are checked on their own, so one bad row
    does not hide or break the rest. A MAC seen twice in a tenant's log is reported
    ('replayed'): the database refuses it at append, but its unique index holds within a
    month only (the log is partitioned)."""
    by_id = {keys.fingerprint(k): k for k in audit_keys}
    where = " where tenant_id = %s" if tenant_id is not None else ""
    params = [tenant_id] if tenant_id is not None else []
    checked = legacy = 0
    problems: list[MacProblem] = []
    keyed_seen: set = set()
    current, macs_seen = None, set()
    async with conn.cursor(name="kb_audit_macs") if not conn.autocommit else conn.cursor() as cur:
        await cur.execute(ROWS + where + " order by tenant_id, seq", params)
        async for (t, seq, kind, sev, source, qh, trace, model, cand, ret, dur, detail, m, nonce, key_id) in cur:
            if m is None:
                if t in keyed_seen:
                    problems.append(MacProblem(t, seq, "unkeyed after keyed rows"))
                else:
                    legacy += 1
                continue
            keyed_seen.add(t)
            checked += 1
            if t != current:
                current, macs_seen = t, set()
            if m in macs_seen:
                problems.append(MacProblem(t, seq, "replayed"))
                continue
            macs_seen.add(m)
            key = by_id.get(key_id)
            if key is None:
                problems.append(MacProblem(t, seq, f"unknown key {key_id}"))
                continue
            expected = mac(key, canonical(t, nonce, kind, sev, source, qh, trace, model, cand, ret, dur, detail))
            if not hmac.compare_digest(expected, m):
                problems.append(MacProblem(t, seq, "forged"))
    points = 0
    cur = await conn.execute(CHECKPOINTS + where + " order by tenant_id, seq", params)
    for t, seq, row_hash, archived_before, m, key_id in await cur.fetchall():
        points += 1
        key = by_id.get(key_id)
        if key is None:
            problems.append(MacProblem(t, seq, f"checkpoint: unknown key {key_id}"))
        elif not hmac.compare_digest(mac(key, checkpoint_canonical(t, seq, row_hash, archived_before)), m):
            problems.append(MacProblem(t, seq, "checkpoint forged"))
    return MacReport(checked, legacy, problems, points)


# --------------------------------------------------------------------------- checkpoints

CHECKPOINT_VERSION = "kb-audit-checkpoint-v1"
CHECKPOINTS = "select tenant_id, seq, row_hash, archived_before, mac, key_id from kb.audit_checkpoints"


def checkpoint_canonical(tenant_id, seq: int, row_hash: str, archived_before) -> bytes:
    """THE canonical form of a chain checkpoint for its MAC: the tenant's row ``seq`` had
    ``row_hash`` and was its last row before the month ``archived_before`` (a date)."""
    fields = [CHECKPOINT_VERSION, str(uuid.UUID(str(tenant_id))), int(seq), row_hash, str(archived_before)]
    return json.dumps(fields, separators=(",", ":")).encode("utf-8")


def verify_keys(settings: Settings) -> list[bytes]:
    """The audit key and the old keys (KB_AUDIT_OLD_KEYS, comma-separated) to verify with."""
    out = [keys.server_key(settings, "audit", settings.audit_key)]
    for old in (settings.audit_old_keys or "").split(","):
        if old.strip():
            out.append(old.strip().encode("utf-8"))
    return out
