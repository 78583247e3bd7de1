"""Per-request stage timings, answered in the standard ``Server-Timing`` header (the
playground shows them; browsers' developer tools do too): ``cache`` (the result-cache
lookup), ``embed`` (query and passage embeddings), ``retrieve`` (the candidate search),
``guard`` (the /v2/rerank detectors), ``rerank`` (the cross-encoder, with its queue),
``record`` (cache write and audit row), ``total`` (the whole handler).

:func:`start` / :func:`stop` are called by the HTTP layer around each request; :func:`stage` adds a stage's
wall time to the request's dict. Outside a request (benchmarks, tests calling the pipeline
directly) nothing is recorded. A stage that runs more than once (two embeddings) adds up.
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar, Token
from typing import Iterator

_STAGES: ContextVar[dict[str, float] | None] = ContextVar("kb_rerank_stage_ms", default=None)


def start() -> tuple[Token, dict[str, float]]:
    """A new (empty) record for the current request, filled by the stages; give the token
    to :func:`stop` when the request ends."""
    stages: dict[str, float] = {}
    return _STAGES.set(stages), stages


def stop(token: Token) -> None:
    _STAGES.reset(token)


@contextlib.contextmanager
def stage(name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        stages = _STAGES.get()
        if stages is not None:
            stages[name] = stages.get(name, 0.0) + (time.perf_counter() - t0) * 1000.0


def server_timing(stages: dict[str, float]) -> str:
    """``Server-Timing`` value: ``cache;dur=1.2, retrieve;dur=3.4, ...`` in milliseconds."""
    return ", ".join(f"{name};dur={ms:.1f}" for name, ms in stages.items())
