"""Cross-encoder reranking on top of FlagEmbedding's ``FlagReranker``.

Long on purpose: loading (FlagEmbedding or transformers, background load, state for
/readyz), length-sorted batching and the async scoring wrapper belong to one object.

``Reranker`` loads a cross-encoder (default used by the app:
``BAAI/bge-reranker-v2-m3``, or any local folder) through
``FlagEmbedding.FlagReranker`` and scores (query, passage) pairs with it.

Why scoring does not call ``FlagReranker.compute_score``
--------------------------------------------------------
FlagReranker already length-sorts (descending), batches and restores the input
order, so sorting in front of it would be done twice.  Instead, ``score`` uses
FlagReranker's loaded tokenizer and model and the *same* tokenization
(FlagEmbedding's ``prepare_for_model_compat``: query truncated to
``query_max_length`` -- default ``3/4 * max_length`` --, pair truncated
``only_second`` to ``max_length``, padded with ``pad_with_compat``), and runs
its own single length-sorted batch loop, because ``compute_score`` (FlagEmbedding
1.4.2) on every call:

* runs an extra "probe" forward pass over the first batch to pick a batch size
  (with 40 candidates and batch_size >= 40 that doubles the cost of a request);
* catches every ``RuntimeError`` from the model and retries with a smaller
  batch, so a real model error ends as an unrelated ``IndexError`` after
  several wasted forwards;
* prints tqdm progress bars whenever there are more pairs than ``batch_size``.

The test-suite checks that the scores are identical (1e-5) to
``FlagReranker.compute_score(..., normalize=True)``.

Threading model
---------------
``score`` is synchronous and serialised by a lock.  ``ascore`` / ``aload`` run
on a dedicated single-worker ``ThreadPoolExecutor`` owned by the Reranker, so
inference never blocks the event loop and at most one forward pass runs at a
time; torch's intra-op thread pool is left as configured for the process
(torch propagates ``torch.set_num_threads`` to the worker thread).  A request
that times out raises ``RerankerTimeout`` immediately; if its forward pass had
already started it still runs to completion on the worker (a thread cannot be
interrupted), so later requests queue behind it, and their own timeout covers
that queueing.

The rerank budget
-----------------
``ascore_until(query, passages, deadline)`` scores as many passages as fit before
``deadline`` (``time.monotonic()``), in the order given (the fused order): one batch at a
time, each sized by :class:`~kb_rerank.models.forward_cost.ForwardCost` (calibrated at load,
kept current from every batch) so that it ends before the deadline; no batch starts that would
not. After each batch the request goes to the back of the worker's queue, so concurrent
requests take turns batch by batch (one tenant's request delays another's by at most one
batch) and a request whose deadline passed while it waited does no work at all. It returns the
scores of the prefix it reached. A torch batch cannot be interrupted, so a request overshoots
its deadline by at most the error of one batch's estimate; ONNX Runtime's run is terminated at
the deadline (``RunOptions.terminate``: :mod:`.onnx`), its pairs left unscored.

torch / transformers / FlagEmbedding are imported lazily in ``load`` so that
importing this module is cheap.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from kb_rerank.models.forward_cost import ForwardCost

__all__ = [
    "DEFAULT_RERANK_MODEL",
    "Reranker",
    "RerankerError",
    "RerankerTimeout",
    "RerankerUnavailable",
    "BatchTerminated",
    "plan_batches",
]

log = logging.getLogger(__name__)

DEFAULT_RERANK_MODEL = "BAAI/bge-reranker-v2-m3"

State = Literal["not_loaded", "loading", "ready", "failed"]


class RerankerError(RuntimeError):
    """Scoring failed (model error, non-finite score, ...)."""


class RerankerUnavailable(RerankerError):
    """The model is not loaded (never loaded, load failed, or closed)."""


class RerankerTimeout(RerankerError):
    """``ascore`` did not finish within its timeout."""


class BatchTerminated(RerankerError):
    """A forward pass was stopped at its deadline (ONNX Runtime's ``RunOptions.terminate``)."""


class _Job:
    """One budgeted request on the worker: its pairs, its deadline and how far it got."""

    def __init__(self, query: str, passages: list[str], deadline: float) -> None:
        self.query, self.passages, self.deadline = query, passages, deadline
        self.encoded: list[dict] | None = None
        self.lengths: list[int] = []
        self.scores: list[float] = []
        self.abandoned = False  # the request stopped waiting (its hard timeout)
        self.future: concurrent.futures.Future = concurrent.futures.Future()


def plan_batches(lengths: Sequence[int], batch_size: int, *, sort_by_length: bool = True) -> list[list[int]]:
    """Split indices ``0..n-1`` into batches of at most ``batch_size``.

    With ``sort_by_length`` the indices are ordered by decreasing length first
    (stable), so each batch holds similar lengths and padding is minimal; the
    longest batch runs first, so peak memory is reached (and fails) early.
    Callers put the results back by index, restoring input order.
    """
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    order = list(range(len(lengths)))
    if sort_by_length:
        order.sort(key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 600 else text[:597] + "..."


def _looks_like_path(model: str) -> bool:
    return (
        model.startswith(("/", "./", "../", "~", ".\\", "..\\"))
        or (len(model) > 2 and model[1] == ":" and model[2] in "\\/")
        or os.path.exists(model)
    )


class Reranker:
    """A cross-encoder that returns relevance scores in [0, 1] (sigmoid of the logit).

    ``model`` is a Hugging Face hub id (resolved from the local HF cache; set
    ``HF_HUB_OFFLINE=1`` where nothing may be downloaded) or a local folder.
    ``device=None`` picks ``cuda:0`` when CUDA is available, else ``cpu``;
    fp16 is used only on CUDA.  Nothing is loaded until ``load``/``aload``/
    ``ensure_loaded_async`` is called.
    """

    backend = "flag"  # /readyz names it (KB_RERANKER_BACKEND)

    def __init__(
        self,
        model: str,
        *,
        max_length: int = 512,
        batch_size: int = 32,
        device: str | None = None,
        timeout_s: float = 30.0,
        query_max_length: int | None = None,
        unit_ms: float = 50.0,
    ) -> None:
        if max_length < 8:
            raise ValueError("max_length must be >= 8")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self._model_name = str(model)
        self.max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.query_max_length = int(query_max_length) if query_max_length is not None else self.max_length * 3 // 4
        self.requested_device = device
        self.timeout_s = timeout_s
        self.unit_ms = float(unit_ms)  # the longest one budgeted batch may take (KB_RERANK_UNIT_MS)

        # Filled by load().
        self.device: str | None = None
        self.fp16 = False
        self.load_seconds: float | None = None
        self.torch_threads: int | None = None
        self._flag: Any = None
        self._tokenizer: Any = None
        self._model: Any = None
        self._torch: Any = None
        self._prepare: Any = None
        self._pad: Any = None

        self._state: State = "not_loaded"
        self._last_error: str | None = None
        self._last_attempt: float | None = None  # time.monotonic() of last load start
        self._closed = False

        # Counters (read freely; written under _infer_lock / _load_lock).
        self.calls = 0  # score invocations that reached the model
        self.pairs_scored = 0
        self.batches = 0  # forward passes run for those calls
        self.timeouts = 0
        self.errors = 0
        self.load_attempts = 0
        self.terminated = 0  # forward passes stopped at their deadline (ONNX)
        self.budget_stops = 0  # budgeted requests that ended with pairs unscored
        self.cost = ForwardCost(max_length=self.max_length)  # calibrated by load()

        self._load_lock = threading.Lock()
        self._infer_lock = threading.Lock()
        self._future_lock = threading.Lock()
        self._load_future: concurrent.futures.Future | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kb-rerank")

    # ------------------------------------------------------------------ state
    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def state(self) -> State:
        return self._state

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def ready(self) -> bool:
        return self._state == "ready"

    @property
    def flag_reranker(self) -> Any:
        """The underlying ``FlagEmbedding.FlagReranker`` (None until loaded)."""
        return self._flag

    def info(self) -> dict[str, Any]:
        """A JSON-able snapshot for health endpoints and metrics."""
        return {
            "model": self._model_name,
            "state": self._state,
            "last_error": self._last_error,
            "device": self.device,
            "fp16": self.fp16,
            "max_length": self.max_length,
            "query_max_length": self.query_max_length,
            "batch_size": self.batch_size,
            "timeout_s": self.timeout_s,
            "load_seconds": self.load_seconds,
            "load_attempts": self.load_attempts,
            "torch_threads": self.torch_threads,
            "calls": self.calls,
            "pairs_scored": self.pairs_scored,
            "batches": self.batches,
            "timeouts": self.timeouts,
            "errors": self.errors,
            "terminated": self.terminated,
            "budget_stops": self.budget_stops,
            "forward_cost": self.cost.snapshot(),
        }

    def __repr__(self) -> str:
        return f"Reranker({self._model_name!r}, state={self._state!r}, device={self.device!r})"

    # ------------------------------------------------------------------ loading
    def load(self) -> None:
        """Load the model (blocking).  No-op when already ready.

        Raises ``RerankerUnavailable`` (with the cause chained and summarised
        in ``last_error``) when it fails; ``state`` is then ``"failed"``.
        """
        if self._closed:
            raise RerankerUnavailable("reranker is closed")
        with self._load_lock:
            if self._state == "ready":
                return
            self._state = "loading"
            self._last_attempt = time.monotonic()
            self.load_attempts += 1
            t0 = time.perf_counter()
            try:
                self._load_model()
                self._calibrate()
            except BaseException as exc:
                self._flag = self._model = self._tokenizer = None
                self._state = "failed"
                self._last_error = _describe(exc)
                log.warning("reranker %r failed to load: %s", self._model_name, self._last_error)
                if not isinstance(exc, Exception):
                    raise
                raise RerankerUnavailable(
                    f"cannot load reranker model {self._model_name!r}: {self._last_error}"
                ) from exc
            self.load_seconds = time.perf_counter() - t0
            self._last_error = None
            self._state = "ready"
            log.info(
                "reranker %r ready on %s (fp16=%s) in %.1fs",
                self._model_name, self.device, self.fp16, self.load_seconds,
            )

    def _load_model(self) -> None:
        if _looks_like_path(self._model_name):
            folder = Path(self._model_name).expanduser()
            if not folder.exists():
                raise FileNotFoundError(f"model folder {str(folder)!r} does not exist")
            if not folder.is_dir():
                raise NotADirectoryError(f"model path {str(folder)!r} is not a folder")
            name = str(folder)
        else:
            name = self._model_name

        from kb_rerank.core.extras import require

        require("FlagEmbedding", "rerank", "the cross-encoder")  # an error naming the extra when absent
        import torch
        from FlagEmbedding import FlagReranker
        from FlagEmbedding.utils.tokenizer_compat import pad_with_compat, prepare_for_model_compat

        device = self.requested_device
        if device is None:
            device = "cuda:0" if torch.cuda.is_available() else "cpu"
        fp16 = device.startswith("cuda") and torch.cuda.is_available()

        flag = FlagReranker(
            name,
            use_fp16=fp16,
            devices=[device],  # one device: never FlagReranker's multi-process pool
            batch_size=self.batch_size,
            max_length=self.max_length,
            query_max_length=self.query_max_length,
            normalize=True,
        )
        num_labels = getattr(flag.model.config, "num_labels", 1)
        if num_labels != 1:
            raise ValueError(f"expected a cross-encoder with num_labels=1, got num_labels={num_labels}")
        model = flag.model
        if fp16:
            model.half()
        model.to(device)
        model.eval()

        self._torch = torch
        self._prepare = prepare_for_model_compat
        self._pad = pad_with_compat
        self._flag, self._model, self._tokenizer = flag, model, self._quiet(flag.tokenizer)
        self.device, self.fp16 = device, fp16
        self.torch_threads = torch.get_num_threads()
        self._smoke_test()

    @staticmethod
    def _quiet(tokenizer: Any) -> Any:
        """Padding pre-tokenized pairs is intended (needed to length-sort): silence
        transformers' one-time "use __call__ instead of pad" advice."""
        warnings_map = getattr(tokenizer, "deprecation_warnings", None)
        if isinstance(warnings_map, dict):
            warnings_map["Asking-to-pad-a-fast-tokenizer"] = True
        return tokenizer

    def _smoke_test(self) -> None:
        """A model that cannot run must not be reported "ready"."""
        batches = self.batches
        warm = self._compute_logits("warm up", ["warm up"])
        self.batches = batches
        if len(warm) != 1 or not math.isfinite(warm[0]):
            raise RerankerError(f"model smoke test returned {warm!r}")

    def _calibrate(self) -> None:
        """The forward cost at the configured length (:class:`ForwardCost`): one pair, then a
        batch of up to four, each timed twice after a warm-up (the faster of the two)."""
        batches, n = self.batches, min(4, self.batch_size)
        filler = " ".join(["calibration"] * self.max_length)
        encoded = self._encode("calibration query", [filler] * n)
        length = max(len(e["input_ids"]) for e in encoded)

        def best(features: list[dict]) -> float:
            self._run_batch(features)
            times = []
            for _ in range(2):
                t = time.perf_counter()
                self._run_batch(features)
                times.append((time.perf_counter() - t) * 1000.0)
            return min(times)

        one = best(encoded[:1])
        self.cost.calibrate(one, best(encoded) if n > 1 else one, n, length)
        self.batches = batches
        log.info("reranker %r forward cost: %s", self._model_name, self.cost.snapshot())

    def _submit_load(self) -> concurrent.futures.Future:
        with self._future_lock:
            fut = self._load_future
            if fut is None or fut.done():
                if self._closed:
                    raise RerankerUnavailable("reranker is closed")
                fut = self._executor.submit(self.load)
                self._load_future = fut
            return fut

    async def aload(self) -> None:
        """``load`` on the reranker's worker thread (joins a load already in flight)."""
        if self._state == "ready":
            return
        await asyncio.shield(asyncio.wrap_future(self._submit_load()))

    async def ensure_loaded_async(self, retry_after_s: float = 30.0) -> bool:
        """Make sure the model is loaded; returns whether it is ready.  Never raises
        for load failures.

        A failed load is retried at most once every ``retry_after_s`` seconds
        (measured from the start of the previous attempt); in between this
        returns ``False`` at once, so callers keep serving their fallback
        ordering.  Awaits the load when one is started or already in flight; to
        load in the background use ``asyncio.create_task(...)``.
        """
        if self._state == "ready":
            return True
        if self._closed:
            return False
        fut = self._load_future
        if fut is None or fut.done():
            if (
                self._state == "failed"
                and self._last_attempt is not None
                and time.monotonic() - self._last_attempt < retry_after_s
            ):
                return False
        try:
            await self.aload()
        except Exception:
            return False
        return self._state == "ready"

    def close(self) -> None:
        """Cancel queued work, wait for a running forward pass, stop the worker
        thread and drop the model.  Further calls raise ``RerankerUnavailable``."""
        self._closed = True
        self._executor.shutdown(wait=True, cancel_futures=True)
        with self._infer_lock, self._load_lock:
            self._flag = self._model = self._tokenizer = None
            if self._state != "failed":
                self._state = "not_loaded"

    def __enter__(self) -> Reranker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ scoring
    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        """One score in [0, 1] per passage, in input order (blocking).

        Empty ``passages`` -> ``[]`` without touching the model.  Raises
        ``RerankerUnavailable`` when not loaded and ``RerankerError`` when the
        model raises or produces a non-finite score.
        """
        passages = list(passages)
        if not passages:
            return []
        if not isinstance(query, str) or not all(isinstance(p, str) for p in passages):
            raise TypeError("query and passages must be str")
        if self._state != "ready":
            raise RerankerUnavailable(
                f"reranker {self._model_name!r} is not ready (state={self._state}"
                + (f", last_error={self._last_error}" if self._last_error else "")
                + ")"
            )
        with self._infer_lock:
            if self._model is None:
                raise RerankerUnavailable("reranker is closed")
            self.calls += 1
            self.pairs_scored += len(passages)
            try:
                logits = self._compute_logits(query, passages)
            except Exception as exc:
                self.errors += 1
                raise RerankerError(f"cross-encoder inference failed: {_describe(exc)}") from exc
            if len(logits) != len(passages):
                self.errors += 1
                raise RerankerError(f"model returned {len(logits)} scores for {len(passages)} passages")
            bad = [i for i, x in enumerate(logits) if not math.isfinite(x)]
            if bad:
                self.errors += 1
                raise RerankerError(
                    f"model returned {len(bad)} non-finite score(s) (first at passage {bad[0]}: {logits[bad[0]]})"
                )
        return [_sigmoid(x) for x in logits]

    async def ascore(self, query: str, passages: Sequence[str], *, timeout_s: float | None = None) -> list[float]:
        """``score`` on the reranker's worker thread, bounded by ``timeout_s``
        (default: the constructor's; ``<= 0`` disables it), which includes time
        spent queued behind other requests.  Raises ``RerankerTimeout``."""
        passages = list(passages)
        if not passages:
            return []
        if self._closed:
            raise RerankerUnavailable("reranker is closed")
        if self._state != "ready":
            raise RerankerUnavailable(f"reranker {self._model_name!r} is not ready (state={self._state})")
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            cfut = self._executor.submit(self.score, query, passages)
        except RuntimeError as exc:  # executor shut down concurrently
            raise RerankerUnavailable("reranker is closed") from exc
        try:
            return await asyncio.wait_for(asyncio.wrap_future(cfut), limit if limit and limit > 0 else None)
        except TimeoutError:
            cfut.cancel()  # drops it if still queued; a running pass finishes in the background
            self.timeouts += 1
            raise RerankerTimeout(
                f"reranking {len(passages)} passages did not finish within {limit:g}s"
            ) from None

    async def ascore_until(self, query: str, passages: Sequence[str], deadline: float, *,
                           timeout_s: float | None = None) -> list[float]:
        """Scores in [0, 1] of the first ``k`` passages (input order), ``k`` being as many as
        the model can score before ``deadline`` (``time.monotonic()``): see "The rerank
        budget" above. ``timeout_s`` (default: the constructor's) stays the hard cap."""
        passages = list(passages)
        if not passages:
            return []
        if not isinstance(query, str) or not all(isinstance(p, str) for p in passages):
            raise TypeError("query and passages must be str")
        if self._closed:
            raise RerankerUnavailable("reranker is closed")
        if self._state != "ready":
            raise RerankerUnavailable(f"reranker {self._model_name!r} is not ready (state={self._state})")
        job = _Job(query, passages, deadline)
        try:
            self._executor.submit(self._step, job)
        except RuntimeError as exc:  # executor shut down concurrently
            raise RerankerUnavailable("reranker is closed") from exc
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)),
                                          limit if limit and limit > 0 else None)
        except TimeoutError:
            job.abandoned = True
            self.timeouts += 1
            raise RerankerTimeout(f"reranking {len(passages)} passages did not finish within {limit:g}s") from None
        except asyncio.CancelledError:
            job.abandoned = True
            raise

    def _step(self, job: _Job) -> None:
        """One batch of ``job`` on the worker thread, then back to the end of the queue."""
        try:
            finished = self._advance(job)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
            if not job.future.done():
                job.future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        if finished:
            if not job.future.done():
                job.future.set_result(list(job.scores))
            return
        try:
            self._executor.submit(self._step, job)
        except RuntimeError:  # closed meanwhile: what was scored is still an answer
            job.future.set_result(list(job.scores))

    def _advance(self, job: _Job) -> bool:
        """Score the next batch that fits before the deadline; True when the job is over."""
        if job.abandoned:
            return True
        with self._infer_lock:
            if self._model is None:
                raise RerankerUnavailable("reranker is closed")
            if job.encoded is None:
                self.calls += 1
                job.encoded = self._encode(job.query, job.passages)
                job.lengths = [len(e["input_ids"]) for e in job.encoded]
            done = len(job.scores)
            left_ms = (job.deadline - time.monotonic()) * 1000.0
            n = self.cost.fit(job.lengths[done:], left_ms, self.batch_size)
            if n > 1:  # a turn is at most one unit: then the next request's batch
                n = min(n, max(1, self.cost.fit(job.lengths[done:], self.unit_ms, self.batch_size)))
            if n == 0:
                self.budget_stops += 1
                return True
            try:
                logits = self._timed_batch(job.encoded[done:done + n], deadline=job.deadline)
            except BatchTerminated:
                self.terminated += 1
                self.budget_stops += 1
                return True
            except Exception as exc:
                self.errors += 1
                raise RerankerError(f"cross-encoder inference failed: {_describe(exc)}") from exc
            if len(logits) != n or not all(math.isfinite(x) for x in logits):
                self.errors += 1
                raise RerankerError(f"model returned {logits!r} for a batch of {n}")
            self.pairs_scored += n
            self.batches += 1
            job.scores.extend(_sigmoid(x) for x in logits)
        if len(job.scores) >= len(job.passages):
            return True
        if time.monotonic() >= job.deadline:
            self.budget_stops += 1
            return True
        return False

    def _timed_batch(self, features: list[dict], *, deadline: float | None = None) -> list[float]:
        """``_run_batch`` timed into the forward cost."""
        t = time.perf_counter()
        logits = self._run_batch(features, deadline=deadline)
        self.cost.observe(len(features), max(len(f["input_ids"]) for f in features),
                          (time.perf_counter() - t) * 1000.0)
        return logits

    # ------------------------------------------------------------------ internals
    def _encode(self, query: str, passages: Sequence[str]) -> list[dict]:
        """Tokenize each pair exactly like ``FlagReranker.compute_score`` (unpadded)."""
        tok = self._tokenizer
        q_ids = tok([query], return_tensors=None, add_special_tokens=False,
                    max_length=self.query_max_length, truncation=True)["input_ids"][0]
        p_ids = tok(list(passages), return_tensors=None, add_special_tokens=False,
                    max_length=self.max_length, truncation=True)["input_ids"]
        return [
            self._prepare(tok, q_ids, d_ids, truncation="only_second", max_length=self.max_length, padding=False)
            for d_ids in p_ids
        ]

    def _forward(self, encoded: list[dict], batches: list[list[int]]) -> list[float]:
        """Raw logits, in the order of ``encoded``, running one forward per batch."""
        out = [math.nan] * len(encoded)
        for idx in batches:
            logits = self._timed_batch([encoded[i] for i in idx])
            if len(logits) != len(idx):
                raise RerankerError(f"model returned {len(logits)} logits for a batch of {len(idx)}")
            for i, x in zip(idx, logits):
                out[i] = x
            self.batches += 1
        return out

    def _run_batch(self, features: list[dict], *, deadline: float | None = None) -> list[float]:
        """One forward pass over a batch of unpadded encodings: pad, run, logits as floats.
        The only engine-specific step of scoring (ONNX Runtime: models/onnx.py). torch cannot
        stop a forward pass: ``deadline`` is not used here (the batch was sized to end before it)."""
        torch = self._torch
        inputs = self._pad(self._tokenizer, features, padding=True, return_tensors="pt")
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        with torch.inference_mode():
            return self._model(**inputs, return_dict=True).logits.view(-1).float().cpu().tolist()

    def _compute_logits(self, query: str, passages: Sequence[str]) -> list[float]:
        """Raw logits in input order: tokenize, length-sort, batch, restore order."""
        encoded = self._encode(query, passages)
        batches = plan_batches([len(e["input_ids"]) for e in encoded], self.batch_size)
        return self._forward(encoded, batches)
