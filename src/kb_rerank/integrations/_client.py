"""The one HTTP client of the integrations (LangChain, LlamaIndex, MCP): base URL, bearer
token (fixed or from a provider called per request), timeouts, the request bodies of
``POST /v1/kb/search/rerank``, ``/v1/kb/context`` and ``/v2/rerank``, and the error mapping
(any non-2xx answer raises :class:`KbRerankError` carrying the status, the API's JSON error
body and the trace id; a 503 raises :class:`KbRerankUnavailable` with ``Retry-After``).

It also turns the API's results into ``(text, metadata, score)`` :class:`Hit` values the
framework adapters wrap in their own types, so the mapping is written once:

- metadata holds the ids, the title, every score field the result carries *as given*
  (``rerank_score``, ``fused_score``, ``final_score``, ``relevance_score``, the ``scores``
  table of ``/v1/kb/context``), ``scored_by``, ``tier``, the retrieval ``source``, and the
  answer's ``trace_id``, ``model``, ``fallback`` and ``fallback_reason`` (or the
  ``X-KB-Fallback`` header's reason); a key the answer lacks is not invented;
- :attr:`Hit.score` is the model's relevance (``rerank_score`` / ``relevance_score``) or None
  when the answer has none (a fallback's fused order is not a relevance);
- a passage the ingestion guard flagged (``flags.injection``) is only ever handed on fenced
  (:func:`kb_rerank.endpoints.context.prompt.fence_safe`), with ``flagged: true`` in its metadata.

Only httpx is imported here: no framework.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import httpx

__all__ = ["Answer", "Hit", "KbRerankClient", "KbRerankError", "KbRerankUnavailable", "SEARCH", "CONTEXT",
           "V2_RERANK", "search_hits", "context_hits", "rerank_hits"]

SEARCH = "/v1/kb/search/rerank"
CONTEXT = "/v1/kb/context"
V2_RERANK = "/v2/rerank"
FALLBACK_HEADER = "X-KB-Fallback"
DEFAULT_TIMEOUT_S = 30.0

# the per-result score fields copied into metadata when present (null kept as null)
SCORE_FIELDS = ("rerank_score", "fused_score", "final_score", "relevance_score")


class KbRerankError(RuntimeError):
    """A kb-rerank call that did not answer 2xx (or did not answer): ``status`` (None when
    the server could not be reached), ``body`` (the API's JSON error body, e.g.
    ``{"error": "invalid_request", "field": "top_n"}``), ``trace_id`` (``X-Trace-Id``)."""

    def __init__(self, message: str, *, status: int | None = None, body: Any = None, trace_id: str | None = None,
                 path: str | None = None, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.status, self.body, self.trace_id, self.path, self.retry_after = status, body, trace_id, path, retry_after

    @property
    def error(self) -> str | None:
        """The API's error code (``unauthorized``, ``invalid_request``, ...), when it sent one."""
        return self.body.get("error") if isinstance(self.body, dict) else None


class KbRerankUnavailable(KbRerankError):
    """503: nothing could serve the request now (no model can score, database unavailable);
    ``retry_after`` is the ``Retry-After`` header in seconds, when sent."""


@dataclass(frozen=True)
class Answer:
    """A 2xx answer: the JSON body, the trace id and the ``X-KB-Fallback`` header."""

    path: str
    body: dict[str, Any]
    trace_id: str | None
    fallback_header: str | None = None

    def summary(self) -> dict[str, Any]:
        """The answer-level fields every hit's metadata carries."""
        meta = self.body.get("meta") if isinstance(self.body.get("meta"), dict) else self.body
        out: dict[str, Any] = {"trace_id": self.trace_id}
        for key in ("model", "fallback", "fallback_reason"):
            if key in meta:
                out[key] = meta[key]
        if self.fallback_header:
            out["fallback"] = True
            if not out.get("fallback_reason"):
                out["fallback_reason"] = self.fallback_header
        return out


@dataclass(frozen=True)
class Hit:
    """One result as the framework adapters need it."""

    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    score: float | None = None
    id: str | None = None
    snippet: str | None = None  # the API's snippet (the passage's first 300 characters), when it sent one


TokenProvider = Callable[[], str]


def body_of(query: str, **options: Any) -> dict[str, Any]:
    """The request body: ``query`` and only the options the caller set (None = unset), so a
    server that does not know a field yet is never sent it unasked."""
    return {"query": query, **{k: v for k, v in options.items() if v is not None}}


class KbRerankClient:
    """Calls of the kb-rerank API with one tenant's token.

    ``token``: a bearer token (a JWT whose tenant claim selects the tenant), or
    ``token_provider``: a callable returning one, called before every request (rotation).
    ``transport`` / ``async_transport``: httpx transports (tests: ``httpx.MockTransport``).
    """

    def __init__(self, base_url: str, token: str | None = None, *, token_provider: TokenProvider | None = None,
                 timeout: float = DEFAULT_TIMEOUT_S, headers: Mapping[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None,
                 async_transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not base_url:
            raise ValueError("kb-rerank: base_url is required (e.g. http://127.0.0.1:8000)")
        if bool(token) == bool(token_provider):
            raise ValueError("kb-rerank: give exactly one of token and token_provider")
        self.base_url = base_url.rstrip("/")
        self._token, self._provider = token, token_provider
        self.timeout = float(timeout)
        self._headers = dict(headers or {})
        self._transport, self._async_transport = transport, async_transport
        self._sync: httpx.Client | None = None

    # ---------------------------------------------------------------- plumbing

    def _auth(self) -> dict[str, str]:
        token = self._provider() if self._provider is not None else self._token
        if not token:
            raise KbRerankError("kb-rerank: the token provider returned no token")
        return {**self._headers, "Authorization": f"Bearer {token}"}

    def _client(self) -> httpx.Client:
        if self._sync is None:
            self._sync = httpx.Client(base_url=self.base_url, timeout=self.timeout, transport=self._transport)
        return self._sync

    def close(self) -> None:
        if self._sync is not None:
            self._sync.close()
            self._sync = None

    def __enter__(self) -> "KbRerankClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        try:
            r = self._client().request(method, path, json=body, headers=self._auth())
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, path, exc) from exc
        return _answer(path, r)

    async def arequest(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        # one AsyncClient per call: an AsyncClient belongs to the event loop that opened it, and
        # frameworks run their async paths on loops of their own
        try:
            async with httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout,
                                         transport=self._async_transport) as client:
                r = await client.request(method, path, json=body, headers=self._auth())
        except httpx.HTTPError as exc:
            raise _unreachable(self.base_url, path, exc) from exc
        return _answer(path, r)

    # ---------------------------------------------------------------- the routes

    def search(self, query: str, *, source: str | None = None, top_n: int | None = None,
               filter: Mapping[str, Any] | None = None) -> Answer:
        """``POST /v1/kb/search/rerank``."""
        return self.request("POST", SEARCH, body_of(query, source=source, top_n=top_n, filter=filter))

    async def asearch(self, query: str, *, source: str | None = None, top_n: int | None = None,
                      filter: Mapping[str, Any] | None = None) -> Answer:
        return await self.arequest("POST", SEARCH, body_of(query, source=source, top_n=top_n, filter=filter))

    def context(self, query: str, *, top_n: int | None = None, filter: Mapping[str, Any] | None = None) -> Answer:
        """``POST /v1/kb/context``: ranked, guarded passages and the fenced ``<context>`` block."""
        return self.request("POST", CONTEXT, body_of(query, top_n=top_n, filter=filter))

    async def acontext(self, query: str, *, top_n: int | None = None,
                       filter: Mapping[str, Any] | None = None) -> Answer:
        return await self.arequest("POST", CONTEXT, body_of(query, top_n=top_n, filter=filter))

    def rerank(self, query: str, documents: Sequence[str | Mapping[str, Any]], *, top_n: int | None = None) -> Answer:
        """``POST /v2/rerank``: the caller's documents (strings or ``{"text", "id"?, ...}``)."""
        return self.request("POST", V2_RERANK, body_of(query, documents=list(documents), top_n=top_n))

    async def arerank(self, query: str, documents: Sequence[str | Mapping[str, Any]], *,
                      top_n: int | None = None) -> Answer:
        return await self.arequest("POST", V2_RERANK, body_of(query, documents=list(documents), top_n=top_n))

    def get(self, path: str) -> Answer:
        return self.request("GET", path)

    async def aget(self, path: str) -> Answer:
        return await self.arequest("GET", path)


def _unreachable(base: str, path: str, exc: Exception) -> KbRerankError:
    return KbRerankError(f"kb-rerank at {base} could not be reached for {path}: {exc}", path=path)


def _answer(path: str, r: httpx.Response) -> Answer:
    trace = r.headers.get("x-trace-id")
    try:
        body = r.json()
    except ValueError:
        body = None
    if not 200 <= r.status_code < 300:
        if isinstance(body, dict):
            trace = trace or body.get("trace_id")
            what = body.get("error", "error")
            detail = body.get("detail") or body.get("reason") or ""
            if body.get("field"):
                detail = f"{detail} (field {body['field']})".strip()
        else:
            what, detail = "error", r.text[:200]
        retry = _seconds(r.headers.get("retry-after"))
        cls = KbRerankUnavailable if r.status_code == 503 else KbRerankError
        msg = f"kb-rerank {path} answered {r.status_code} {what}" + (f": {detail}" if detail else "")
        if retry is not None:
            msg += f"; retry after {retry:g} s"
        msg += f" (trace {trace})" if trace else ""
        raise cls(msg, status=r.status_code, body=body, trace_id=trace, path=path, retry_after=retry)
    if not isinstance(body, dict):
        raise KbRerankError(f"kb-rerank {path} answered {r.status_code} without a JSON object",
                            status=r.status_code, body=None, trace_id=trace, path=path)
    trace = trace or body.get("trace_id") or (body.get("meta") or {}).get("trace_id")
    return Answer(path, body, trace, r.headers.get(FALLBACK_HEADER))


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


# --------------------------------------------------------------------------- results -> hits


def _scores(result: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: result[k] for k in SCORE_FIELDS if k in result}
    if isinstance(result.get("scores"), dict):
        out["scores"] = dict(result["scores"])
    for key in ("scored_by", "tier"):
        if key in result:
            out[key] = result[key]
    return out


def _relevance(result: Mapping[str, Any]) -> float | None:
    for key in ("rerank_score", "relevance_score"):
        value = result.get(key)
        if value is not None:
            return float(value)
    return None


def _kb_hit(result: Mapping[str, Any], answer: Answer, extra: Mapping[str, Any]) -> Hit:
    flagged = bool((result.get("flags") or {}).get("injection"))
    # the whole passage (/v1/kb/context's text); the search route has only the snippet (its
    # first 300 characters), as has a context answer of a server older than the field
    text = result.get("text") or result.get("snippet") or ""
    if flagged:
        from kb_rerank.endpoints.context.prompt import fence_safe

        text = fence_safe(text)
    meta: dict[str, Any] = {"chunk_id": result.get("chunk_id"), "doc_id": result.get("doc_id"),
                            "title": result.get("doc_title"), **_scores(result), **extra}
    for key in ("source", "source_path", "rank", "citation", "flags"):
        if key in result:
            meta[key] = result[key]
    if flagged:
        meta["flagged"] = True
    meta.update(answer.summary())
    return Hit(text=text, metadata=meta, score=_relevance(result), id=result.get("chunk_id"),
               snippet=result.get("snippet"))


def search_hits(answer: Answer) -> list[Hit]:
    """The results of ``POST /v1/kb/search/rerank``, in the service's order."""
    return [_kb_hit(r, answer, {}) for r in answer.body.get("results") or []]


def context_hits(answer: Answer) -> list[Hit]:
    """The results of ``POST /v1/kb/context``, in the service's order (flagged passages fenced)."""
    return [_kb_hit(r, answer, {"endpoint": "context"}) for r in answer.body.get("results") or []]


def rerank_hits(answer: Answer, texts: Sequence[str]) -> list[tuple[int, Hit]]:
    """The results of ``POST /v2/rerank`` as (index of the caller's document, hit), in the
    service's order; documents the service filtered out (``meta.filtered`` excluded) are absent."""
    out = []
    summary = answer.summary()
    for r in answer.body.get("results") or []:
        i = int(r["index"])
        meta = {"index": i, **_scores(r), **summary}
        if "id" in r:
            meta["id"] = r["id"]
        out.append((i, Hit(text=texts[i], metadata=meta, score=_relevance(r), id=r.get("id"))))
    return out


# --------------------------------------------------------------------------- shared by the adapters

ENDPOINTS = ("search", "context")


def make_client(client: KbRerankClient | None, base_url: str | None, token: Any,
                token_provider: TokenProvider | None, timeout: float) -> KbRerankClient:
    """The adapter's client: the one given, else one built from base URL and token (a str,
    or a pydantic ``SecretStr``)."""
    if client is not None:
        return client
    if not base_url:
        raise ValueError("kb-rerank: give base_url (and token or token_provider), or client")
    if hasattr(token, "get_secret_value"):
        token = token.get_secret_value()
    return KbRerankClient(base_url, token, token_provider=token_provider, timeout=timeout)


def check_endpoint(endpoint: str, source: str | None) -> bool:
    """Whether the options name the search endpoint (ValueError when they do not fit; the
    adapters call it when they are built, so a mistake fails there, not at the first query)."""
    if endpoint not in ENDPOINTS:
        raise ValueError(f"kb-rerank: endpoint must be one of {ENDPOINTS}, not {endpoint!r}")
    if endpoint == "context" and source is not None:
        raise ValueError("kb-rerank: source applies to endpoint=\"search\" only (/v1/kb/context, the default, "
                         "is hybrid)")
    return endpoint == "search"


def retrieve(client: KbRerankClient, query: str, *, endpoint: str = "context", source: str | None = None,
             top_n: int | None = None, filter: Mapping[str, Any] | None = None) -> list[Hit]:
    """The hits of ``/v1/kb/context`` (the default: the guarded route, whole passages) or
    ``/v1/kb/search/rerank`` (``endpoint="search"``: snippets, no guard policy)."""
    if check_endpoint(endpoint, source):
        return search_hits(client.search(query, source=source, top_n=top_n, filter=filter))
    return context_hits(client.context(query, top_n=top_n, filter=filter))


async def aretrieve(client: KbRerankClient, query: str, *, endpoint: str = "context", source: str | None = None,
                    top_n: int | None = None, filter: Mapping[str, Any] | None = None) -> list[Hit]:
    if check_endpoint(endpoint, source):
        return search_hits(await client.asearch(query, source=source, top_n=top_n, filter=filter))
    return context_hits(await client.acontext(query, top_n=top_n, filter=filter))


def rerank_texts(client: KbRerankClient, query: str, texts: Sequence[str], *,
                 top_n: int | None = None) -> list[tuple[int, Hit]]:
    """``/v2/rerank`` over ``texts``: (index, hit) in the service's order; none for no text.
    A 503 (no model can score) raises :class:`KbRerankUnavailable`: never the input order."""
    if not texts:
        return []
    return rerank_hits(client.rerank(query, texts, top_n=top_n), texts)


async def arerank_texts(client: KbRerankClient, query: str, texts: Sequence[str], *,
                        top_n: int | None = None) -> list[tuple[int, Hit]]:
    if not texts:
        return []
    return rerank_hits(await client.arerank(query, texts, top_n=top_n), texts)
