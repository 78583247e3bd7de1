"""The DBA surface: `kb-rerank audit verify` never prints OK over
nothing, `kb-rerank migrate --sql` prints without applying."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from psycopg import sql

from kb_rerank.cli import main as cli
from kb_rerank.db import database as db
from kb_rerank.core.settings import Settings
from kb_rerank.audit import store as audit
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core import session

KEY = b"d" * 40
BEHIND, PENDING = "0027_language_stats", "0028_vector_storage"  # the revision before head, and head


def _row(app_conn, tenant):
    rec = audit.AuditRecord(kind="served", source="lexical_only", query_hash="a" * 64,
                            trace_id=uuid.uuid4().hex, model="m", duration_ms=1.5)
    with tenant_transaction(app_conn, tenant):
        return session.run(app_conn, audit.append_row, rec, key=audit.AuditKey(KEY))


@pytest.fixture
def verify_env(monkeypatch):
    monkeypatch.setenv("KB_AUDIT_KEY", KEY.decode())
    monkeypatch.delenv("KB_AUDIT_OLD_KEYS", raising=False)

    def run(url, *args):
        monkeypatch.setenv("KB_DATABASE_URL", url)
        return cli.main(["audit", "verify", *args])
    return run


def test_verify_as_the_app_role_fails_and_says_why(app_conn, tenant, app_url, verify_env, capsys):
    _row(app_conn, tenant)
    for args in ([], ["--tenant", str(tenant)]):
        assert verify_env(app_url, *args) == 2
        captured = capsys.readouterr()
        assert "OK" not in captured.out
        assert "role kb_app lacks" in captured.err and "EXECUTE on kb.audit_verify()" in captured.err


def test_verify_of_a_tenant_with_no_rows_fails_unless_allowed(owner_url, verify_env, capsys):
    nobody = uuid.uuid4()
    assert verify_env(owner_url, "--tenant", str(nobody)) == 2
    captured = capsys.readouterr()
    assert "OK" not in captured.out and f"no audit rows visible for tenant {nobody}" in captured.err
    assert verify_env(owner_url, "--tenant", str(nobody), "--allow-empty") == 0
    assert capsys.readouterr().out.startswith("OK: no audit rows")


@pytest.fixture
def rls_bound_role(owner_url):
    """A login role with every privilege verify needs but bound by RLS (no superuser, no
    BYPASSRLS): like a table owner that is not a superuser, it sees no tenant's rows."""
    name, password = f"kb_test_auditor_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(sql.SQL("create role {} login nosuperuser nobypassrls password {}").format(
            sql.Identifier(name), sql.Literal(password)))
        # CONNECT is the app role's alone since 0016_app_role: a DBA's role is granted its own
        conn.execute(sql.SQL("grant connect on database {} to {}").format(
            sql.Identifier(conn.info.dbname), sql.Identifier(name)))
        conn.execute(sql.SQL("grant usage on schema kb to {0}; grant select on kb.kb_rerank_audit, kb.audit_checkpoints to {0};"
                             " grant execute on function kb.audit_verify(), kb.audit_row_hash(kb.kb_rerank_audit),"
                             " kb.current_tenant() to {0}").format(sql.Identifier(name)))
    yield db.replace_url(owner_url, user=name, password=password)
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop owned by {0}; drop role {0}").format(sql.Identifier(name)))


def test_verify_all_tenants_as_an_rls_bound_role_fails_one_tenant_verifies(
        app_conn, tenant, rls_bound_role, verify_env, capsys):
    for _ in range(2):
        _row(app_conn, tenant)
    # the trap: this role's kb.audit_verify() returns no row at all, which used to print OK
    with psycopg.connect(rls_bound_role) as conn:
        assert session.run(conn, audit.verify) == []
    assert verify_env(rls_bound_role) == 2
    captured = capsys.readouterr()
    assert "OK" not in captured.out and "bound by row-level security" in captured.err
    # with --tenant, RLS shows it that tenant's rows: verified
    assert verify_env(rls_bound_role, "--tenant", str(tenant)) == 0
    assert "OK: 2 audit rows of 1 tenant(s) verified; 2 MACs verified" in capsys.readouterr().out


# --------------------------------------------------------------------------- migrate --sql


@pytest.fixture(scope="module")
def behind_url(server_url):
    """A database of its own, migrated to the revision before head."""
    from tests.conftest import _fresh_database

    url = _fresh_database(server_url, f"kb_test_dba_{uuid.uuid4().hex[:8]}")
    db.migrate(Settings(database_url=url), revision=BEHIND)
    yield url
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(
            sql.Identifier(psycopg.conninfo.conninfo_to_dict(url)["dbname"])))


def _snapshot(url):
    with psycopg.connect(url) as conn:
        return (db.current_revision(conn),
                conn.execute("select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
                             " where n.nspname = 'kb'").fetchone()[0],
                conn.execute("select md5(string_agg(c.relname || ':' || a.attname, ',' order by c.relname, a.attnum))"
                             " from pg_attribute a join pg_class c on c.oid = a.attrelid"
                             " join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'kb'"
                             " and a.attnum > 0").fetchone()[0],
                conn.execute("select to_regprocedure('kb.schema_layer_version()') is not null").fetchone()[0])


def test_migrate_sql_prints_the_pending_upgrade_and_applies_nothing(behind_url, monkeypatch, capsys):
    from kb_rerank.db import layer as sqlfiles

    monkeypatch.setenv("KB_DATABASE_URL", behind_url)
    before = _snapshot(behind_url)
    assert before[0] == BEHIND and before[3] is False  # no layer applied below head
    assert cli.main(["migrate", "--sql"]) == 0
    out = capsys.readouterr().out
    assert _snapshot(behind_url) == before  # nothing applied
    assert db.head_revision() == PENDING
    assert out.startswith(f"-- kb-rerank migrate --sql: database at revision {BEHIND}, target {PENDING}")
    # the pending revision's versioned file, verbatim, and not the ones already applied
    assert f"-- ===== db/schema/{PENDING}.sql" in out and f"db/schema/{BEHIND}.sql" not in out
    assert sqlfiles.render(sqlfiles.versioned_file(f"{PENDING}.sql"), embedding_dim=Settings().embedding_dim).strip() in out
    assert f"UPDATE kb_alembic_version SET version_num='{PENDING}'" in out
    # the idempotent layer, in order, and its version, all inside one transaction
    rels = [f"-- ===== {rel}" for rel, _ in sqlfiles.idempotent_files()]
    positions = [out.index(r) for r in rels]
    assert positions == sorted(positions) and positions[0] > out.index(f"{PENDING}.sql")
    assert "create or replace function kb.audit_verify()" in out
    assert sqlfiles.layer_version(embedding_dim=Settings().embedding_dim) in out
    assert out.index("BEGIN;") < positions[0] and out.rstrip().endswith("COMMIT;")


def test_migrate_sql_output_applies_like_migrate(behind_url, monkeypatch, capsys):
    """What was printed is what migrate runs: applied with psql semantics, the database
    reaches head with this package's layer, and a second --sql has nothing to print."""
    from kb_rerank.db import layer as sqlfiles

    monkeypatch.setenv("KB_DATABASE_URL", behind_url)
    assert cli.main(["migrate", "--sql"]) == 0
    script = capsys.readouterr().out
    with psycopg.connect(behind_url, autocommit=True) as conn:
        conn.execute(script)
        assert db.current_revision(conn) == PENDING
        assert sqlfiles.applied_layer_version(conn) == sqlfiles.layer_version(embedding_dim=Settings().embedding_dim)
    assert cli.main(["migrate", "--sql"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("-- nothing to apply")


def test_verify_of_an_empty_log_fails_unless_allowed(behind_url, verify_env, capsys):
    """All tenants, as a superuser, on a database whose audit log is empty."""
    db.migrate(Settings(database_url=behind_url))  # head (already there after the test above)
    with psycopg.connect(behind_url) as conn:
        assert conn.execute("select count(*) from kb.kb_rerank_audit").fetchone()[0] == 0
    assert verify_env(behind_url) == 2
    captured = capsys.readouterr()
    assert "OK" not in captured.out and "no audit rows visible for any tenant" in captured.err
    assert verify_env(behind_url, "--allow-empty") == 0


def test_migrate_refuses_a_role_bound_by_rls(rls_bound_role, monkeypatch, capsys):
    """Forced RLS binds a non-superuser owner: its migration would skip every tenant's rows
    without an error. Refused before anything runs, saying why."""
    monkeypatch.setenv("KB_DATABASE_URL", rls_bound_role)
    assert cli.main(["migrate"]) == 1
    err = capsys.readouterr().err
    assert "neither superuser nor BYPASSRLS" in err and "silently skip" in err


# --------------------------------------------------------------------------- retention (0015)


@pytest.fixture(scope="module")
def retention_url(server_url):
    """A database of its own at head: these tests create and drop audit partitions."""
    from tests.conftest import _fresh_database

    url = _fresh_database(server_url, f"kb_test_ret_{uuid.uuid4().hex[:8]}")
    db.migrate(Settings(database_url=url))
    yield url
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("drop database if exists {} with (force)").format(
            sql.Identifier(psycopg.conninfo.conninfo_to_dict(url)["dbname"])))


def _months_ahead(n):
    import datetime as dt

    first = dt.datetime.now(dt.timezone.utc).date().replace(day=1)
    y, m = divmod(first.month - 1 + n, 12)
    return first.replace(year=first.year + y, month=m + 1)


def _partition_of(url, tenant):
    with psycopg.connect(url) as conn:
        return sorted({r[0] for r in conn.execute(
            "select tableoid::regclass::text from kb.kb_rerank_audit where tenant_id = %s", [tenant])})


def test_archive_drops_old_months_and_what_remains_still_verifies(retention_url, verify_env, monkeypatch, capsys):
    import os

    app_url = db.app_url(Settings(database_url=retention_url, app_password=os.environ.get("KB_TEST_APP_PASSWORD")))
    this, nxt = _months_ahead(0), _months_ahead(1)
    this_part = f"kb.kb_rerank_audit_{this:%Y_%m}"
    monkeypatch.setenv("KB_DATABASE_URL", retention_url)
    assert cli.main(["audit", "partitions"]) == 0
    assert capsys.readouterr().out.split() == ["created", this_part, "created", f"kb.kb_rerank_audit_{nxt:%Y_%m}"]
    a, b = uuid.uuid4(), uuid.uuid4()
    with psycopg.connect(app_url) as app:
        for t, n in ((a, 3), (b, 2)):
            for _ in range(n):
                _row(app, t)
    assert _partition_of(retention_url, a) == [this_part]
    with psycopg.connect(retention_url) as conn:
        last_a = conn.execute("select row_hash from kb.kb_rerank_audit where tenant_id = %s and seq = 3",
                              [a]).fetchone()[0]
    monkeypatch.setenv("KB_AUDIT_KEY", KEY.decode())
    # a dry run checks and drops nothing
    assert cli.main(["audit", "archive", "--before", f"{nxt:%Y-%m}", "--dry-run"]) == 0
    assert "dry run" in capsys.readouterr().out and _partition_of(retention_url, a) == [this_part]
    assert cli.main(["audit", "archive", "--before", f"{nxt:%Y-%m}"]) == 0
    assert f"dropped {this_part.removeprefix('kb.')}; 2 tenant checkpoint(s) written" in capsys.readouterr().out
    with psycopg.connect(retention_url) as conn:
        assert conn.execute("select count(*) from kb.kb_rerank_audit").fetchone()[0] == 0
        assert conn.execute("select to_regclass(%s)", [this_part]).fetchone()[0] is None
        assert conn.execute("select tenant_id, seq, row_hash from kb.audit_checkpoints order by seq desc").fetchall() \
            == [(a, 3, last_a), (b, 2, mock_any())]
    # A's chain goes on from its checkpoint (rows 4 and 5: in the default partition now,
    # since this month's was dropped) and verifies; B has no row left
    with psycopg.connect(app_url) as app:
        assert [_row(app, a)["seq"] for _ in range(2)] == [4, 5]
    assert _partition_of(retention_url, a) == ["kb.kb_rerank_audit_default"]
    assert verify_env(retention_url) == 0
    assert "OK: 2 audit rows of 1 tenant(s) verified; 2 MACs verified; 2 signed checkpoint(s)" in capsys.readouterr().out
    # the month's partition again: A's rows move out of the default partition, still verifying
    assert cli.main(["audit", "partitions", "--ahead", "0"]) == 0
    assert _partition_of(retention_url, a) == [this_part]
    assert verify_env(retention_url, "--tenant", str(a)) == 0
    capsys.readouterr()
    # a checkpoint is signed: altered, it is reported (and so is the chain it no longer matches)
    with psycopg.connect(retention_url, autocommit=True) as conn:
        conn.execute("update kb.audit_checkpoints set row_hash = repeat('e', 64) where tenant_id = %s", [a])
        assert verify_env(retention_url) == 1
        out = capsys.readouterr().out
        assert f"FORGED: tenant {a} seq 3: checkpoint forged" in out
        assert f"BROKEN: tenant {a}: first broken seq 4" in out and "prev_hash mismatch" in out
        conn.execute("update kb.audit_checkpoints set row_hash = %s where tenant_id = %s", [last_a, a])
        assert verify_env(retention_url) == 0
        capsys.readouterr()
        # without its checkpoint, the chain starting at 4 is a gap
        conn.execute("delete from kb.audit_checkpoints where tenant_id = %s", [a])
        assert verify_env(retention_url) == 1
        assert f"BROKEN: tenant {a}: first broken seq 4" in capsys.readouterr().out


def mock_any():
    from unittest.mock import ANY

    return ANY


def test_archive_refuses_a_log_that_does_not_verify(retention_url, monkeypatch, capsys):
    import os

    app_url = db.app_url(Settings(database_url=retention_url, app_password=os.environ.get("KB_TEST_APP_PASSWORD")))
    monkeypatch.setenv("KB_DATABASE_URL", retention_url)
    monkeypatch.setenv("KB_AUDIT_KEY", KEY.decode())
    assert cli.main(["audit", "partitions", "--ahead", "0"]) == 0
    t = uuid.uuid4()
    with psycopg.connect(app_url) as app:
        seqs = [_row(app, t)["seq"] for _ in range(2)]
    with psycopg.connect(retention_url, autocommit=True) as conn:
        conn.execute("update kb.kb_rerank_audit set detail = 'altered' where tenant_id = %s and seq = %s", [t, seqs[0]])
    capsys.readouterr()
    assert cli.main(["audit", "archive", "--before", f"{_months_ahead(1):%Y-%m}"]) == 1
    assert "does not verify" in capsys.readouterr().err
    assert _partition_of(retention_url, t) == [f"kb.kb_rerank_audit_{_months_ahead(0):%Y_%m}"]
