"""The default app role is kb_app; it was cyberos_app. A database created with the former
default, then `migrate`d by this code with KB_APP_ROLE unset, keeps working: its role is
renamed kb_app (grants, password and rows as they were; the service's derived URL connects).
Roles are cluster-wide, so when cyberos_app also serves another database of the cluster the
rename is refused, changing nothing, and KB_APP_ROLE=cyberos_app keeps the role.

On a cluster of its own (an embedded server in a temporary folder): renaming a role of the
session's shared server would pull it from under the other tests."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

import psycopg
import pytest

from kb_rerank.core.session import tenant_transaction
from kb_rerank.core.settings import DEFAULT_APP_ROLE, Settings
from kb_rerank.db import database as db
from kb_rerank.db import layer

FORMER = "cyberos_app"


def _dbname(url: str) -> str:
    return psycopg.conninfo.conninfo_to_dict(url)["dbname"]


@pytest.fixture(scope="module")
def cluster():
    """Owner URL (database postgres) of a fresh embedded server of this module's own."""
    data = Path(tempfile.mkdtemp(prefix="kbrole-", dir="/tmp"))
    s = Settings(data_dir=data, database_name="postgres")
    try:
        yield db.start_embedded(s)
    finally:
        db.stop_embedded(s)
        shutil.rmtree(data, ignore_errors=True)


def _database_as_the_former_default_left_it(cluster: str, password: str) -> Settings:
    """A database migrated to head with the former default role, holding one tenant's document
    written through that role; returns its settings with KB_APP_ROLE unset (the new default)."""
    name = f"kb_old_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(cluster, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    url = db.replace_url(cluster, dbname=name)
    db.migrate(Settings(database_url=url, app_role=FORMER, app_password=password))
    return Settings(database_url=url, app_password=password)


def _roles(url: str) -> dict[str, bool]:
    """{role: may connect here} for the former and the new default."""
    with psycopg.connect(url) as conn:
        return {r: conn.execute("select to_regrole(%s) is not null and has_database_privilege(%s,"
                                " current_database(), 'CONNECT')", [r, r]).fetchone()[0]
                for r in (FORMER, DEFAULT_APP_ROLE) if conn.execute("select to_regrole(%s)", [r]).fetchone()[0]}


def _write_document(settings: Settings, role: str, tenant: uuid.UUID) -> None:
    with psycopg.connect(db.replace_url(settings.database_url, user=role, password=settings.app_password)) as conn:
        with tenant_transaction(conn, tenant):
            conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                         " values (%s, 'a.md', 'A', repeat('0', 64))", [tenant])


def test_a_database_of_the_former_default_keeps_working_after_migrate(cluster):
    assert DEFAULT_APP_ROLE == "kb_app" and Settings().app_role == DEFAULT_APP_ROLE
    password = f"pw-{uuid.uuid4().hex[:8]}"
    one = _database_as_the_former_default_left_it(cluster, password)
    two = _database_as_the_former_default_left_it(cluster, password)
    tenant = uuid.uuid4()
    _write_document(one, FORMER, tenant)
    assert _roles(one.database_url) == {FORMER: True}

    # cyberos_app serves two databases: renaming it would cut the other off. Refused, nothing changes.
    with psycopg.connect(one.database_url) as conn:
        before = conn.execute("select kb.schema_layer_version()").fetchone()[0]
    with pytest.raises(RuntimeError, match=f"which also serves {_dbname(two.database_url)}"
                                           f".*set KB_APP_ROLE={FORMER} to keep it"):
        db.migrate(one)
    assert _roles(one.database_url) == {FORMER: True}
    with psycopg.connect(one.database_url) as conn:
        assert conn.execute("select kb.schema_layer_version()").fetchone()[0] == before
    # the way out the message names: the former role kept, as configured
    kept = one.with_(app_role=FORMER)
    db.migrate(kept)
    with psycopg.connect(db.app_url(kept)) as conn, tenant_transaction(conn, tenant):
        assert conn.execute("select current_user, count(*) from kb.documents group by 1").fetchone() == (FORMER, 1)

    # once cyberos_app serves this database only, migrate with the new default renames it
    with psycopg.connect(cluster, autocommit=True) as conn:
        conn.execute(f'drop database "{_dbname(two.database_url)}" with (force)')
    db.migrate(one)
    assert _roles(one.database_url) == {DEFAULT_APP_ROLE: True, FORMER: False}
    with psycopg.connect(one.database_url) as conn:
        # the former name is a role again (the frozen down files name it), without login or privileges
        assert conn.execute("select rolcanlogin from pg_roles where rolname = %s", [FORMER]).fetchone() == (False,)
        assert conn.execute("select kb.schema_layer_version()").fetchone()[0] == layer.layer_version(
            embedding_dim=one.embedding_dim, app_role=DEFAULT_APP_ROLE)
        attrs = conn.execute("select rolsuper, rolbypassrls, rolcreaterole, rolcanlogin from pg_roles"
                             " where rolname = %s", [DEFAULT_APP_ROLE]).fetchone()
    assert attrs == (False, False, False, True)
    # the service's derived URL (KB_APP_ROLE unset) connects, with the same password, and reads
    # the tenant's rows under RLS; another tenant sees none
    with psycopg.connect(db.app_url(one)) as conn:
        with tenant_transaction(conn, tenant):
            assert conn.execute("select current_user, count(*) from kb.documents group by 1").fetchone() == (
                DEFAULT_APP_ROLE, 1)
        with tenant_transaction(conn, uuid.uuid4()):
            assert conn.execute("select count(*) from kb.documents").fetchone()[0] == 0
    # a second migrate changes nothing
    db.migrate(one)
    assert _roles(one.database_url) == {DEFAULT_APP_ROLE: True, FORMER: False}
    # nothing of the layer is granted to the former name
    with psycopg.connect(one.database_url) as conn:
        assert conn.execute("select has_table_privilege(%s, 'kb.kb_rerank_audit', 'SELECT')",
                            [DEFAULT_APP_ROLE]).fetchone()[0]
        assert conn.execute("select count(*) from pg_proc p, aclexplode(p.proacl) a"
                            " where a.grantee = %s::regrole", [FORMER]).fetchone()[0] == 0
    db.migrate(one)
    assert _roles(one.database_url) == {DEFAULT_APP_ROLE: True, FORMER: False}


def test_a_fresh_database_gets_kb_app_and_the_former_default_nothing(cluster):
    name = f"kb_new_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(cluster, autocommit=True) as conn:
        conn.execute(f'create database "{name}"')
    s = Settings(database_url=db.replace_url(cluster, dbname=name))
    db.migrate(s)
    roles = _roles(s.database_url)
    assert roles[DEFAULT_APP_ROLE] is True and roles.get(FORMER, False) is False


def test_a_role_named_like_the_new_default_elsewhere_is_refused(cluster):
    """kb_app exists (the fresh database above, or any other) and a database still served by
    cyberos_app alone: no rename (the name is taken), a message naming the way out."""
    with psycopg.connect(cluster, autocommit=True) as conn:
        if conn.execute("select to_regrole(%s)", [DEFAULT_APP_ROLE]).fetchone()[0] is None:
            conn.execute(f"create role {DEFAULT_APP_ROLE} login")
    old = _database_as_the_former_default_left_it(cluster, "pw")
    with pytest.raises(RuntimeError, match=f"a role {DEFAULT_APP_ROLE} exists already.*KB_APP_ROLE={FORMER}"):
        db.migrate(old)
    assert _roles(old.database_url)[FORMER] is True


def test_offline_sql_carries_the_adoption_step_only_for_the_default_role():
    assert layer.adopt_steps(DEFAULT_APP_ROLE) == [layer.ADOPT_APP_ROLE]
    assert layer.adopt_steps("kb_one_app") == []
    text = layer.render(layer.package_dir().joinpath(*layer.ADOPT_APP_ROLE.split("/")), embedding_dim=384)
    assert f"to_regrole('\"{DEFAULT_APP_ROLE}\"')" in text and "{{" not in text
