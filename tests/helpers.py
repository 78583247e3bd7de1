"""Small helpers shared by tests (plain functions, no fixtures)."""

from __future__ import annotations

import hashlib
import uuid

import numpy as np

from kb_rerank.core.session import tenant_transaction


def insert_doc(conn, tenant, title: str, chunks: list[str], vectors, *, source_uri: str | None = None,
               language: str | None = None) -> uuid.UUID:
    """Insert a document and its chunks for ``tenant`` as the connected role (RLS applies)."""
    with tenant_transaction(conn, tenant):
        doc_id = conn.execute(
            "insert into kb.documents (tenant_id, source_uri, title, content_hash, language)"
            " values (kb.current_tenant(), %s, %s, %s, %s) returning doc_id",
            [source_uri or f"test:{uuid.uuid4()}", title, hashlib.sha256(title.encode()).hexdigest(), language],
        ).fetchone()[0]
        for pos, (text, vec) in enumerate(zip(chunks, vectors)):
            conn.execute(
                "insert into kb.chunks (tenant_id, doc_id, position, content, content_hash, embedding)"
                " values (kb.current_tenant(), %s, %s, %s, %s, %s)",
                [doc_id, pos, text, hashlib.sha256(text.encode()).hexdigest(), np.asarray(vec, dtype=np.float32)],
            )
    return doc_id


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float32)
    return v / np.linalg.norm(v)


def basis(i: int, dim: int = 384) -> np.ndarray:
    v = np.zeros(dim, dtype=np.float32)
    v[i] = 1.0
    return v


def search_key(settings, query: str, source: str = "hybrid_lexical_semantic", *, model: str | None = None,
               hash_key: bytes | None = None) -> str:
    """The cache key (and audit ``query_hash``) that ``POST /v1/kb/search/rerank`` gives
    ``query`` in an app of ``settings`` whose reranker is named ``model`` (default: the
    settings' model): computed by the pipeline itself, not restated here."""
    from types import SimpleNamespace

    from kb_rerank.endpoints.runner import Pipeline
    from kb_rerank.endpoints.requests import RerankRequest
    from kb_rerank.endpoints.search.flow import SearchFlow

    pipe = Pipeline(settings, None, None, SimpleNamespace(model_name=model or settings.reranker_model),
                    hash_key=hash_key)
    return pipe.cache_key(pipe.flow(SearchFlow, RerankRequest(query=query, source=source)), None)


def app_search_key(app, query: str, source: str = "hybrid_lexical_semantic") -> str:
    """:func:`search_key` of a running app (its pipeline's settings, model and key)."""
    from kb_rerank.endpoints.requests import RerankRequest
    from kb_rerank.endpoints.search.flow import SearchFlow

    pipe = app.state.pipeline
    return pipe.cache_key(pipe.flow(SearchFlow, RerankRequest(query=query, source=source)), None)
