"""Per-request stage timings, answered in the standard ``Server-Timing`` header (the
playground shows them; browsers' developer tools do too), in the order of :data:`ORDER`:
``cache`` (the result-cache lookup), ``embed`` (query and passage embeddings), ``lexical`` (a
hybrid miss's lexical list, read while the query is embedded: it overlaps ``embed``),
``retrieve`` (the candidate search), ``guard`` (the /v2/rerank detectors), ``rerank`` (the
cross-encoder, with its queue), ``record`` (cache write and audit row), ``total`` (the whole
handler). Every stage but ``lexical`` runs after the one before it.

:func:`start` / :func:`stop` are called by the HTTP layer around each request; :func:`stage` adds a stage's
wall time to the request's dict. Outside a request (benchmarks, tests calling the pipeline
directly) nothing is recorded. A stage that runs more than once (two embeddings) adds up.

When the app traces (OpenTelemetry, :mod:`kb_rerank.http.tracing`), its middleware puts a span
opener in :data:`SPANS` for the request, and each stage is also a span of that name; otherwise
the only cost is one context-variable read per stage (bench/otel_overhead.py).
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar, Token
from typing import Any, Callable, ContextManager, Iterator

# the header's order (a stage that runs beside another ends in either order)
ORDER = ("cache", "embed", "lexical", "retrieve", "guard", "rerank", "record", "total")
_STAGES: ContextVar[dict[str, float] | None] = ContextVar("kb_rerank_stage_ms", default=None)
# name -> a context manager that is the stage's span (set per request by a tracing app)
SPANS: ContextVar[Callable[[str], ContextManager[Any]] | None] = ContextVar("kb_rerank_stage_spans", default=None)


def start() -> tuple[Token, dict[str, float]]:
    """A new (empty) record for the current request, filled by the stages; give the token
    to :func:`stop` when the request ends."""
    stages: dict[str, float] = {}
    return _STAGES.set(stages), stages


def stop(token: Token) -> None:
    _STAGES.reset(token)


def stage(name: str) -> ContextManager[None]:
    """The stage ``name``: its wall time in the request's record, and its span when traced."""
    spans = SPANS.get()
    if spans is None:
        return _timed(name)
    return _traced(spans(name), name)


@contextlib.contextmanager
def _traced(span: ContextManager[Any], name: str) -> Iterator[None]:
    with span, _timed(name):
        yield


@contextlib.contextmanager
def _timed(name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stages = _STAGES.get()
        if stages is not None:
            stages[name] = stages.get(name, 0.0) + (time.perf_counter() - t0) * 1000.0


def server_timing(stages: dict[str, float]) -> str:
    """``Server-Timing`` value: ``cache;dur=1.2, retrieve;dur=3.4, ...`` in milliseconds."""
    rank = {name: i for i, name in enumerate(ORDER)}
    named = sorted(stages.items(), key=lambda kv: rank.get(kv[0], len(ORDER)))
    return ", ".join(f"{name};dur={ms:.1f}" for name, ms in named)
