"""Where the filtered HNSW list misses (issue 33): for a 50 % filter at k = 120 (kb.retrieve_hybrid's
semantic depth), the rank in the exact filtered list of the first chunk the iterative HNSW scan
(relaxed_order, ef_search 100: kb.search_semantic_ids' broad-filter path) did not return, and
the cosine similarities at ranks 1 / 40 / 80 / 120. Reuses bench/filtered_recall.py's database
(run that first).

    python bench/filtered_recall_misses.py
"""
import sys, statistics
from pathlib import Path
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench")); sys.path.insert(0, str(ROOT / "src"))
import numpy as np, psycopg
from psycopg.types.json import Jsonb
import filtered_recall as fr
from kb_rerank.db import database as db
from kb_rerank.core.settings import Settings
from kb_rerank.core import session
settings = Settings(data_dir=Path("/tmp/kb-filtered-recall"), database_name="kb_filtered_recall")
owner = db.migrate(settings); app = db.app_url(settings)
D = lambda sql: sql.replace("select chunk_id from nn", "select chunk_id, distance from nn")
nrng = np.random.default_rng(11)
with psycopg.connect(app) as conn:
    session.configure_connection(conn)
    with session.tenant_transaction(conn, fr.TENANT):
        base = [np.asarray(r[0].to_numpy(), dtype=np.float32) for r in conn.execute("select embedding from kb.chunks tablesample bernoulli (1) limit 15")]
        docs = conn.execute("select kb.search_filter_docs(%s)", [Jsonb({"tags": "p50"})]).fetchone()[0]
    qs = [q/np.linalg.norm(q) for q in (b + nrng.normal(size=fr.DIM).astype(np.float32)*0.04 for b in base)]
    for q in qs[:8]:
        p = {"q": q, "k": 120, "docs": docs}
        with session.tenant_transaction(conn, fr.TENANT):
            ex = conn.execute(D(fr.EXACT_SQL), p).fetchall()
        with session.tenant_transaction(conn, fr.TENANT):
            conn.execute("set local hnsw.iterative_scan = relaxed_order; set local hnsw.ef_search = 100")
            got = conn.execute(D(fr.HNSW_SQL), p).fetchall()
        g = {r[0] for r in got}
        missed = [i for i, r in enumerate(ex) if r[0] not in g]
        first_miss = missed[0] if missed else None
        print("recall", round(1-len(missed)/120,3), "first missed rank", first_miss,
              "sim at 1/40/80/120:", [round(1-ex[i][1],3) for i in (0,39,79,119)],
              "sim of first miss", round(1-ex[first_miss][1],3) if missed else None, flush=True)
