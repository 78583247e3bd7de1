"""What one forward pass of the cross-encoder costs here, measured: the basis of the rerank
budget (``KB_RERANK_BUDGET_MS``) and of a pair's price in the tenant's bucket.

A batch of ``n`` pairs padded to ``L`` tokens costs ``fixed_ms + ms_per_token * n * L``
(a forward's own overhead plus the work on its padded tokens). Both are calibrated when the
model loads, on dummy pairs at the configured length (one pair, then a batch of up to four:
two points of the line), and the per-token rate is kept current from every live batch (an
exponentially weighted mean), so a machine that slows down, or a model that runs faster on
short passages than the calibration at full length said, moves the estimate within a few
batches. Calibrating at full length is on the safe side: attention grows faster than
linearly with length, so the line drawn at full length over-estimates shorter batches.

:meth:`ForwardCost.fit` is the planning rule of the budget: the largest next batch, in the
given order, whose estimate ends before the time that is left. Hand-written: no library
models a forward pass's cost for a deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

__all__ = ["ForwardCost"]

SMOOTHING = 0.3  # weight of the newest batch in the per-token rate and the typical length


class ForwardCost:
    """The measured cost of a forward pass (thread-safe: the model's worker writes it, the
    request path reads it)."""

    def __init__(self, fixed_ms: float = 0.0, ms_per_token: float = 0.0, *, max_length: int = 512) -> None:
        self.fixed_ms = max(0.0, float(fixed_ms))
        self.ms_per_token = max(0.0, float(ms_per_token))
        self.max_length = int(max_length)
        self.calibrated = ms_per_token > 0
        self.observed = 0  # live batches folded into the rate
        # the padded length of live batches (mean, weighted like the rate): what a pair is priced at
        self.typical_length = float(self.max_length)
        self._lock = threading.Lock()

    def calibrate(self, one_ms: float, batch_ms: float, batch: int, length: int) -> None:
        """The line through (1 pair, ``one_ms``) and (``batch`` pairs, ``batch_ms``), both padded
        to ``length`` tokens. With ``batch == 1`` (or a batch no dearer than one pair) the
        whole time is taken as per-token work."""
        with self._lock:
            if batch > 1 and batch_ms > one_ms:
                per_token = (batch_ms - one_ms) / ((batch - 1) * length)
                fixed = max(0.0, one_ms - per_token * length)
            else:
                per_token, fixed = max(one_ms, batch_ms / max(1, batch)) / length, 0.0
            self.ms_per_token, self.fixed_ms = max(per_token, 1e-9), fixed
            self.calibrated = True
            self.observed, self.typical_length = 0, float(self.max_length)  # live batches from now on

    def observe(self, pairs: int, padded_length: int, ms: float) -> None:
        """A live batch of ``pairs`` padded to ``padded_length`` took ``ms``."""
        tokens = pairs * padded_length
        if tokens <= 0 or ms < 0:
            return
        sample = max(ms - self.fixed_ms, 0.0) / tokens
        with self._lock:
            self.ms_per_token = sample if not self.calibrated else (
                (1 - SMOOTHING) * self.ms_per_token + SMOOTHING * sample)
            self.typical_length = (padded_length if not self.observed else
                                   (1 - SMOOTHING) * self.typical_length + SMOOTHING * padded_length)
            self.calibrated = True
            self.observed += 1

    def estimate(self, pairs: int, padded_length: int) -> float:
        """Milliseconds a batch of ``pairs`` padded to ``padded_length`` tokens should take."""
        if pairs <= 0:
            return 0.0
        return self.fixed_ms + self.ms_per_token * pairs * padded_length

    def ms_per_pair(self, length: float | None = None) -> float:
        """One pair's share of a batch of eight at ``length`` tokens (default: the padded length
        of live batches, the configured length until there are some): what the rate limiter
        charges for a pair, and what a miss's reservation counts on."""
        length = self.typical_length if length is None else length
        return self.ms_per_token * length + self.fixed_ms / 8  # the fixed cost shared by a batch of eight

    def pairs_within(self, ms: float, length: int | None = None) -> int:
        """How many pairs at ``length`` tokens fit in ``ms`` (at least one)."""
        per = self.ms_per_pair(length)
        return max(1, int(ms // per)) if per > 0 else 1 << 30

    def fit(self, lengths: Sequence[int], left_ms: float, cap: int) -> int:
        """How many of ``lengths`` (the next pairs, in order) to send in one batch: the most,
        at most ``cap``, whose estimate ends within ``left_ms``; 0 when not even one fits."""
        n, longest = 0, 0
        for length in lengths[:cap]:
            longest = max(longest, length)
            if self.estimate(n + 1, longest) > left_ms:
                break
            n += 1
        return n

    def snapshot(self) -> dict[str, float | int | bool]:
        return {"fixed_ms": round(self.fixed_ms, 3), "ms_per_token": round(self.ms_per_token, 6),
                "ms_per_pair": round(self.ms_per_pair(), 3), "typical_length": round(self.typical_length, 1),
                "calibrated": self.calibrated,
                "observed_batches": self.observed}
