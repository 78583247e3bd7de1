"""Unfiltered speed before and after issue 33's SQL change, interleaved A/B in one run.

Installs the searches as they were at 0021 (git show cb6e903:...) beside the head ones, under
names suffixed _0021, in bench/filtered_recall.py's database (reused: run that first), then
times kb.retrieve_hybrid (the service's read: 60 deep, convex, 40 rows) and
kb.search_lexical_ids (k 60), old and new alternately query by query (the order flipped every
other query), each call its own transaction. Reports p50 per side and the p50 of the per-query
ratio new / old.

    python bench/filter_ab.py --out bench/results/filtered-recall-ab.json
"""

from __future__ import annotations

import argparse
import json
import random
import re
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

from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core import session  # noqa: E402

BASE = "cb6e903"
FILES = ["10_search_lexical.sql", "11_search_semantic.sql", "11_search_semantic_ids.sql", "12_search_hybrid.sql",
         "13_retrieve_hybrid.sql"]
NAMES = re.compile(r"\b(search_lexical_ids|search_lexical|search_semantic_ids|search_semantic|search_hybrid|retrieve_hybrid)\b")
TENANT = uuid.UUID(int=33)
WORDS = [f"w{i:03d}" for i in range(400)]


def install_old(owner: str) -> None:
    with psycopg.connect(owner, autocommit=True) as conn:
        for f in FILES:
            text = subprocess.run(["git", "show", f"{BASE}:src/kb_rerank/sql/functions/{f}"], cwd=ROOT, check=True,
                                  capture_output=True, text=True).stdout
            conn.execute(NAMES.sub(r"\1_0021", text))
        conn.execute("grant execute on function kb.retrieve_hybrid_0021(text, public.vector, integer, integer, text,"
                     " double precision, double precision, double precision, double precision, integer, text, text,"
                     " bigint), kb.search_lexical_ids_0021(text, integer, double precision, double precision)"
                     " to kb_app")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="/tmp/kb-filtered-recall")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "bench/results/filtered-recall-ab.json"))
    args = ap.parse_args(argv)
    s = Settings(data_dir=Path(args.data_dir), database_name="kb_filtered_recall")
    owner = db.migrate(s)
    install_old(owner)
    rng = random.Random(5)
    out = {}
    with psycopg.connect(db.app_url(s)) as conn:
        session.configure_connection(conn)
        with session.tenant_transaction(conn, TENANT):
            vecs = [np.asarray(r[0].to_numpy(), dtype=np.float32) for r in conn.execute(
                "select embedding from kb.chunks tablesample bernoulli (2) limit %s", [args.queries])]
        qs = [(" ".join(rng.sample(WORDS, rng.randint(1, 4))), v) for v in vecs]
        ops = {
            "retrieve_hybrid": ("select count(*) from kb.{fn}(%s, %s::vector, 60, 10, 'convex', 0.7, 0.3, 1.2, 0.75, 40,"
                                " null, null, null)", "retrieve_hybrid"),
            "search_lexical_ids": ("select count(*) from kb.{fn}(%s, 60)", "search_lexical_ids"),
        }
        for name, (sql, fn) in ops.items():
            times = {"old": [], "new": []}
            for i, (q, v) in enumerate(qs):
                args_ = [q, v] if "vector" in sql else [q]
                order = ("old", "new") if i % 2 == 0 else ("new", "old")
                for side in order:
                    stmt = sql.format(fn=fn + ("_0021" if side == "old" else ""))
                    with session.tenant_transaction(conn, TENANT):
                        t0 = time.perf_counter()
                        conn.execute(stmt, args_).fetchone()
                        times[side].append((time.perf_counter() - t0) * 1000.0)
            ratio = [n / o for n, o in zip(times["new"], times["old"])]
            out[name] = {"p50_old_ms": round(statistics.median(times["old"]), 2),
                         "p50_new_ms": round(statistics.median(times["new"]), 2),
                         "p50_ratio_new_over_old": round(statistics.median(ratio), 3), "queries": len(qs)}
            print(name, out[name], flush=True)
    out["command"] = "python bench/filter_ab.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out["corpus"] = "bench/filtered_recall.py's: 40000 synthetic chunks, one tenant, no filter"
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    md = ["# Unfiltered search speed before and after the filter (issue 33)", "",
          f"Command: `{out['command']}` (after `python bench/filtered_recall.py --chunks 40000 --queries 50`,"
          " whose database it reuses).", "",
          f"Corpus: {out['corpus']}. The searches of 0021 (cb6e903) installed beside head's as *_0021, called"
          " alternately query by query (order flipped every other query), each call its own transaction.", "",
          "| statement | queries | p50 0021 (ms) | p50 head (ms) | p50 of per-query ratio head / 0021 |", "|---|---|---|---|---|"]
    for name in ops:
        r = out[name]
        md.append(f"| {name} | {r['queries']} | {r['p50_old_ms']} | {r['p50_new_ms']} | {r['p50_ratio_new_over_old']} |")
    Path(args.out).with_suffix(".md").write_text("\n".join(md) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
