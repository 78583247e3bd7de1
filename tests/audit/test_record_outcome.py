"""kb.record_outcome: the record step's cache row, pair scores and audit
row in one statement, as the app role: what it writes, that it is all or nothing, that it
keeps the tenant to the call, and that it lets the app role forge no audit row."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from kb_rerank.audit import store as audit, record
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.session import run

KEY = audit.AuditKey(b"r" * 32)
SOURCE = "hybrid_lexical_semantic"


def qh() -> str:
    return uuid.uuid4().hex * 2


def served(query_hash: str, trace: str = "trace-1") -> audit.AuditRecord:
    return audit.AuditRecord(kind=audit.SERVED, source=SOURCE, query_hash=query_hash, trace_id=trace, model="m",
                             candidate_count=3, returned_count=2, duration_ms=12.5, detail=None)


def pairs(n: int = 3, score: float = 0.5) -> dict:
    return {(uuid.uuid4(), uuid.uuid4().hex * 2): score for _ in range(n)}


@pytest.fixture
def app_auto(app_url):
    """An autocommit connection as kb_app, as the service's pool holds."""
    with psycopg.connect(app_url, autocommit=True) as conn:
        yield conn


def call(conn, tenant, rec, *, key=KEY, generation=1, ttl_s=3600.0, payload=None, pair_query_hash=None, scores=None,
         claimant=None):
    return conn.execute(record.RECORD, record.params(tenant, rec, key, generation=generation, ttl_s=ttl_s,
                                                     payload=payload, pair_query_hash=pair_query_hash,
                                                     pairs=scores, claimant=claimant)).fetchone()


def counts(owner_conn, tenant) -> tuple[int, int, int]:
    return tuple(owner_conn.execute(f"select count(*) from kb.{t} where tenant_id = %s", [tenant]).fetchone()[0]
                 for t in ("kb_rerank_cache", "kb_rerank_pair_scores", "kb_rerank_audit"))


def test_one_statement_writes_cache_row_pair_scores_and_a_verifying_audit_row(app_auto, owner_conn, tenant):
    q, pq, scores = qh(), qh(), pairs(4, 0.25)
    assert call(app_auto, tenant, served(q), generation=7, payload={"results": [1]}, pair_query_hash=pq,
                scores=scores) == (True, 4, 1)
    row = owner_conn.execute("select query_hash, source, generation, results_jsonb, trace_id, model,"
                             " expires_at > now() + interval '59 minutes' from kb.kb_rerank_cache where tenant_id = %s",
                             [tenant]).fetchone()
    assert row == (q, SOURCE, 7, {"results": [1]}, "trace-1", "m", True)
    got = owner_conn.execute("select chunk_id, content_hash, score, model, query_hash, generation"
                             " from kb.kb_rerank_pair_scores where tenant_id = %s", [tenant]).fetchall()
    assert {(c, h): s for c, h, s, *_ in got} == scores
    assert {tuple(r[3:]) for r in got} == {("m", pq, 7)}
    # the audit row: the service's MAC verifies, the SQL chain too
    report = run(owner_conn, audit.verify_macs, [KEY.key], tenant_id=tenant)
    assert report.ok and report.checked == 1
    assert [(v.ok, v.rows_checked) for v in run(owner_conn, audit.verify) if v.tenant_id == tenant] == [(True, 1)]
    assert owner_conn.execute("select kind, query_hash, trace_id, model, candidate_count, returned_count"
                              " from kb.kb_rerank_audit where tenant_id = %s", [tenant]).fetchone() == (
        "served", q, "trace-1", "m", 3, 2)


def test_it_releases_the_single_flight_claim_it_is_given_and_no_other(app_auto, owner_conn, tenant):
    """The claimant's release rides in the same statement as its cache row (a waiting process
    sees both at once); another process's claim on the key, or a claim of another key, stays."""
    from kb_rerank.core import inflight

    q, other_q = qh(), qh()
    me, them = uuid.uuid4(), uuid.uuid4()
    with tenant_transaction(app_auto, tenant):
        app_auto.execute(inflight.CLAIM, [q, SOURCE, 3, me, 60.0])
        app_auto.execute(inflight.CLAIM, [other_q, SOURCE, 3, them, 60.0])

    def claims():
        return set(owner_conn.execute("select query_hash, claimant from kb.kb_rerank_inflight where tenant_id = %s",
                                      [tenant]).fetchall())

    # a stranger's claimant id releases nothing
    call(app_auto, tenant, served(other_q), generation=3, payload={"r": 1}, claimant=me)
    assert claims() == {(q, me), (other_q, them)}
    assert call(app_auto, tenant, served(q), generation=3, payload={"r": 2}, claimant=me)[0] is True
    assert claims() == {(other_q, them)}
    # a failing call (no MAC) releases nothing either: all of it or none
    bad = record.params(tenant, served(other_q), KEY, generation=3, ttl_s=60.0, claimant=them)
    bad[-4:-1] = [None, None, None]
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        app_auto.execute(record.RECORD, bad)
    assert claims() == {(other_q, them)}


def test_not_cacheable_and_fallback_write_the_audit_row_only(app_auto, owner_conn, tenant):
    fallback = audit.AuditRecord(kind=audit.FALLBACK, source=SOURCE, query_hash=qh(), trace_id="t", model="m",
                                 detail="timeout")
    assert call(app_auto, tenant, fallback) == (False, 0, 1)
    # empty pair scores are none, whatever the query hash says
    assert call(app_auto, tenant, served(qh()), pair_query_hash=qh(), scores={}) == (False, 0, 2)
    assert counts(owner_conn, tenant) == (0, 0, 2)
    assert run(owner_conn, audit.verify_macs, [KEY.key], tenant_id=tenant).ok


def test_a_live_row_is_kept_and_older_generations_are_replaced(app_auto, owner_conn, tenant):
    q, pq, scores = qh(), qh(), pairs(2)
    assert call(app_auto, tenant, served(q), generation=1, payload=["first"], pair_query_hash=pq,
                scores=scores)[:2] == (True, 2)
    # same key, same generation: the live row written first wins (ON CONFLICT DO NOTHING)
    assert call(app_auto, tenant, served(q), generation=1, payload=["second"], pair_query_hash=pq,
                scores={k: 0.9 for k in scores})[:2] == (False, 0)
    assert owner_conn.execute("select results_jsonb from kb.kb_rerank_cache where tenant_id = %s",
                              [tenant]).fetchone()[0] == ["first"]
    # a newer generation drops the key's older rows and writes its own
    assert call(app_auto, tenant, served(q), generation=2, payload=["third"], pair_query_hash=pq,
                scores={k: 0.75 for k in scores})[:2] == (True, 2)
    assert owner_conn.execute("select generation, results_jsonb from kb.kb_rerank_cache where tenant_id = %s",
                              [tenant]).fetchall() == [(2, ["third"])]
    assert {r for r in owner_conn.execute("select generation, score from kb.kb_rerank_pair_scores"
                                          " where tenant_id = %s", [tenant])} == {(2, 0.75)}
    # an expired row of the same generation is replaced too
    owner_conn.execute("update kb.kb_rerank_cache set expires_at = now() - interval '1 second' where tenant_id = %s",
                       [tenant])
    assert call(app_auto, tenant, served(q), generation=2, payload=["fourth"])[0] is True
    assert owner_conn.execute("select results_jsonb from kb.kb_rerank_cache where tenant_id = %s",
                              [tenant]).fetchall() == [(["fourth"],)]


@pytest.mark.parametrize("failure", ["audit", "pair score", "replayed mac"])
def test_a_failure_in_any_part_writes_none_of_them(app_auto, owner_conn, tenant, failure):
    if failure == "replayed mac":  # refused by the audit table's unique (tenant_id, mac), the last write
        rec = served(qh())
        first = record.params(tenant, rec, KEY, generation=1, ttl_s=60.0)
        app_auto.execute(record.RECORD, first)
        again = record.params(tenant, rec, KEY, generation=1, ttl_s=60.0, payload=["x"], pair_query_hash=qh(),
                              pairs=pairs(2))
        again[8:] = first[8:]  # the first call's audit arguments, its MAC and nonce included
        with pytest.raises(psycopg.errors.UniqueViolation):
            app_auto.execute(record.RECORD, again)
        assert counts(owner_conn, tenant) == (0, 0, 1)
        return
    params = record.params(tenant, served(qh()), KEY, generation=1, ttl_s=60.0, payload=["x"],
                           pair_query_hash=qh(), pairs=pairs(3))
    if failure == "audit":
        params[-3] = "not-a-mac"  # kb.audit_append's checks refuse it, after both cache writes
        error = psycopg.errors.InvalidParameterValue
    else:
        params[7] = [0.5, 0.5, 1.5]  # the pair table's check (score <= 1), after the cache row
        error = psycopg.errors.CheckViolation
    with pytest.raises(error):
        app_auto.execute(record.RECORD, params)
    assert counts(owner_conn, tenant) == (0, 0, 0)


def test_the_tenant_is_set_for_the_call_only_and_never_switched(app_auto, owner_conn):
    a, b = uuid.uuid4(), uuid.uuid4()
    with app_auto.transaction():
        assert call(app_auto, a, served(qh()), payload=["a"])[:2] == (True, 0)
        # not left set on the transaction after the call
        assert app_auto.execute("select kb.current_tenant()").fetchone()[0] is None
    # a transaction of tenant B cannot write as A through it
    with tenant_transaction(app_auto, b):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with app_auto.transaction():
                call(app_auto, a, served(qh()), payload=["from b"])
        assert call(app_auto, b, served(qh()), payload=["b"])[:2] == (True, 0)
        assert app_auto.execute("select kb.current_tenant()").fetchone()[0] == b
    assert counts(owner_conn, a) == (1, 0, 1) and counts(owner_conn, b) == (1, 0, 1)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        with app_auto.transaction():
            app_auto.execute(record.RECORD, [None, *record.params(a, served(qh()), KEY, generation=1, ttl_s=1.0)[1:]])


def test_app_role_cannot_forge_an_audit_row_through_it(app_auto, owner_conn, tenant):
    """Same guarantee as kb.audit_append: the function is SECURITY INVOKER, the audit row is
    still written by kb.audit_append alone (seq, chain and clock are the database's), and a row
    whose MAC was not made with the service's key is stored but reported as forged."""
    assert owner_conn.execute("select prosecdef from pg_proc where proname = 'record_outcome'").fetchone()[0] is False
    rec = served(qh(), trace="forged")
    made_up = record.params(tenant, rec, audit.AuditKey(b"attacker-key" * 3), generation=1, ttl_s=60.0)
    app_auto.execute(record.RECORD, made_up)  # well-formed, so stored like any append ...
    report = run(owner_conn, audit.verify_macs, [KEY.key], tenant_id=tenant)  # ... and caught by verification
    assert [p.reason for p in report.problems] == ["unknown key " + audit.AuditKey(b"attacker-key" * 3).key_id]
    # a MAC under the right key id but not computed with the key
    fake = record.params(tenant, served(qh(), trace="forged-2"), KEY, generation=1, ttl_s=60.0)
    fake[-4] = "0" * 64  # mac, nonce, key_id, claimant
    app_auto.execute(record.RECORD, fake)
    report = run(owner_conn, audit.verify_macs, [KEY.key], tenant_id=tenant)
    assert [p.reason for p in report.problems][-1] == "forged"
    # no MAC at all is refused, and the table itself stays closed to the app role
    unkeyed = record.params(tenant, served(qh()), KEY, generation=1, ttl_s=60.0)
    unkeyed[-4:-1] = [None, None, None]
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        app_auto.execute(record.RECORD, unkeyed)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with app_auto.transaction():
            app_auto.execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
            app_auto.execute("insert into kb.kb_rerank_audit (tenant_id, seq, kind, severity, source, query_hash,"
                             " trace_id, prev_hash, row_hash) values (kb.current_tenant(), 99, 'served', 0,"
                             " 'lexical_only', repeat('a', 64), 'x', repeat('0', 64), repeat('0', 64))")
