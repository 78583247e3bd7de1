"""The SQL side tried as an attacker holding the app role (kb_app):
item 1 (temp-schema hijack of SECURITY DEFINER functions), item 3 (forged audit rows),
item 9 (eviction counts of other tenants), item 12 (another tenant's lock).
The catalog tests cover every object of its kind, found in the catalog."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest

from kb_rerank.audit import store as audit
from kb_rerank.cli import main as cli
from kb_rerank.db import layer as sqlfiles
from kb_rerank.db import database as db
from kb_rerank.core.session import tenant_transaction
from kb_rerank.core import session

from tests.helpers import basis, insert_doc

DEFINERS = """
select p.oid::regprocedure::text, p.proconfig, r.rolname, r.rolsuper
from pg_proc p join pg_namespace n on n.oid = p.pronamespace join pg_roles r on r.oid = p.proowner
where n.nspname = 'kb' and p.prosecdef
order by 1
"""
# everything about the functions of schema kb that a hijacked definer could change
PROCS = """
select p.oid::regprocedure::text, pg_get_userbyid(p.proowner), p.prosecdef, p.proconfig, md5(p.prosrc),
       p.proacl::text
from pg_proc p join pg_namespace n on n.oid = p.pronamespace where n.nspname = 'kb' order by 1
"""
KEY = b"k" * 40
OTHER_KEY = b"o" * 40


def _search_path(config) -> list[str]:
    for c in config or []:
        if c.startswith("search_path="):
            return [s.strip().strip('"') for s in c[len("search_path="):].split(",")]
    return []


# --------------------------------------------------------------------------- item 1: catalog


def test_every_definer_pins_search_path_with_pg_temp_last(owner_conn):
    """(a) every prosecdef function in kb, and every kb function that pins a search_path at
    all, ends it with pg_temp and names no schema the app role or PUBLIC can create in."""
    rows = owner_conn.execute(DEFINERS).fetchall()
    assert len(rows) >= 6  # search, statistics, term blocks, audit append, eviction
    creatable = {r[0] for r in owner_conn.execute(
        "select nspname from pg_namespace where has_schema_privilege('kb_app', oid, 'CREATE')"
        " or has_schema_privilege('public', oid, 'CREATE')")}
    for fn, config, _, _ in rows:
        path = _search_path(config)
        assert path, f"{fn} pins no search_path"
        assert path[-1] == "pg_temp", (fn, path)
        assert "public" not in path and "$user" not in path, (fn, path)
        assert not set(path) & creatable, (fn, path, creatable)
    pinned = owner_conn.execute(
        "select p.oid::regprocedure::text, p.proconfig from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
        " where n.nspname = 'kb' and exists (select from unnest(p.proconfig) c where c like 'search_path=%')"
    ).fetchall()
    for fn, config in pinned:
        path = _search_path(config)
        assert path[-1] == "pg_temp" and "public" not in path and not set(path) & creatable, (fn, path)


_DEFINER_HEADER = re.compile(r"^\s*security\s+definer\s*$(?P<rest>.*?)^\s*as\s+\$", re.I | re.M | re.S)
_SEARCH_PATH = re.compile(r"^\s*set\s+search_path\s*=\s*(?P<path>[^\n;]+)$", re.I | re.M)


def test_every_definer_in_every_shipped_sql_file_pins_pg_temp_last():
    """The catalog test sees head only; a versioned file may create definer functions that a
    later revision drops, so every SQL file shipped, versioned or idempotent, is read too:
    each SECURITY DEFINER header pins a search_path ending with pg_temp and without public."""
    from importlib import resources

    schema = resources.files("kb_rerank") / "db" / "schema"
    files = [(f"db/schema/{f.name}", f.read_text(encoding="utf-8")) for f in schema.iterdir() if f.name.endswith(".sql")]
    files += [(rel, f.read_text(encoding="utf-8")) for rel, f in sqlfiles.idempotent_files()]
    headers = 0
    for name, text in files:
        text = re.sub(r"--[^\n]*", "", text)  # comments may name SECURITY DEFINER
        for m in _DEFINER_HEADER.finditer(text):
            headers += 1
            sp = _SEARCH_PATH.search(m.group("rest"))
            assert sp, f"{name}: a SECURITY DEFINER function pins no search_path"
            path = [p.strip().strip('"') for p in sp.group("path").split(",")]
            assert path[-1] == "pg_temp" and "public" not in path, (name, path)
    assert headers >= 8  # search, statistics, lists, audit, generation, eviction


def assert_no_temp_and_no_create(owner_conn, app_role: str = "kb_app") -> None:
    """No TEMP on the database and no CREATE on any schema, for ``app_role`` or PUBLIC
    (tests/db/test_app_role.py runs it for a configured KB_APP_ROLE)."""
    assert owner_conn.execute(
        "select has_database_privilege(%s, current_database(), 'TEMPORARY')", [app_role]).fetchone()[0] is False
    assert owner_conn.execute(
        "select has_database_privilege('public', current_database(), 'TEMPORARY')").fetchone()[0] is False
    assert owner_conn.execute(
        "select array_agg(nspname) from pg_namespace"
        " where has_schema_privilege(%s, oid, 'CREATE')", [app_role]).fetchone()[0] is None
    assert owner_conn.execute(
        "select has_schema_privilege('public', 'public', 'CREATE')").fetchone()[0] is False


def test_app_role_has_no_temp_and_no_create_anywhere(owner_conn):
    """(b) no TEMP on the database and no CREATE on any schema, for the app role or PUBLIC."""
    assert_no_temp_and_no_create(owner_conn)


def test_definer_owners_can_do_only_their_job(owner_conn):
    """(b) every definer owner is a nologin non-superuser that owns functions only (no table,
    type, schema...), is no member of another role (so cannot ALTER another role's
    functions), and is not granted to the app role."""
    rows = owner_conn.execute(DEFINERS).fetchall()
    owners = {r[2] for r in rows}
    assert owners >= {"kb_search", "kb_stats", "kb_audit", "kb_maint"}
    for fn, _, owner, superuser in rows:
        assert not superuser, fn
    for owner in owners:
        role = owner_conn.execute("select rolsuper, rolcanlogin, rolcreaterole, rolcreatedb from pg_roles"
                                  " where rolname = %s", [owner]).fetchone()
        assert role == (False, False, False, False), owner
        kinds = {r[0] for r in owner_conn.execute(
            "select classid::regclass::text from pg_shdepend where deptype = 'o'"
            " and refobjid = %s::regrole and dbid in (0, (select oid from pg_database where datname = current_database()))",
            [owner])}
        assert kinds == {"pg_proc"}, (owner, kinds)
        # every function it owns is a definer of schema kb
        assert owner_conn.execute(
            "select count(*) from pg_proc p join pg_namespace n on n.oid = p.pronamespace"
            " where p.proowner = %s::regrole and not (p.prosecdef and n.nspname = 'kb')", [owner]).fetchone()[0] == 0
        assert owner_conn.execute("select count(*) from pg_auth_members where member = %s::regrole",
                                  [owner]).fetchone()[0] == 0, owner
        assert not owner_conn.execute("select pg_has_role('kb_app', %s, 'USAGE')", [owner]).fetchone()[0]
    # the search role only reads; statistics are written by kb_stats alone
    stats_tables = ("kb.term_stats", "kb.corpus_stats", "kb.term_language_stats", "kb.corpus_language_stats",
                    "kb.term_blocks")
    for table in (*stats_tables, "kb.chunks", "kb.documents"):
        for priv in ("INSERT", "UPDATE", "DELETE", "TRUNCATE"):
            assert not owner_conn.execute("select has_table_privilege('kb_search', %s, %s)",
                                          [table, priv]).fetchone()[0], (table, priv)
    writable = {(t, p) for t in stats_tables
                for p in ("INSERT", "UPDATE", "DELETE")}
    stats_writes = {(r[0], r[1]) for r in owner_conn.execute(
        "select c.oid::regclass::text, p.priv from pg_class c join pg_namespace n on n.oid = c.relnamespace"
        " cross join unnest(array['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) as p(priv)"
        " where n.nspname = 'kb' and c.relkind = 'r' and has_table_privilege('kb_stats', c.oid, p.priv)")}
    assert stats_writes == writable


# --------------------------------------------------------------------------- item 1: the attack


@pytest.fixture
def two_tenants(app_conn):
    """Tenant A (the victim) and B (the attacker's own), each with text, statistics, term
    blocks, cache rows and audit rows."""
    a, b = uuid.uuid4(), uuid.uuid4()
    secret = f"alphasecret{uuid.uuid4().hex[:8]}"
    insert_doc(app_conn, a, "victim", [f"{secret} alpha zebra"], [basis(5)])
    insert_doc(app_conn, b, "attacker", ["beta alpha zebra"], [basis(5)])
    for t in (a, b):
        with tenant_transaction(app_conn, t):
            app_conn.execute("select kb.refresh_term_blocks(4, 1)")
            session.run(app_conn, audit.append_row, audit.AuditRecord(kind="served", source="lexical_only",
                                                          query_hash="c" * 64, trace_id="t"), key=audit.AuditKey(KEY))
            app_conn.execute("insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb,"
                             " expires_at) values (gen_random_uuid(), kb.current_tenant(), repeat('b', 64),"
                             " 'lexical_only', '[]', now() - interval '1 hour')")
    return a, b, secret


EVIL = """
create function pg_temp.evil(x pg_catalog.uuid) returns boolean language plpgsql as $f$
declare r record;
begin
  raise notice 'RAN_AS %', current_user;
  for r in select c.content from kb.chunks c loop
    raise notice 'LEAK %', r.content;
  end loop;
  begin
    execute 'alter function kb.search_semantic(public.vector, integer, jsonb) reset all';
    raise notice 'ALTERED';
  exception when others then null;
  end;
  return true;
end
$f$
"""
EVIL_TEXT = """
create function pg_temp.evil_text(x pg_catalog.text) returns boolean language sql as
$f$ select pg_temp.evil(null::pg_catalog.uuid) $f$
"""


def _calls(b):
    """Every definer function the app role can reach, with and without a tenant."""
    vec = "(select array_fill(0.1::real, array[dim])::public.vector from kb.embedding_config)"
    tenant_b = f"select set_config('auth.tenant_id', '{b}', false)"
    mac_args = f"'{'a' * 64}', '{'b' * 32}', '{'c' * 16}'"
    return [
        "select kb.refresh_term_blocks()",
        "select * from kb.search_lexical('alpha', 5)",
        f"select * from kb.search_semantic({vec}, 5)",
        f"select * from kb.search_hybrid('alpha zebra', {vec}, 5)",
        "select kb.evict_expired_cache()",
        "select kb.apply_stats_delta(array[]::kb.chunks[], 1)",
        f"select kb.audit_append('served', 0::smallint, 'lexical_only', repeat('e', 64), 'x', null, 0, 0, null, null,"
        f" {mac_args})",
        tenant_b,  # then the same as tenant B, including the triggers of a chunk write
        "select kb.refresh_term_blocks(4, 1)",
        "select * from kb.search_lexical('alpha', 5)",
        f"select * from kb.search_semantic({vec}, 5)",
        f"select kb.audit_append('served', 0::smallint, 'lexical_only', repeat('e', 64), 'x', null, 0, 0, null, null,"
        f" {mac_args})",
        "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
        f" select kb.current_tenant(), d.doc_id, 7, 'alpha alpha zebra', repeat('0', 64), {vec}"
        " from kb.documents d limit 1",
        "update kb.chunks set content = 'alpha zebra zebra' where position = 7",
        # a review of that chunk's text: the review triggers (invoker) update the chunk
        "insert into kb.guard_reviews (tenant_id, content_hash, decision) values (kb.current_tenant(),"
        " repeat('0', 64), 'block')",
        "update kb.guard_reviews set decision = 'allow'",
        "delete from kb.chunks where position = 7",
        "select kb.evict_expired_cache()",
    ]


def _attack(app_url, b):
    """Run the privilege-escalation payload as kb_app; return (payload created?, notices,
    errors by statement)."""
    notices: list[str] = []
    errors: dict[str, str] = {}
    with psycopg.connect(app_url, autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        try:
            conn.execute(EVIL)
            conn.execute(EVIL_TEXT)
            conn.execute("create domain pg_temp.uuid as pg_catalog.uuid check (pg_temp.evil(value))")
            conn.execute("create domain pg_temp.text as pg_catalog.text check (pg_temp.evil_text(value))")
            conn.execute("create table pg_temp.chunks (content pg_catalog.text)")
        except psycopg.errors.InsufficientPrivilege as exc:
            errors["payload"] = str(exc)
            created = False
        else:
            created = True
        for stmt in _calls(b):
            try:
                conn.execute(stmt)
            except psycopg.Error as exc:
                errors[stmt] = type(exc).__name__
    return created, notices, errors


def _assert_nothing_leaked(notices, secret):
    ran_as = {n.split(" ", 1)[1] for n in notices if n.startswith("RAN_AS ")}
    assert ran_as <= {"kb_app"}, f"the payload ran as {ran_as}"
    assert not [n for n in notices if secret in n], "another tenant's chunk text leaked"
    assert "ALTERED" not in notices


def test_temp_schema_attack_is_refused(app_url, owner_conn, two_tenants):
    """As shipped: the app role cannot create the payload at all (no TEMP), and no definer
    function leaks or changes."""
    a, b, secret = two_tenants
    before = owner_conn.execute(PROCS).fetchall()
    created, notices, errors = _attack(app_url, b)
    assert not created and "permission denied" in errors["payload"]
    _assert_nothing_leaked(notices, secret)
    assert owner_conn.execute(PROCS).fetchall() == before


def test_temp_schema_attack_with_temp_granted_back(app_url, owner_conn, two_tenants):
    """Defence in depth: even if TEMP is granted back to the app role (a DBA's mistake),
    pg_temp is searched last inside every pinned function, so the shadowing types and table
    are never used: the payload runs only as kb_app, sees no row of tenant A, and no
    function's owner, settings, body or grants change."""
    a, b, secret = two_tenants
    dbname = owner_conn.info.dbname
    before = owner_conn.execute(PROCS).fetchall()
    owner_conn.execute(f'grant temporary on database "{dbname}" to kb_app')
    try:
        created, notices, errors = _attack(app_url, b)
    finally:
        owner_conn.execute(f'revoke temporary on database "{dbname}" from kb_app')
    assert created, errors
    _assert_nothing_leaked(notices, secret)
    assert owner_conn.execute(PROCS).fetchall() == before
    # the calls did run (the attack is not vacuous): the searches answered as B
    assert "select * from kb.search_lexical('alpha', 5)" not in errors
    assert "select kb.refresh_term_blocks(4, 1)" not in errors
    # the chunk write's triggers ran with the domain in place
    assert not [s for s in errors if s.startswith(("insert into kb.chunks", "update kb.chunks", "delete",
                                                   "insert into kb.guard_reviews", "update kb.guard_reviews"))], errors


# --------------------------------------------------------------------------- item 3: audit


def _row(app_conn, tenant, key=KEY, **fields):
    rec = audit.AuditRecord(**{"kind": "served", "source": "lexical_only", "query_hash": "a" * 64,
                               "trace_id": uuid.uuid4().hex, "model": "m", "duration_ms": 12.345, **fields})
    with tenant_transaction(app_conn, tenant):
        return session.run(app_conn, audit.append_row, rec, key=audit.AuditKey(key))


def test_app_cannot_insert_audit_rows_or_hash_them(app_conn, tenant):
    _row(app_conn, tenant)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, tenant):
            app_conn.execute(
                "insert into kb.kb_rerank_audit (tenant_id, seq, kind, severity, source, query_hash, trace_id,"
                " created_at, prev_hash, row_hash) values (kb.current_tenant(), 2, 'served', 0, 'lexical_only',"
                " repeat('a', 64), 'x', now() - interval '1 year', repeat('0', 64), repeat('0', 64))")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with tenant_transaction(app_conn, tenant):
            app_conn.execute("select kb.audit_row_hash(a) from kb.kb_rerank_audit a")
    for priv in ("INSERT", "UPDATE", "DELETE", "TRUNCATE"):
        assert not app_conn.execute("select has_table_privilege('kb.kb_rerank_audit', %s)", [priv]).fetchone()[0]
    assert not app_conn.execute("select has_table_privilege('kb.audit_heads', 'SELECT')").fetchone()[0]


def test_no_back_dating(app_conn, owner_conn, tenant):
    """kb.audit_append takes no created_at: the row gets the database clock."""
    args = owner_conn.execute(
        "select proargnames from pg_proc where proname = 'audit_append'"
        " and pronamespace = 'kb'::regnamespace").fetchall()
    assert len(args) == 1 and "created_at" not in args[0][0]
    t0 = owner_conn.execute("select clock_timestamp()").fetchone()[0]
    row = _row(app_conn, tenant)
    t1 = owner_conn.execute("select clock_timestamp()").fetchone()[0]
    assert t0 <= row["created_at"] <= t1
    with pytest.raises(psycopg.Error):
        with tenant_transaction(app_conn, tenant):
            app_conn.execute("select kb.audit_append(kind => 'served', severity => 0::smallint, source => 'lexical_only',"
                             " query_hash => repeat('a', 64), trace_id => 'x', created_at => now() - interval '1 year')")


def test_made_up_mac_is_reported_forged_and_later_rows_still_verify(app_conn, tenant, monkeypatch, owner_url, capsys):
    good1 = _row(app_conn, tenant)
    # the app role, without the key, appends a row with a MAC of its own making
    with tenant_transaction(app_conn, tenant):
        forged = app_conn.execute(
            "select seq from kb.audit_append('served', 0::smallint, 'lexical_only', repeat('a', 64), 'forged',"
            " 'm', 1, 1, 1.0, null, %s, %s, %s)",
            ["f" * 64, "0" * 32, audit.AuditKey(KEY).key_id]).fetchone()[0]
    good2 = _row(app_conn, tenant)
    # a row MAC'd with a key the verifier does not hold
    _row(app_conn, tenant, key=OTHER_KEY)
    with psycopg.connect(owner_url) as conn:
        report = session.run(conn, audit.verify_macs, [KEY], tenant_id=tenant)
        assert [r.ok for r in session.run(conn, audit.verify) if r.tenant_id == tenant] == [True]  # the SQL chain is intact
    assert [(p.seq, p.reason) for p in report.problems] == [
        (forged, "forged"), (good2["seq"] + 1, f"unknown key {audit.AuditKey(OTHER_KEY).key_id}")]
    assert report.checked == 4 and good1["seq"] == 1 and good2["seq"] == 3
    # after a rotation, the old key verifies its rows: only the forged one is left
    with psycopg.connect(owner_url) as conn:
        report = session.run(conn, audit.verify_macs, [OTHER_KEY, KEY], tenant_id=tenant)
    assert [(p.seq, p.reason) for p in report.problems] == [(forged, "forged")]
    # the command: exit 1, naming the tenant and seq
    monkeypatch.setenv("KB_DATABASE_URL", owner_url)
    monkeypatch.setenv("KB_AUDIT_KEY", OTHER_KEY.decode())
    monkeypatch.setenv("KB_AUDIT_OLD_KEYS", KEY.decode())
    assert cli.main(["audit", "verify", "--tenant", str(tenant)]) == 1
    out = capsys.readouterr().out
    assert f"FORGED: tenant {tenant} seq {forged}: forged" in out and "BROKEN" not in out


def test_verify_command_accepts_a_clean_chain(app_conn, tenant, monkeypatch, owner_url, capsys):
    for _ in range(3):
        _row(app_conn, tenant)
    monkeypatch.setenv("KB_DATABASE_URL", owner_url)
    monkeypatch.setenv("KB_AUDIT_KEY", KEY.decode())
    monkeypatch.delenv("KB_AUDIT_OLD_KEYS", raising=False)
    assert cli.main(["audit", "verify", "--tenant", str(tenant)]) == 0
    assert "3 MACs verified" in capsys.readouterr().out


def test_replayed_row_is_refused(app_conn, tenant, owner_url):
    real = _row(app_conn, tenant)
    with pytest.raises(psycopg.errors.UniqueViolation):
        with tenant_transaction(app_conn, tenant):
            app_conn.execute(
                "select kb.audit_append(kind, severity, source, query_hash, trace_id, model, candidate_count,"
                " returned_count, duration_ms, detail, mac, nonce, key_id)"
                " from kb.kb_rerank_audit where seq = %s", [real["seq"]])
    # the same row replayed into another tenant's chain is stored (its own chain) but never
    # verifies: the tenant is inside the MAC
    other = uuid.uuid4()
    with tenant_transaction(app_conn, other):
        moved = app_conn.execute(
            "select seq from kb.audit_append(%s, %s::smallint, %s, %s, %s, %s, %s, %s, %s::real, %s, %s, %s, %s)",
            [real[k] for k in ("kind", "severity", "source", "query_hash", "trace_id", "model", "candidate_count",
                               "returned_count", "duration_ms", "detail", "mac", "nonce", "key_id")]).fetchone()[0]
    with psycopg.connect(owner_url) as conn:
        assert session.run(conn, audit.verify_macs, [KEY], tenant_id=tenant).ok
        assert [(p.seq, p.reason) for p in session.run(conn, audit.verify_macs, [KEY], tenant_id=other).problems] == [
            (moved, "forged")]


def test_mac_covers_every_field_and_the_tenant(tenant):
    base = [tenant, "0" * 32, "served", 0, "lexical_only", "a" * 64, "t", "m", 1, 2, 12.345, None]
    ref = audit.canonical(*base)
    for i in range(len(base)):
        changed = list(base)
        changed[i] = uuid.uuid4() if i == 0 else ("x" if isinstance(base[i], str) or base[i] is None else 99)
        assert audit.canonical(*changed) != ref, i
    # the double the service sends and the float4 read back give the same form
    assert audit.canonical(*base[:10], 12.345000267028809, None) == ref


# --------------------------------------------------------------------------- item 12: locks


def test_app_cannot_stall_another_tenants_audit_or_lists(app_url, app_conn, two_tenants):
    """The app role holds, for tenant B, every lock key the old code used (advisory keys it
    could compute) and tries to lock B's audit head; B's audit append, list refresh and chunk
    write still go through at once."""
    a, b, _ = two_tenants
    with psycopg.connect(app_url, autocommit=True) as holder:
        holder.execute("select pg_advisory_lock(hashtextextended('kb.kb_rerank_audit:' || %s, 0))", [str(b)])
        holder.execute("select pg_advisory_lock(hashtextextended('kb.term_tops:' || %s, 0))", [str(b)])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            holder.execute("select 1 from kb.audit_heads where tenant_id = %s for update", [b])
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            holder.execute("select 1 from kb.corpus_stats for update")
        for table in ("kb.audit_heads", "kb.kb_rerank_audit", "kb.corpus_stats"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                with holder.transaction():
                    holder.execute(f"lock table {table} in share row exclusive mode")
        app_conn.execute("set lock_timeout = '2s'")
        app_conn.execute("set statement_timeout = '5s'")
        row = _row(app_conn, b)
        assert row["tenant_id"] == b
        with tenant_transaction(app_conn, b):
            assert app_conn.execute("select kb.refresh_term_blocks(4, 1)").fetchone()[0] > 0
        insert_doc(app_conn, b, "more", ["alpha zebra again"], [basis(6)])


# --------------------------------------------------------------------------- item 9: eviction


def test_app_cannot_evict_or_count_other_tenants_rows(app_conn, owner_url, two_tenants, monkeypatch, capsys):
    a, b, _ = two_tenants
    for setting in (None, str(b)):
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with app_conn.transaction():
                if setting:
                    app_conn.execute("select set_config('auth.tenant_id', %s, true)", [setting])
                app_conn.execute("select kb.evict_expired_cache()")
    # the maintenance side (the owner URL here) evicts every tenant's expired rows
    monkeypatch.setenv("KB_DATABASE_URL", owner_url)
    monkeypatch.delenv("KB_MAINT_DATABASE_URL", raising=False)
    assert cli.main(["evict", "--batch", "1"]) == 0
    assert int(capsys.readouterr().out.split()[1]) >= 2  # "evicted N expired cache rows"
    with psycopg.connect(owner_url) as conn:
        assert conn.execute("select count(*) from kb.kb_rerank_cache where expires_at <= now()"
                            " and tenant_id = any(%s)", [[a, b]]).fetchone()[0] == 0


def test_eviction_loop_uses_the_maintenance_url_only():
    from kb_rerank.app import _maint_url
    from kb_rerank.core.settings import Settings

    assert _maint_url(Settings(database_url="postgresql://o@h/d", maint_database_url="postgresql://m@h/d")) \
        == "postgresql://m@h/d"
    # a configured server without a maintenance URL: no eviction from the app
    assert _maint_url(Settings(database_url="postgresql://o@h/d")) is None
    assert _maint_url(Settings(app_database_url="postgresql://kb_app@h/d")) is None


def test_eviction_loop_evicts_through_the_maintenance_url(owner_url, app_conn, tenant):
    """The app's periodic loop connects with the maintenance URL (not the app pool) and evicts."""
    import asyncio
    from types import SimpleNamespace

    from kb_rerank.app import _evict_loop
    from kb_rerank.core.settings import Settings

    with tenant_transaction(app_conn, tenant):
        app_conn.execute("insert into kb.kb_rerank_cache (cache_id, tenant_id, query_hash, source, results_jsonb,"
                         " expires_at) values (gen_random_uuid(), kb.current_tenant(), repeat('e', 64),"
                         " 'lexical_only', '[]', now() - interval '1 minute')")
    counted: list[int] = []
    state = SimpleNamespace(settings=Settings(evict_interval_s=1), db_timeout_s=5.0,
                            metrics=SimpleNamespace(evicted=SimpleNamespace(inc=counted.append)))

    async def run():
        task = asyncio.create_task(_evict_loop(SimpleNamespace(state=state), owner_url))
        for _ in range(100):
            await asyncio.sleep(0.1)
            if counted:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert counted and counted[0] >= 1
    with tenant_transaction(app_conn, tenant):
        assert app_conn.execute("select count(*) from kb.kb_rerank_cache").fetchone()[0] == 0
