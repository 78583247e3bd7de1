"""kb.retrieve_hybrid with the fusion in kb.hybrid_fusion against the version that wrote the
fusion inline, interleaved A/B in one run.

Loads one tenant of synthetic chunks (random words, random unit vectors) into a database of
the embedded server, installs the inline version (git show BASE:.../13_retrieve_hybrid.sql)
beside today's as kb.retrieve_hybrid_inline, then calls both alternately query by query (the
order flipped every other query), each call its own transaction, as the service does (60 deep,
convex, 40 rows). Reports p50 per side and the p50 of the per-query ratio new / inline.

    python bench/hybrid_fusion_ab.py --chunks 10000 --queries 200
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core import session  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402

BASE = "851a129"
TENANT = uuid.UUID(int=43)
WORDS = [f"w{i:04d}" for i in range(5000)]
ZIPF = [1.0 / (i + 1) for i in range(len(WORDS))]  # word frequencies as in text
CALL = ("select count(*) from kb.{fn}(%s, %s::vector, 60, 10, 'convex', 0.7, 0.3, 1.2, 0.75, 40,"
        " null, null, null)")


def load(owner: str, chunks: int, dim: int) -> None:
    rng = np.random.default_rng(43)
    words = random.Random(43)
    with psycopg.connect(owner) as conn:
        conn.execute("select set_config('auth.tenant_id', %s, false)", [str(TENANT)])
        if conn.execute("select count(*) from kb.chunks").fetchone()[0] >= chunks:
            return
        for d in range(chunks // 10):
            if d * 10 < conn.execute("select count(*) from kb.chunks").fetchone()[0]:
                continue
            doc = conn.execute("insert into kb.documents (tenant_id, source_uri, title, content_hash)"
                               " values (%s, %s, %s, repeat('0', 64)) returning doc_id",
                               [TENANT, f"d{d}", f"doc {d}"]).fetchone()[0]
            vecs = rng.standard_normal((10, dim)).astype(np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            with conn.cursor() as cur:
                cur.executemany(
                    "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                    " values (%s, %s, %s, %s, md5(%s) || md5(%s), %s::vector)",
                    [(TENANT, doc, p, c, c, str(d), str(v.tolist()))
                     for p, v in enumerate(vecs)
                     for c in [" ".join(words.choices(WORDS, weights=ZIPF, k=30))]])
            conn.commit()


def install_inline(owner: str, app_role: str) -> None:
    text = subprocess.run(["git", "show", f"{BASE}:src/kb_rerank/sql/functions/13_retrieve_hybrid.sql"], cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout
    text = text.replace("kb.retrieve_hybrid(", "kb.retrieve_hybrid_inline(")
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(text)
        conn.execute(f'grant execute on function kb.retrieve_hybrid_inline(text, public.vector, integer, integer, text,'
                     f' double precision, double precision, double precision, double precision, integer, text, text,'
                     f' bigint, jsonb) to "{app_role}"')


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="/tmp/kb-hybrid-fusion-ab")
    ap.add_argument("--chunks", type=int, default=10000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench/results/hybrid-fusion-ab.json"))
    args = ap.parse_args(argv)
    s = Settings(data_dir=Path(args.data_dir), database_name="kb_hybrid_fusion_ab")
    owner = db.migrate(s)
    load(owner, args.chunks, s.embedding_dim)
    install_inline(owner, s.app_role)
    rng = random.Random(5)
    times: dict[str, list[float]] = {"inline": [], "new": []}
    with psycopg.connect(db.app_url(s)) as conn:
        session.configure_connection(conn)
        with session.tenant_transaction(conn, TENANT):
            vecs = [np.asarray(r[0].to_numpy(), dtype=np.float32) for r in conn.execute(
                "select embedding from kb.chunks order by md5(chunk_id::text) limit %s", [args.queries])]
        qs = [(" ".join(rng.sample(WORDS[:500], rng.randint(1, 4))), v) for v in vecs]
        for i, (q, v) in enumerate(qs):
            rows = {}
            for side in (("inline", "new") if i % 2 == 0 else ("new", "inline")):
                fn = "retrieve_hybrid_inline" if side == "inline" else "retrieve_hybrid"
                with session.tenant_transaction(conn, TENANT):
                    t0 = time.perf_counter()
                    rows[side] = conn.execute(CALL.format(fn=fn).replace("count(*)", "chunk_id, score"),
                                              [q, v]).fetchall()
                    times[side].append((time.perf_counter() - t0) * 1000.0)
            if rows["inline"] != rows["new"]:
                raise SystemExit(f"query {i}: the two versions return different rows")
    ratio = [n / o for n, o in zip(times["new"], times["inline"])]
    out = {"p50_inline_ms": round(statistics.median(times["inline"]), 2),
           "p50_new_ms": round(statistics.median(times["new"]), 2),
           "p50_ratio_new_over_inline": round(statistics.median(ratio), 3), "queries": len(qs),
           "chunks": args.chunks, "base": BASE,
           "command": "python bench/hybrid_fusion_ab.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    print(json.dumps(out), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
