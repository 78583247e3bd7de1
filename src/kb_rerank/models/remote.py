"""The cross-encoder behind an inference server (``KB_RERANKER_BACKEND=remote``): many app
replicas share one GPU server instead of each loading the model.

Two published APIs, chosen by the URL's path (``KB_RERANKER_URL``):

* Hugging Face text-embeddings-inference (``.../rerank``, the default when the URL has no
  rerank path): ``POST {"query", "texts": [...], "raw_scores": false, "truncate": true}`` ->
  ``[{"index", "score"}]`` in score order; ``raw_scores: false`` gives the sigmoid, as
  FlagEmbedding's ``normalize=True`` does.
* Cohere-compatible v2 (``.../v2/rerank``; Infinity, hosted APIs, this service's own):
  ``POST {"model", "query", "documents": [...], "top_n"}`` -> ``{"results": [{"index",
  "relevance_score"}]}``.

``KB_RERANKER_API_KEY`` is sent as ``Authorization: Bearer``. Scores come back in the order of
the passages sent. Budget: the whole call (retries included) is bounded by
``rerank_timeout_s``; a connection error, a 429 or a 5xx is retried while at least a quarter of
the budget is left (at most ``retries`` times); running out of budget raises
:class:`RerankerTimeout` (fallback ``model_timeout``), any other failure :class:`RerankerError`
(fallback ``model_error``); out-of-range scores are caught by the scoring step
(``invalid_scores``). The same fallback rules as the in-process model.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Sequence
from urllib.parse import urlsplit

import httpx

from kb_rerank.models.cross_encoder import RerankerError, RerankerTimeout

log = logging.getLogger(__name__)

TEI, COHERE = "tei", "cohere"
# the reachability probe (/readyz, and after a fallback): its bound, and how long its verdict holds
PROBE_TIMEOUT_S = 2.0
PROBE_MAX_AGE_S = 5.0


def protocol_of(url: str) -> tuple[str, str]:
    """(protocol, endpoint URL) for ``KB_RERANKER_URL``."""
    path = urlsplit(url).path.rstrip("/")
    if path.endswith("/v2/rerank"):
        return COHERE, url
    if path.endswith("/rerank"):
        return TEI, url
    return TEI, url.rstrip("/") + "/rerank"


class RemoteReranker:
    backend = "remote"

    def __init__(self, url: str, *, model_name: str, api_key: str | None = None, timeout_s: float = 30.0,
                 retries: int = 2, transport: httpx.AsyncBaseTransport | None = None) -> None:
        if not url:
            raise ValueError("KB_RERANKER_BACKEND=remote needs KB_RERANKER_URL (the inference server's rerank URL)")
        self.protocol, self.url = protocol_of(url)
        self._model_name = model_name
        self.timeout_s = float(timeout_s) if timeout_s and timeout_s > 0 else 30.0
        self.retries = max(0, int(retries))
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(headers=headers, transport=transport)
        self.last_error: str | None = None
        self.calls = 0
        self._reachable = True  # the last probe's verdict (or the last call's success)
        self._probed_at: float | None = None

    # the interface the pipeline and /readyz read (kb_rerank.models.cross_encoder.Reranker's)
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def ready(self) -> bool:
        """False once a probe found the server unable to score (unreachable, or not answering
        200): answers are then fallbacks, each of which probes again in the background
        (:meth:`ensure_loaded_async`), and ``/readyz`` says ``degraded``."""
        return self._reachable

    @property
    def state(self) -> str:
        return "remote" if self._reachable else "unreachable"

    async def probe(self, *, max_age_s: float = PROBE_MAX_AGE_S) -> bool:
        """Whether the server scores now: one rerank of one short passage, bounded by
        ``PROBE_TIMEOUT_S``; a verdict younger than ``max_age_s`` is reused (``/readyz`` is
        polled by load balancers, each poll must not cost an inference)."""
        now = time.monotonic()
        if self._probed_at is not None and now - self._probed_at < max_age_s:
            return self._reachable
        self._probed_at = now
        timeout = min(PROBE_TIMEOUT_S, self.timeout_s)
        try:
            r = await asyncio.wait_for(self._client.post(self.url, json=self._body("ping", ["ping"]), timeout=timeout),
                                       timeout)
            if r.status_code == 200:
                self._scores(r.json(), 1)
                self._reachable, self.last_error = True, None
            else:
                self._reachable, self.last_error = False, f"HTTP {r.status_code}"
        except (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError):
            self._reachable, self.last_error = False, "timeout"
        except (httpx.HTTPError, RerankerError, ValueError) as exc:
            self._reachable, self.last_error = False, type(exc).__name__
        return self._reachable

    async def ensure_loaded_async(self) -> bool:
        return await self.probe()

    def _body(self, query: str, passages: list[str]) -> dict[str, Any]:
        if self.protocol == COHERE:
            return {"model": self._model_name, "query": query, "documents": passages, "top_n": len(passages)}
        return {"query": query, "texts": passages, "raw_scores": False, "truncate": True}

    def _scores(self, payload: Any, n: int) -> list[float]:
        items = payload.get("results") if self.protocol == COHERE and isinstance(payload, dict) else payload
        key = "relevance_score" if self.protocol == COHERE else "score"
        if not isinstance(items, list):
            raise RerankerError(f"unexpected answer from {self.protocol} server: not a list of results")
        out = [math.nan] * n
        for item in items:
            try:
                i, s = int(item["index"]), float(item[key])
            except (KeyError, TypeError, ValueError) as exc:
                raise RerankerError(f"unexpected result from {self.protocol} server: {type(exc).__name__}") from None
            if 0 <= i < n:
                out[i] = s
        if any(math.isnan(x) for x in out):
            raise RerankerError(f"{self.protocol} server scored {sum(not math.isnan(x) for x in out)} of {n} passages")
        return out

    async def ascore(self, query: str, passages: Sequence[str]) -> list[float]:
        passages = list(passages)
        if not passages:
            return []
        deadline = time.monotonic() + self.timeout_s
        attempt = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RerankerTimeout(f"remote reranker gave no answer within {self.timeout_s:g}s")
            self.calls += 1
            try:
                # httpx's timeout bounds each network phase; wait_for bounds the whole call
                r = await asyncio.wait_for(self._client.post(self.url, json=self._body(query, passages), timeout=left),
                                           left)
            except (httpx.TimeoutException, asyncio.TimeoutError, TimeoutError):
                self.last_error = "timeout"
                raise RerankerTimeout(f"remote reranker gave no answer within {self.timeout_s:g}s") from None
            except httpx.TransportError as exc:
                self.last_error = type(exc).__name__
                retry = True
            else:
                if r.status_code == 200:
                    scores = self._scores(r.json(), len(passages))
                    self.last_error, self._reachable = None, True
                    return scores
                self.last_error = f"HTTP {r.status_code}"
                retry = r.status_code == 429 or r.status_code >= 500
                if not retry:
                    raise RerankerError(f"remote reranker answered {r.status_code}")
            attempt += 1
            if attempt > self.retries or deadline - time.monotonic() < self.timeout_s / 4:
                raise RerankerError(f"remote reranker failed after {attempt} attempt(s): {self.last_error}")
            await asyncio.sleep(min(0.05 * attempt, max(0.0, deadline - time.monotonic())))

    async def aclose(self) -> None:
        await self._client.aclose()
