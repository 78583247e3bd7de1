"""What ``kb.current_tenant()`` costs, the function every RLS check calls: the body before the
per-tenant SQL roles (the setting alone) against today's, as the app role and as a per-tenant
SQL reader (``kb-rerank sql-access grant``). Per call (a server-side loop), per statement under
RLS (a count, server side and from the client) and per ``kb.search_lexical`` call; the two
bodies alternate over ``--rounds`` rounds in one run and the minimum of each is reported.

    .venv/bin/python bench/current_tenant_cost.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from importlib import resources
from pathlib import Path

import numpy as np
import psycopg

from kb_rerank.db import database as db
from kb_rerank.db import sql_access
from kb_rerank.core.settings import Settings
from kb_rerank.core.session import configure_connection, tenant_transaction

BEFORE = ("create or replace function kb.current_tenant() returns uuid language sql stable parallel safe"
          " security invoker as $$ select nullif(pg_catalog.current_setting('auth.tenant_id', true), '')"
          "::pg_catalog.uuid $$")


def today() -> str:
    text = resources.files("kb_rerank").joinpath("db/sql/current_tenant.sql").read_text()
    return text[text.index("create or replace function kb.current_tenant()"):text.index("comment on function kb.current_tenant()")]


def server_loop(url: str, tenant, body: str, n: int) -> float:
    """Microseconds a run of ``body`` inside one DO block (no round trips), best of 3."""
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            c.execute(f"do $$ declare x uuid; r record; begin for i in 1..{n} loop {body} end loop; end $$")
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best


def client_loop(url: str, tenant, sql: str, n: int) -> float:
    with psycopg.connect(url, autocommit=True) as c:
        c.prepare_threshold = None
        c.execute("select set_config('auth.tenant_id', %s, false)", [str(tenant)])
        for _ in range(200):
            c.execute(sql).fetchall()
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                c.execute(sql).fetchall()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    base = Settings(data_dir=Path(tempfile.mkdtemp(prefix="kb-ct-")), database_name="postgres")
    server = db.start_embedded(base)
    url = db.replace_url(server, dbname="kb_bench_ct")
    with psycopg.connect(server, autocommit=True) as c:
        c.execute("drop database if exists kb_bench_ct")
        c.execute("create database kb_bench_ct")
    s = Settings(database_url=url)
    db.migrate(s)
    app = db.app_url(s)
    tenant = uuid.uuid4()
    with psycopg.connect(app) as c:
        configure_connection(c)
        with tenant_transaction(c, tenant):
            doc = c.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                            " values (kb.current_tenant(), 'bench', 'bench', repeat('0', 64)) returning doc_id"
                            ).fetchone()[0]
            for i in range(20):
                vec = np.zeros(s.embedding_dim, dtype=np.float32)
                vec[i] = 1.0
                c.execute("insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                          " values (kb.current_tenant(), %s, %s, %s, md5(%s) || md5(%s), %s)",
                          [doc, i, f"zebra alpha {i} invoice refund", str(i), str(i), vec])
    with psycopg.connect(url) as c:
        sql_access.grant(c, tenant, role="kb_bench_reader", app_role=s.app_role)
    reader = db.replace_url(url, user="kb_bench_reader", password="")
    results: dict[str, dict[str, float]] = {}
    try:
        for _ in range(args.rounds):
            for label, body in (("before", BEFORE), ("today", today())):
                with psycopg.connect(url, autocommit=True) as c:
                    c.execute(body)
                for who, u in [("app", app)] + ([("reader", reader)] if label == "today" else []):
                    r = {
                        "call_us": server_loop(u, tenant, "x := kb.current_tenant();", 100_000),
                        "count_server_us": server_loop(u, tenant, "for r in select count(*) from kb.chunks loop end loop;",
                                                       5_000),
                        "search_lexical_server_us": server_loop(
                            u, tenant, "for r in select * from kb.search_lexical('zebra invoice', 5) loop end loop;",
                            1_000),
                        "count_client_us": client_loop(u, tenant, "select count(*) from kb.chunks", 5_000),
                    }
                    key = f"{label} {who}"
                    prev = results.get(key)
                    results[key] = r if prev is None else {k: min(v, prev[k]) for k, v in r.items()}
    finally:
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(today())
        with psycopg.connect(url) as c:
            sql_access.revoke(c, role="kb_bench_reader")
        db.stop_embedded(base)
    print(json.dumps({k: {a: round(b, 2) for a, b in v.items()} for k, v in results.items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
