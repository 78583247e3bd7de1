"""The audit log's administration, as the owner (``kb-rerank audit verify|partitions|archive``):
what a role may read of it, its month partitions, and archiving old months behind a signed
chain checkpoint per tenant (kb.audit_checkpoints). Appends and verification are
:mod:`.audit`.
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple
from uuid import UUID

# What `audit verify` needs, read from the catalog before it verifies anything: a role that
# lacks it would otherwise see no rows (RLS, forced on the audit log, binds the table owner
# too) or fail half-way, and an empty result must never read as "OK".
ACCESS = """
select current_user::text, r.rolsuper, r.rolbypassrls,
       to_regclass('kb.kb_rerank_audit') is not null,
       case when to_regclass('kb.kb_rerank_audit') is not null
            then has_table_privilege('kb.kb_rerank_audit', 'SELECT') end,
       case when to_regprocedure('kb.audit_verify()') is not null
            then has_function_privilege('kb.audit_verify()', 'EXECUTE') end,
       case when to_regprocedure('kb.audit_row_hash(kb.kb_rerank_audit)') is not null
            then has_function_privilege('kb.audit_row_hash(kb.kb_rerank_audit)', 'EXECUTE') end,
       case when to_regclass('kb.audit_checkpoints') is not null
            then has_table_privilege('kb.audit_checkpoints', 'SELECT') end
from pg_catalog.pg_roles r where r.rolname = current_user
"""

# the month partitions of the audit log, oldest first: (name, first day of its month)
MONTHS = """
select c.relname, to_date(substr(c.relname, length('kb_rerank_audit_') + 1), 'YYYY_MM')
from pg_catalog.pg_inherits i join pg_catalog.pg_class c on c.oid = i.inhrelid
where i.inhparent = 'kb.kb_rerank_audit'::regclass and c.relname ~ '^kb_rerank_audit_[0-9]{4}_[0-9]{2}$'
order by 2
"""


class Access(NamedTuple):
    user: str
    superuser: bool
    bypassrls: bool
    exists: bool
    can_select: bool | None
    can_verify: bool | None
    can_hash: bool | None
    can_checkpoints: bool | None


async def access(conn) -> Access:
    """The current role's access to the audit log (None: the object does not exist)."""
    return Access(*await (await conn.execute(ACCESS)).fetchone())


async def add_month(conn, first_day: dt.date) -> str | None:
    """Create the partition of the month starting ``first_day`` (kb.audit_add_month); its
    name, or None when it existed."""
    return (await (await conn.execute("select kb.audit_add_month(%s)", [first_day])).fetchone())[0]


async def months(conn) -> list[tuple[str, dt.date]]:
    """The log's month partitions, oldest first: (table name in kb, first day of its month)."""
    return [(name, m) for name, m in await (await conn.execute(MONTHS)).fetchall()]


async def lock(conn) -> None:
    """Lock the log for the rest of the transaction: appends wait, reads go on."""
    await conn.execute("lock table kb.kb_rerank_audit in exclusive mode")


# Partition names come from :func:`months` (the catalog, matched against the pattern of
# MONTHS), never from input: they are safe to put into SQL as written.
async def last_seqs(conn, partitions: list[str]) -> list[tuple[UUID, int]]:
    """Per tenant with rows in ``partitions``: (tenant_id, its last seq there)."""
    dropped = " union all ".join(f"select tenant_id, seq, row_hash from kb.{n}" for n in partitions)
    return await (await conn.execute(f"select d.tenant_id, max(d.seq) from ({dropped}) d group by d.tenant_id")).fetchall()


async def first_kept_seq(conn, tenant_id: UUID, partitions: list[str]) -> int | None:
    """The tenant's first seq outside ``partitions`` (None: no row stays)."""
    cur = await conn.execute("select min(seq) from kb.kb_rerank_audit where tenant_id = %s and"
                             " not (tableoid::regclass::text = any(%s))",
                             [tenant_id, [f"kb.{n}" for n in partitions]])
    return (await cur.fetchone())[0]


async def row_hash(conn, tenant_id: UUID, seq: int) -> str:
    """The row_hash of the tenant's row ``seq``."""
    cur = await conn.execute("select row_hash from kb.kb_rerank_audit where tenant_id = %s and seq = %s",
                             [tenant_id, seq])
    return (await cur.fetchone())[0]


async def write_checkpoint(conn, tenant_id: UUID, seq: int, row_hash: str, archived_before: dt.date, mac: str,
                     key_id: str) -> None:
    """Record a signed chain checkpoint (kept when one exists for the tenant and seq)."""
    await conn.execute(
        "insert into kb.audit_checkpoints (tenant_id, seq, row_hash, archived_before, mac, key_id)"
        " values (%s, %s, %s, %s, %s, %s) on conflict (tenant_id, seq) do nothing",
        [tenant_id, seq, row_hash, archived_before, mac, key_id])


async def drop_partition(conn, partition: str) -> None:
    await conn.execute(f'drop table kb."{partition}"')
