"""Sharding readiness: every primary key, unique constraint and unique
index in schema kb leads with tenant_id, so that on a database distributed by tenant
(docs/scaling.md) each of them contains the distribution column and routes to one shard.
Catalog-wide: a table added later without a tenant-leading key fails here."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np
import psycopg
import pytest

from kb_rerank.core.session import tenant_transaction
from tests.helpers import basis, insert_doc

# Tables without a tenant, each with its reason (docs/scaling.md, "Reference tables").
EXCEPTIONS = {
    "embedding_config": "one row for the whole database (the embedding dimension): a reference table",
}
# Tables that name a tenant but are looked up by something else, each with its reason: on a
# database distributed by tenant they are reference tables (copied to every shard).
LOOKED_UP_BY_ANOTHER_KEY = {
    "sql_access": "maps a login role (session_user, unique in the cluster) to its tenant: read by role name",
}

KEYS = """
select c.relname, i.relname as key, a.attname as first_column
from pg_index x
join pg_class c on c.oid = x.indrelid
join pg_class i on i.oid = x.indexrelid
join pg_namespace n on n.oid = c.relnamespace
left join pg_attribute a on a.attrelid = c.oid and a.attnum = x.indkey[0]
where n.nspname = 'kb' and c.relkind in ('r', 'p') and (x.indisunique or x.indisprimary)
order by 1, 2
"""


def test_every_unique_key_in_kb_leads_with_tenant_id(owner_conn):
    rows = owner_conn.execute(KEYS).fetchall()
    tables = {r[0] for r in rows}
    # the check sees the tables it is about (a broken query would pass vacuously)
    assert {"chunks", "documents", "kb_rerank_cache", "kb_rerank_audit", "embedding_config"} <= tables
    offenders = [(t, k, col) for t, k, col in rows
                 if col != "tenant_id" and t not in EXCEPTIONS and t not in LOOKED_UP_BY_ANOTHER_KEY]
    assert offenders == []
    # every exception still exists and is still keyless on tenant_id (else drop it from the list)
    for table in EXCEPTIONS:
        assert table in tables
        cols = owner_conn.execute(
            "select count(*) from pg_attribute where attrelid = ('kb.' || %s)::regclass and attname = 'tenant_id'",
            [table]).fetchone()[0]
        assert cols == 0, f"{table} has a tenant_id: give it a tenant-leading key instead of an exception"


def test_every_tenant_table_has_a_tenant_leading_primary_key(owner_conn):
    rows = owner_conn.execute("""
        select c.relname, a.attname
        from pg_class c
        join pg_namespace n on n.oid = c.relnamespace
        left join pg_index x on x.indrelid = c.oid and x.indisprimary
        left join pg_attribute a on a.attrelid = c.oid and a.attnum = x.indkey[0]
        where n.nspname = 'kb' and c.relkind in ('r', 'p')
          and exists (select from pg_attribute t where t.attrelid = c.oid and t.attname = 'tenant_id')
        order by 1""").fetchall()
    assert len(rows) >= 10
    assert set(LOOKED_UP_BY_ANOTHER_KEY) <= {r[0] for r in rows}  # each such table still names a tenant
    assert [r for r in rows if r[1] != "tenant_id" and r[0] not in LOOKED_UP_BY_ANOTHER_KEY] == []


def test_foreign_keys_still_hold_on_the_new_keys(app_conn):
    """The foreign keys re-created on the tenant-leading primary keys still refuse a chunk
    written into another tenant's document, and deleting a document still deletes its chunks."""
    t1, t2 = uuid.uuid4(), uuid.uuid4()
    doc = insert_doc(app_conn, t1, "d", ["first chunk"], [basis(0)])
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        insert_chunk(app_conn, t2, doc)
    with tenant_transaction(app_conn, t1):
        app_conn.execute("delete from kb.documents where doc_id = %s", [doc])
        assert app_conn.execute("select count(*) from kb.chunks").fetchone()[0] == 0


def insert_chunk(conn, tenant, doc_id) -> None:
    with tenant_transaction(conn, tenant):
        conn.execute(
            "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
            " values (kb.current_tenant(), %s, 1, 'x', %s, %s)",
            [doc_id, hashlib.sha256(b"x").hexdigest(), np.asarray(basis(1), dtype=np.float32)])
