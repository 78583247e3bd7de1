"""What diversity costs: nDCG@10 of the production hybrid candidates ordered by relevance,
with and without MMR, on BEIR folders already loaded by `kb-rerank eval` / bench/quality.py.

Relevance = fused score / best fused score of the query (the service's fallback relevance:
the real cross-encoder is not available offline), MMR over the chunk embeddings stored in
Postgres (kb_rerank.rerank.diversify.composite), documents deduplicated after ranking.

    KB_DATA_DIR=/tmp/kb-eval python bench/mmr_quality.py ../shared/datasets/cisi ... [--lambdas 1,0.7,0.6]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import psycopg  # noqa: E402

from kb_rerank.core import session
from kb_rerank.db import database as db  # noqa: E402
from kb_rerank.core.candidate import Candidate
from kb_rerank.rerank import diversify as ranking
from kb_rerank.retrieval import store as search
from kb_rerank.models.embedders import get_embedder  # noqa: E402
from kb_rerank.eval.runs import CachedEmbedder, _dedup, _doc_map, embed_cache_dir, load_collection  # noqa: E402
from kb_rerank.eval.measures import evaluate_run, load_beir  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.core.session import run


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("datasets", nargs="+", type=Path)
    ap.add_argument("--lambdas", default="1,0.8,0.7,0.6")
    ap.add_argument("--out", type=Path, default=Path("bench/results/mmr-quality.json"))
    args = ap.parse_args()
    lams = [float(x) for x in args.lambdas.split(",")]
    settings = Settings.from_env()
    db.migrate(settings)
    emb = CachedEmbedder(get_embedder(settings), embed_cache_dir(settings))
    out = {}
    with psycopg.connect(db.app_url(settings)) as conn:
        session.configure_connection(conn)
        for path in args.datasets:
            coll = load_beir(path)
            tenant = uuid.UUID(load_collection(conn, path, settings, emb, coll=coll)["tenant"])
            docmap = _doc_map(conn, tenant)
            qids = sorted(q for q in coll.queries if q in coll.qrels)
            runs: dict[float, dict] = {lam: {} for lam in lams}
            for qid in qids:
                q = coll.queries[qid]
                with session.tenant_transaction(conn, tenant):
                    rows = run(conn, search.ahybrid, q, emb.embed_query(q), settings.fusion_depth,
                                         **settings.fusion)[: 2 * settings.candidates]
                    ids = [r.chunk_id for r in rows]
                    embs = dict(conn.execute("select chunk_id, embedding from kb.chunks where chunk_id = any(%s)",
                                             [ids]).fetchall()) if ids else {}
                if not rows:
                    for lam in lams:
                        runs[lam][qid] = []
                    continue
                best = max(r.score for r in rows)
                E = np.stack([np.asarray(embs[i].to_numpy(), dtype=np.float32) for i in ids])
                cands = [Candidate(id=str(r.chunk_id), relevance=r.score / best, content=r.content) for r in rows]
                for lam in lams:
                    ranked = ranking.composite(cands, E, lam=lam, k=len(rows))
                    runs[lam][qid] = _dedup(docmap[rows[x.index].doc_id] for x in ranked)
            qrels = {qid: coll.qrels[qid] for qid in qids}
            res = {str(lam): round(evaluate_run(runs[lam], qrels, k=10, recall_k=100)["ndcg@10"], 4) for lam in lams}
            out[path.name] = res
            print(path.name, res, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
