"""The record step of a computed answer in one statement (kb.record_outcome,
audit/sql/record_outcome.sql): the result-cache row, the new pair scores and the
signed audit row (and the release of the key's single-flight claim), written together in ONE round trip and one transaction.

The call runs as a single autocommit statement (no BEGIN / set_config / COMMIT): the
function sets the request's tenant for itself. All or nothing: when any part fails, none of
the three is written. The caller decides what is written (:meth:`kb_rerank.endpoints.runner.Pipeline.record`:
no cache row when the answer is not cacheable, no pair scores on a fallback); the rules of
each write (expired and older-generation rows replaced, a live row kept) are the function's,
the same as :mod:`.result_cache` and :mod:`.pair_cache`. The audit row's MAC is computed here
with the service's key (:mod:`.audit`), never by the database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from psycopg.types.json import Jsonb

from kb_rerank.audit import store as audit
from kb_rerank.rerank import pair_cache

RECORD = (
    "select cached, pairs, audit_seq from kb.record_outcome(%s::uuid, %s::bigint, %s::double precision,"
    " %s::jsonb, %s::text, %s::uuid[], %s::char(64)[], %s::real[],"
    " %s::text, %s::smallint, %s::text, %s::text, %s::text, %s::text, %s::integer, %s::integer, %s::real,"
    " %s::text, %s::text, %s::text, %s::text, %s::uuid)"
)


@dataclass(frozen=True)
class Recorded:
    cached: bool  # whether this call inserted the cache row
    pairs: int  # pair scores inserted
    audit_seq: int  # the audit row's seq in the tenant's chain


def params(tenant, rec: audit.AuditRecord, key: audit.AuditKey, *, generation: int, ttl_s: float,
           payload: Any = None, pair_query_hash: str | None = None,
           pairs: Mapping[pair_cache.PairKey, float] | None = None, claimant=None) -> list:
    """The arguments of kb.record_outcome. ``payload``: the cache row's JSON (None: no cache
    row); ``pairs``: the scores to keep (None or empty: none; only finite scores in 0..1 are
    stored, the pair cache's rule); ``claimant``: the single-flight claim
    (:mod:`.inflight`) this answer releases, None: none."""
    items = [(k, v) for k, v in (pairs or {}).items() if math.isfinite(v) and 0.0 <= v <= 1.0]
    return [
        str(tenant), int(generation), float(ttl_s), None if payload is None else Jsonb(payload),
        pair_query_hash if items else None,
        [k[0] for k, _ in items] if items else None,
        [k[1] for k, _ in items] if items else None,
        [float(v) for _, v in items] if items else None,
        *rec.params(tenant, key),
        None if claimant is None else str(claimant),
    ]


async def write(conn, tenant, rec: audit.AuditRecord, key: audit.AuditKey, **kw: Any) -> Recorded:
    """Write the outcome in one statement on ``conn`` (an autocommit connection: the
    statement is its own transaction; inside a transaction of the same tenant it joins it).
    ``kw``: see :func:`params`. Prepared on first use (it runs once per miss) only where the
    connection may prepare statements at all (``prepare_threshold`` not None:
    KB_PREPARED_STATEMENTS, :func:`kb_rerank.core.session.prepare_threshold`); otherwise never,
    so that it also runs through a transaction pooler."""
    prepare = getattr(conn, "prepare_threshold", None) is not None
    cur = await conn.execute(RECORD, params(tenant, rec, key, **kw), prepare=prepare)
    cached, pairs, seq = await cur.fetchone()
    return Recorded(bool(cached), int(pairs), int(seq))
