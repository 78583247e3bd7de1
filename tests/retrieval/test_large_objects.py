"""Server-side large objects, tried as the app role: lo_from_bytea, lo_create, lowrite...
write into pg_largeobject, which no RLS policy binds and nothing cleans. The layer revokes
EXECUTE on every large-object function of pg_catalog from PUBLIC (db/sql/grants.sql);
the catalog test covers every such function found in the catalog."""

from __future__ import annotations

import psycopg
import pytest

from kb_rerank.db import layer as sqlfiles

# every server-side large-object function of pg_catalog: lo_* and the two without the underscore
LO_FUNCTIONS = """
select p.oid::regprocedure::text from pg_proc p
where p.pronamespace = 'pg_catalog'::regnamespace and (p.proname like 'lo\\_%%' or p.proname in ('loread', 'lowrite'))
order by 1
"""


def _executable(owner_conn, role: str) -> list[str]:
    return [r[0] for r in owner_conn.execute(
        "select p.oid::regprocedure::text from pg_proc p where p.pronamespace = 'pg_catalog'::regnamespace"
        " and (p.proname like 'lo\\_%%' or p.proname in ('loread', 'lowrite'))"
        " and has_function_privilege(%s, p.oid, 'EXECUTE') order by 1", [role])]


def test_no_large_object_function_is_executable_by_the_app_role_or_public(owner_conn):
    names = [r[0] for r in owner_conn.execute(LO_FUNCTIONS)]
    # not vacuous: the functions the review named are there
    for fn in ("lo_from_bytea(oid,bytea)", "lo_create(oid)", "lo_creat(integer)", "lo_import(text)",
               "lo_put(oid,bigint,bytea)", "lo_open(oid,integer)", "lowrite(integer,bytea)"):
        assert fn in names, (fn, names)
    for role in ("kb_app", "public", "kb_sql_reader"):
        assert _executable(owner_conn, role) == [], role


def test_app_role_cannot_create_large_objects(app_url, owner_conn):
    before = owner_conn.execute("select count(*) from pg_largeobject_metadata").fetchone()[0]
    attempts = ["select lo_from_bytea(0, 'x')", "select lo_create(0)", "select lo_creat(-1)",
                "select lo_import('/etc/hostname')", "select lo_put(1, 0, 'x')", "select lo_unlink(1)",
                "select lo_get(1)"]
    with psycopg.connect(app_url, autocommit=True) as conn:
        for stmt in attempts:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(stmt)
    assert owner_conn.execute("select count(*) from pg_largeobject_metadata").fetchone()[0] == before


def test_the_revoke_is_reapplied_with_the_layer(owner_conn, settings):
    """A grant put back by hand (or a function a server upgrade adds) is revoked again by the
    next `kb-rerank migrate` (the layer is re-applied)."""
    owner_conn.execute("grant execute on function lo_from_bytea(oid, bytea) to public")
    assert _executable(owner_conn, "kb_app") == ["lo_from_bytea(oid,bytea)"]
    with owner_conn.transaction():
        sqlfiles.apply_idempotent(owner_conn, embedding_dim=settings.embedding_dim, app_role=settings.app_role)
    assert _executable(owner_conn, "kb_app") == []
