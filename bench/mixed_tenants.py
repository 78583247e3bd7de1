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
  * controls ``english-2`` (cranfield + cacm) and ``english-3`` (+ cisi), run with any mix that
    holds them: English collections sharing a tenant lose to each other whatever the languages
    (the statistics are the union's, and a CISI question finds CACM abstracts on the same
    subjects, unjudged); the column "English only" is that loss, and "Δ vs English only" the
    part the other languages add.

Documents keep their collection's ids behind a prefix (``beir:<collection>/<id>``): the XQuAD
translations share ids. Tenants are named by the collections' corpus hashes, the chunking and
the embedder, so a re-run finds them loaded.

Embeddings: ``lexical`` needs none, and embedding 6,000 abstracts takes an hour on 2 cores, so
with ``--modes lexical`` the chunks get stand-in vectors (:class:`StandIn`, a hash of the text,
its own tenants: never searched semantically). ``hybrid`` embeds with the configured embedder
(through the evaluation's embedding cache, ``<data_dir>/embed-cache``).

``--no-detect`` leaves every query's language undetermined (the service's path for a query
too short or ambiguous to detect: the tenant's languages, a word's forms one group); with the
mix ``latin`` it measures that path where it matters most.

Target: every collection within 0.005 of its own tenant. Writes
``bench/results/mixed-tenants.{md,json}`` (``--out`` for another name).

    KB_DATA_DIR=/tmp/kb-mixed kb-rerank db start && KB_DATA_DIR=/tmp/kb-mixed kb-rerank migrate
    KB_DATA_DIR=/tmp/kb-mixed python bench/mixed_tenants.py --modes lexical
    KB_DATA_DIR=/tmp/kb-mixed python bench/mixed_tenants.py --modes lexical hybrid --mixes minority-el
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
from kb_rerank.ingest.loader import ingest_documents  # noqa: E402

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


def evaluate(settings, names, tenant, mode, embedder, limit) -> dict[str, float]:
    out = {}
    for n in names:
        t0 = time.perf_counter()
        res = evaluate_collection(settings, DATASETS / n, mode, 10, embedder=embedder, cache=False,
                                  limit_queries=limit, tenant=tenant, doc_prefix=prefix(n))
        out[n] = res["ndcg@10"]
        print(f"    {mode} {n}: nDCG@10 {res['ndcg@10']:.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr,
              flush=True)
    return out


def markdown(res: dict) -> str:
    lines = [f"Mixed tenants against own tenants, nDCG@10 ({res['date']}, {res['machine']}, code {res['commit']};"
             f" {res['queries']}; query language {res['query_language']}).", "",
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
    ap.add_argument("--modes", nargs="*", default=["lexical"], choices=["lexical", "hybrid"])
    ap.add_argument("--limit-queries", type=int, default=None, help="the first N queries of each collection")
    ap.add_argument("--out", default="mixed-tenants", help="results file stem under bench/results/")
    ap.add_argument("--no-detect", action="store_true",
                    help="no query language detected: every query analysed in the tenant's languages")
    args = ap.parse_args(argv)
    if args.no_detect:
        from kb_rerank.retrieval import spec

        spec.search_query_language = lambda query: None
    settings = Settings.from_env()
    if "hybrid" in args.modes:
        from kb_rerank.models.embedders import get_embedder

        embedder = CachedEmbedder(get_embedder(settings), embed_cache_dir(settings))
    else:
        embedder = StandIn(settings.embedding_dim)
    mixes = list(args.mixes) + [c for c in dict.fromkeys(map(control_of, args.mixes)) if c and c not in args.mixes]
    names = sorted({n for m in mixes for n in MIXES[m]})
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
    with factory() as conn:
        for n in names:
            print(f"{n} (own tenant):", file=sys.stderr, flush=True)
            t = tenant_for("own", [n], settings, embedder)
            load_tenant(conn, t, [n], settings, embedder)
            res["own"][n] = {mode: evaluate(settings, [n], t, mode, embedder, args.limit_queries)[n]
                             for mode in args.modes}
        for mix in mixes:
            print(f"{mix}:", file=sys.stderr, flush=True)
            t = tenant_for("mixed", MIXES[mix], settings, embedder)
            info = load_tenant(conn, t, MIXES[mix], settings, embedder)
            info["ndcg@10"] = {mode: evaluate(settings, MIXES[mix], t, mode, embedder, args.limit_queries)
                               for mode in args.modes}
            res["mixes"][mix] = info
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
    md = markdown(res)
    (RESULTS / f"{args.out}.md").write_text(md, encoding="utf-8")
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
