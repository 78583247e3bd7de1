"""kb.search_hybrid and kb.retrieve_hybrid reading their texts through kb.chunk_texts against
the versions that wrote the two joins inline (BASE), interleaved A/B in one run.

Loads one small tenant of synthetic chunks (random words, random unit vectors) into a database
of the embedded server, installs BASE's two functions beside today's as kb.search_hybrid_base
and kb.retrieve_hybrid_base, then calls each pair alternately query by query (the order flipped
every other query), each call its own transaction as the app role. Checks that both return the
same rows; reports p50 per side and the p50 of the per-query ratio new / base. Stops the
server it started.

    python bench/search_texts_ab.py --chunks 2000 --queries 200
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from hybrid_fusion_ab import TENANT, WORDS, load  # noqa: E402
from kb_rerank.core import session  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.db.layer import render  # noqa: E402

BASE = "8f59414"
CALLS = {
    "search_hybrid": "select chunk_id, doc_title, snippet, score from kb.{fn}(%s, %s::vector, 60)",
    "retrieve_hybrid": ("select chunk_id, doc_title, snippet, score, pair_score from kb.{fn}(%s, %s::vector, 60, 10,"
                        " 'convex', 0.7, 0.3, 1.2, 0.75, 40, 'm', repeat('0', 64), 1)"),
}


def install_base(owner: str, s: Settings) -> None:
    with psycopg.connect(owner, autocommit=True) as conn:
        for fn in CALLS:
            text = subprocess.run(["git", "show", f"{BASE}:src/kb_rerank/retrieval/sql/{fn}.sql"], cwd=ROOT,
                                  check=True, capture_output=True, text=True).stdout
            with tempfile.NamedTemporaryFile("w", suffix=".sql") as f:
                f.write(text.replace(f"kb.{fn}(", f"kb.{fn}_base(")
                        .replace(f"drop function if exists kb.{fn}_base(", f"drop function if exists kb.{fn}_x("))
                f.flush()
                conn.execute(render(Path(f.name), embedding_dim=s.embedding_dim, app_role=s.app_role))
            conn.execute(f'grant execute on all functions in schema kb to "{s.app_role}"')


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench/results/search-texts-ab.json"))
    args = ap.parse_args(argv)
    data = Path(tempfile.mkdtemp(prefix="kb-search-texts-ab-"))
    s = Settings(data_dir=data, database_name="kb_search_texts_ab")
    try:
        owner = db.migrate(s)
        load(owner, args.chunks, s.embedding_dim)
        with psycopg.connect(owner, autocommit=True) as conn:
            conn.execute("analyze")
        install_base(owner, s)
        rng = np.random.default_rng(5)
        out: dict[str, object] = {}
        with psycopg.connect(db.app_url(s)) as conn:
            session.configure_connection(conn)
            with session.tenant_transaction(conn, TENANT):
                vecs = [np.asarray(r[0].to_numpy(), dtype=np.float32) for r in conn.execute(
                    "select embedding from kb.chunks order by md5(chunk_id::text) limit %s", [args.queries])]
            qs = [(" ".join(rng.choice(WORDS[:500], rng.integers(1, 5))), v) for v in vecs]
            for name, call in CALLS.items():
                times: dict[str, list[float]] = {"base": [], "new": []}
                for i, (q, v) in enumerate(qs):
                    rows = {}
                    for side in (("base", "new") if i % 2 == 0 else ("new", "base")):
                        fn = f"{name}_base" if side == "base" else name
                        with session.tenant_transaction(conn, TENANT):
                            t0 = time.perf_counter()
                            rows[side] = conn.execute(call.format(fn=fn), [q, v]).fetchall()
                            times[side].append((time.perf_counter() - t0) * 1000.0)
                    if rows["base"] != rows["new"] or not rows["new"]:
                        raise SystemExit(f"{name}, query {i}: the two versions differ (or return nothing)")
                ratio = [n / b for n, b in zip(times["new"], times["base"])]
                out[name] = {"p50_base_ms": round(statistics.median(times["base"]), 3),
                             "p50_new_ms": round(statistics.median(times["new"]), 3),
                             "p50_ratio_new_over_base": round(statistics.median(ratio), 3)}
        out.update(queries=len(qs), chunks=args.chunks, base=BASE,
                   command="python bench/search_texts_ab.py " + " ".join(argv if argv is not None else sys.argv[1:]))
        print(json.dumps(out), flush=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    finally:
        db.stop_embedded(s)
        shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
