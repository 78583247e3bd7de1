"""Audit rows (kb.kb_rerank_audit) through kb.audit_append, and chain verification.

Rows are appended inside the caller's tenant transaction, so an audit row commits or
rolls back together with the work it describes (a cache write, for example). The row
never holds the query text: ``query_hash`` (sha256 of the normalised query) only, and
``detail`` is a short machine reason.
"""

from __future__ import annotations

from dataclasses import dataclass

SERVED = "served"
CACHE_HIT = "cache_hit"
FALLBACK = "fallback"
REJECTED = "rejected"
KINDS = (SERVED, CACHE_HIT, FALLBACK, REJECTED)

# 0 info, 1 notice, 2 degraded (fallback), 3 error
SEVERITY = {SERVED: 0, CACHE_HIT: 0, FALLBACK: 2, REJECTED: 1}

APPEND = (
    "select kb.audit_append(%s::text, %s::smallint, %s::text, %s::text, %s::text, %s::text,"
    " %s::integer, %s::integer, %s::real, %s::text)"
)


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

    def params(self) -> list:
        if self.kind not in KINDS:
            raise ValueError(f"unknown audit kind {self.kind!r}")
        sev = SEVERITY[self.kind] if self.severity is None else self.severity
        return [self.kind, sev, self.source, self.query_hash, self.trace_id, self.model,
                self.candidate_count, self.returned_count, self.duration_ms, self.detail]


async def append(conn, record: AuditRecord) -> None:
    """Append one row for the tenant of the current transaction."""
    await conn.execute(APPEND, record.params())


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


def verify(conn) -> list[VerifyRow]:
    """Run kb.audit_verify() (sync): one row per tenant visible to the connection."""
    rows = conn.execute(
        "select tenant_id, rows_checked, first_broken_seq, first_broken_audit_id, reason from kb.audit_verify()"
    ).fetchall()
    return [VerifyRow(*r) for r in rows]
