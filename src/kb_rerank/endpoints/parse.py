"""The request bodies of the three JSON routes, decoded and validated in one place: a bad
body is a 400 (invalid JSON, too deep) or a 422 naming the field (:mod:`.body`), before any
work. The query rule (no NUL, not blank, at most ``max_query_chars``) is written once."""

from __future__ import annotations

from kb_rerank.http import body
from kb_rerank.http.body import invalid
from kb_rerank.core.language import normalize_language_code
from kb_rerank.filters import grammar as filters
from kb_rerank.endpoints.requests import ContextRequest, RerankRequest, V2Request
from kb_rerank.core.settings import SOURCES, Settings


def check_query(q: str, settings: Settings) -> None:
    if "\x00" in q:
        raise invalid("query", "query must not contain NUL characters")
    if not q.strip():
        raise invalid("query", "query must not be empty or whitespace only")
    if len(q) > settings.max_query_chars:
        raise invalid("query", f"query is longer than {settings.max_query_chars} characters")


def check_top_n(obj: dict, settings: Settings) -> None:
    """``top_n`` of the search and context endpoints (results returned): one bound, 1 ..
    ``KB_MAX_TOP_N``, one message. (``/v2/rerank``'s ``top_n`` is Cohere's: any count, at most
    the documents.)"""
    n = obj.get("top_n")
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= settings.max_top_n):
        raise invalid("top_n", f"top_n must be a whole number between 1 and {settings.max_top_n}")


def check_filter(value):
    """A request's ``filter`` in canonical form (None: no filter); a 422 naming the field
    (``filter.product``, ``filter.updated_at.$gte``) when it is outside the grammar."""
    try:
        return filters.canonical(value)
    except filters.FilterError as exc:
        raise invalid(exc.field, exc.detail) from None


def check_language(value):
    """A request's ``language`` as its ISO 639-1 code (None: none given); a 422 naming the
    field when it is no language code or name we know (the filter's language codes' rule)."""
    if value is None:
        return None
    try:
        return normalize_language_code(value)
    except ValueError as exc:
        raise invalid("language", str(exc)) from None


def rerank_request(raw: bytes, settings: Settings) -> RerankRequest:
    obj = body.decode_object(raw)
    source = obj.get("source", None)
    if "source" in obj and (not isinstance(source, str) or source not in SOURCES):
        raise invalid("source", "source must be one of: " + ", ".join(SOURCES), allowed=list(SOURCES))
    check_top_n(obj, settings)
    req = body.convert(obj, RerankRequest)
    check_query(req.query, settings)
    req.filter = check_filter(req.filter)
    req.language = check_language(req.language)
    return req


def context_request(raw: bytes, settings: Settings) -> ContextRequest:
    obj = body.decode_object(raw)
    check_top_n(obj, settings)
    req: ContextRequest = body.convert(obj, ContextRequest)
    check_query(req.query, settings)
    req.filter = check_filter(req.filter)
    req.language = check_language(req.language)
    return req


def v2_request(raw: bytes, settings: Settings) -> V2Request:
    # The body limit (v2_max_body_bytes) is the route's request_max_body_size: a larger body
    # was refused with 413 while it was read, before it reached here.
    req: V2Request = body.decode(raw, V2Request)
    check_query(req.query, settings)
    n = len(req.documents)
    if n == 0:
        raise invalid("documents", "documents must not be empty")
    if n > settings.v2_max_documents:
        raise invalid("documents", f"at most {settings.v2_max_documents} documents per request, got {n}")
    for i, d in enumerate(req.documents):
        text = d if isinstance(d, str) else d.text
        where = f"documents[{i}]" if isinstance(d, str) else f"documents[{i}].text"
        if not text.strip():
            raise invalid(where, "document text must not be empty")
        if "\x00" in text:
            raise invalid(where, "document text must not contain NUL characters")
        if len(text) > settings.v2_max_document_chars:
            raise invalid(where, f"document text is longer than {settings.v2_max_document_chars} characters")
        if not isinstance(d, str):
            # echoed in the answer and stored with it (jsonb refuses NUL): a 500 found by the fuzzer
            for name, value in (("id", d.id), ("metadata.source", d.metadata and d.metadata.source)):
                if value and "\x00" in value:
                    raise invalid(f"documents[{i}].{name}", f"{name} must not contain NUL characters")
    if req.model and "\x00" in req.model:
        raise invalid("model", "model must not contain NUL characters")
    # `model` is accepted (Cohere clients always send one) and echoed in meta.requested_model;
    # the deployment's cross-encoder serves (meta.model).
    return req
