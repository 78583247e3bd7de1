"""What the request runner reports (:class:`PipelineMetrics`, a no-op); the HTTP layer subclasses it
with Prometheus metrics (:class:`kb_rerank.http.telemetry.ApiMetrics`)."""

from __future__ import annotations


class PipelineMetrics:
    """What the pipeline reports; the HTTP layer gives it Prometheus metrics. No-op here."""

    def cache_hit(self, source: str) -> None: ...

    def cache_miss(self, source: str) -> None: ...

    def fallback(self, source: str, reason: str) -> None: ...

    def partial(self, source: str, reason: str) -> None:
        """An answer the model ranked only in part (``reason``: "budget")."""

    def model_call(self, seconds: float, pairs: int) -> None: ...

    def pair_scores(self, cached: int, scored: int) -> None:
        """A served (non-fallback) answer: ``cached`` pair scores came from the pair cache,
        ``scored`` were computed by the model."""

    def served(self, source: str, seconds: float) -> None:
        """A request of ``source`` answered (hit or miss) in ``seconds``."""
