"""A dedicated injection model, pluggable as the reranker is: a folder holding a Hugging Face
sequence-classification checkpoint (Meta's Llama Prompt Guard 2, mDeBERTa-v2; ProtectAI's
deberta-v3-base-prompt-injection-v2, DeBERTa-v2; any model with a label for injection), named
by ``KB_GUARD_MODEL``, run by the backend ``KB_GUARD_MODEL_BACKEND`` names:

* ``torch``: the checkpoint itself (the ``rerank`` extra) on the CPU or the first GPU;
* ``onnx-int8``: its dynamic int8 ONNX export, which ``kb-rerank guard export``
  (:func:`export_int8`) writes into the folder's :data:`ONNX_DIR` with the tokenizer and config,
  run by ONNX Runtime (the ``onnx`` extra) through the cross-encoder's session and deadline code
  (:func:`kb_rerank.models.onnx.open_session`, :func:`~kb_rerank.models.onnx.run_until`).

Its vote joins the verdict (:func:`kb_rerank.guard.verdict.decide`: ``model_p=<p>``,
``fired:model``) at the threshold ``kb-rerank guard calibrate`` writes beside the backend's
files (:data:`THRESHOLD_FILE` in the folder for torch, in :data:`ONNX_DIR` for int8: an int8
model's scores differ from its fp32 ones, so each backend is calibrated on its own), chosen
on ordinary text for the ordinary false-positive target in every language and kind
(:func:`calibrate`). A backend without its calibration is refused: an uncalibrated injection
model's default cut (0.5) flags ordinary documentation in the percents.

Which output is "injection": the label named like one (``INJECTION``, ``MALICIOUS``,
``JAILBREAK``, ``UNSAFE``) in the checkpoint's ``id2label``, else label 1 of two; the
probability is that label's softmax share (a one-logit model: its sigmoid).
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

THRESHOLD_FILE = "kb_guard_threshold.json"
BACKENDS = ("torch", "onnx-int8")
ONNX_DIR = "onnx-int8"  # inside the model folder: what `kb-rerank guard export` writes
ONNX_FILE = "model.onnx"
_INJECTION_LABEL = re.compile(r"inject|malicious|jailbreak|unsafe|attack", re.IGNORECASE)


class GuardModelError(ValueError):
    """The folder is not a usable injection model (the message says why, in plain words)."""


def injection_label(id2label: dict, num_labels: int) -> int:
    """The index of the injection label: the one named like an attack, else 1 of two (0 of one)."""
    named = [int(i) for i, name in (id2label or {}).items() if _INJECTION_LABEL.search(str(name))]
    if len(named) == 1:
        return named[0]
    if num_labels in (1, 2):
        return num_labels - 1
    raise GuardModelError(f"the model has {num_labels} labels ({sorted((id2label or {}).values())}) and none "
                          "is named like injection (INJECTION, MALICIOUS, JAILBREAK, UNSAFE)")


def check_folder(folder: Path | str) -> Path:
    """``folder`` as a checkpoint folder, or a :class:`GuardModelError` naming what is wrong."""
    p = Path(folder).expanduser()
    if not p.exists():
        raise GuardModelError(f"KB_GUARD_MODEL: the folder {str(p)!r} does not exist")
    if not p.is_dir():
        raise GuardModelError(f"KB_GUARD_MODEL: {str(p)!r} is not a folder")
    if not (p / "config.json").is_file():
        raise GuardModelError(f"KB_GUARD_MODEL: {str(p)!r} has no config.json: not a Hugging Face checkpoint folder")
    return p


@dataclass(frozen=True)
class Calibration:
    threshold: float
    target_fpr: float
    passages: int
    flagged: int
    worst_group: str
    worst_fpr: float
    max_length: int
    backend: str = "torch"


class InjectionModel:
    """The checkpoint in ``folder``, loaded once (:meth:`load`) by ``backend`` (:data:`BACKENDS`),
    scoring texts in forward passes of ``batch_size``. ``threads``: ONNX Runtime's intra-op
    threads (``onnx-int8``; 0: its default).

    The int8 backend reads one text a pass: dynamic int8 quantises a pass's activations with one
    scale over all its texts and their padding, so in passes of several a text's score moves
    with its companions (on the tiny test model by as much as 0.86, enough to flip verdicts at the
    calibrated threshold), and a chunk could get one verdict at ingestion and another in
    ``/v2/rerank``; bench/results/guard-model-cost.md measures both and what passes of 8 would save.
    ``int8_batches=True`` lifts this for the benchmark that measures it."""

    def __init__(self, folder: Path | str, *, max_length: int = 512, batch_size: int = 8,
                 device: str | None = None, need_threshold: bool = True, backend: str = "torch",
                 threads: int = 0, int8_batches: bool = False) -> None:
        if backend not in BACKENDS:
            raise GuardModelError(f"KB_GUARD_MODEL_BACKEND: {backend!r} is not one of {', '.join(BACKENDS)}")
        self.folder = check_folder(folder)
        self.backend = backend
        self.max_length = int(max_length)
        self.batch_size = 1 if backend == "onnx-int8" and not int8_batches else max(1, int(batch_size))
        self.requested_device = device
        self.threads = int(threads)
        self.need_threshold = need_threshold
        self.calibration: Calibration | None = None
        self.label: int | None = None
        self.device: str | None = None
        self._model = self._tokenizer = self._torch = None
        self._lock = threading.Lock()

    @property
    def files(self) -> Path:
        """The folder of this backend's files and calibration (the checkpoint's, or its export's)."""
        return self.folder if self.backend == "torch" else self.folder / ONNX_DIR

    @property
    def threshold(self) -> float:
        return 1.0 if self.calibration is None else self.calibration.threshold

    @property
    def version(self) -> str:
        """What a cache key holds of the model: its folder, backend and calibrated threshold."""
        return f"{self.folder}[{self.backend}]@{self.threshold:.6g}"

    def load(self) -> InjectionModel:
        with self._lock:
            if self._model is not None:
                return self
            if self.backend == "onnx-int8":
                check_export(self.folder)
            self.calibration = read_calibration(self.files, self.backend)
            if self.calibration is None and self.need_threshold:
                extra = "" if self.backend == "torch" else f" --backend {self.backend}"
                raise GuardModelError(f"KB_GUARD_MODEL: {str(self.files)!r} has no {THRESHOLD_FILE} (backend "
                                      f"{self.backend}); run `kb-rerank guard calibrate --model {self.folder}{extra} "
                                      "--ordinary CORPUS` first")
            if self.backend == "torch":
                self._load_torch()
            else:
                self._load_onnx()
        return self

    def _load_torch(self) -> None:
        from kb_rerank.core.extras import require

        require("transformers", "rerank", "the injection model")
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        try:
            tokenizer = AutoTokenizer.from_pretrained(str(self.folder))
            model = AutoModelForSequenceClassification.from_pretrained(str(self.folder))
        except (OSError, ValueError, KeyError) as exc:
            raise GuardModelError(f"KB_GUARD_MODEL: cannot load {str(self.folder)!r} as a sequence-classification "
                                  f"checkpoint: {type(exc).__name__}: {str(exc)[:300]}") from exc
        self.label = injection_label(getattr(model.config, "id2label", {}), int(model.config.num_labels))
        device = self.requested_device or ("cuda:0" if torch.cuda.is_available() else "cpu")
        model.to(device).eval()
        self._torch, self._tokenizer, self._model, self.device = torch, tokenizer, model, device

    def _load_onnx(self) -> None:
        from kb_rerank.core.extras import require

        require("onnxruntime", "onnx", "the injection model's int8 backend")
        from transformers import AutoTokenizer

        from kb_rerank.models.onnx import open_session

        path = self.files / ONNX_FILE
        try:
            session = open_session(path, self.threads)
            tokenizer = AutoTokenizer.from_pretrained(str(self.files))
            config = json.loads((self.files / "config.json").read_text(encoding="utf-8"))
        except Exception as exc:  # noqa: BLE001 - ONNX Runtime raises its own types for a bad file
            raise GuardModelError(f"KB_GUARD_MODEL_BACKEND=onnx-int8: cannot load {str(path)!r}: "
                                  f"{type(exc).__name__}: {str(exc)[:300]}; run `kb-rerank guard export --model "
                                  f"{self.folder} --force` again") from exc
        id2label = {int(k): v for k, v in (config.get("id2label") or {}).items()}
        width = session.get_outputs()[0].shape[-1]
        self.label = injection_label(id2label, width if isinstance(width, int) else len(id2label))
        self._input_names = [i.name for i in session.get_inputs()]
        self._tokenizer, self._model, self.device = tokenizer, session, "cpu"

    def probabilities(self, texts: Sequence[str], deadline: float | None = None) -> np.ndarray:
        """The injection probability of each text (its first ``max_length`` tokens), in forward
        passes of at most ``batch_size`` texts of similar lengths. With a ``deadline``
        (``time.monotonic()``) no pass starts after it and an ONNX pass running then is stopped:
        the texts not scored are NaN."""
        self.load()
        out = np.full(len(texts), np.nan, dtype=np.float64)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths share a batch
        for s in range(0, len(order), self.batch_size):
            if deadline is not None and time.monotonic() >= deadline:
                break
            idx = order[s:s + self.batch_size]
            batch = [texts[i] for i in idx]
            if self.backend == "torch":
                out[idx] = self._torch_batch(batch)
            else:
                from kb_rerank.models.cross_encoder import BatchTerminated

                try:
                    out[idx] = self._onnx_batch(batch, deadline)
                except BatchTerminated:
                    break
        return out

    def _torch_batch(self, batch: list[str]) -> np.ndarray:
        torch = self._torch
        enc = self._tokenizer(batch, truncation=True, max_length=self.max_length, padding=True,
                              return_tensors="pt").to(self.device)
        with torch.inference_mode():
            logits = self._model(**enc).logits.float()
        if logits.shape[-1] == 1:
            return torch.sigmoid(logits[:, 0]).cpu().numpy()
        return torch.softmax(logits, dim=-1)[:, self.label].cpu().numpy()

    def _onnx_batch(self, batch: list[str], deadline: float | None) -> np.ndarray:
        from kb_rerank.models.onnx import run_until

        enc = self._tokenizer(batch, truncation=True, max_length=self.max_length, padding=True, return_tensors="np")
        feed = {name: np.asarray(enc[name], dtype=np.int64) for name in self._input_names}
        logits = np.asarray(run_until(self._model, feed, deadline), dtype=np.float64)
        if logits.shape[-1] == 1:
            return 1.0 / (1.0 + np.exp(-logits[:, 0]))
        z = np.exp(logits - logits.max(axis=-1, keepdims=True))
        return (z / z.sum(axis=-1, keepdims=True))[:, self.label]


def check_export(folder: Path) -> Path:
    """The int8 export inside ``folder`` (:data:`ONNX_DIR`), or a :class:`GuardModelError` naming
    the setting and the command that makes it (an export without its manifest was interrupted)."""
    from kb_rerank.models.onnx import MANIFEST

    out = Path(folder) / ONNX_DIR
    if not (out / ONNX_FILE).is_file() or not (out / MANIFEST).is_file():
        raise GuardModelError(f"KB_GUARD_MODEL_BACKEND=onnx-int8: {str(folder)!r} has no complete int8 export "
                              f"({str(out / ONNX_FILE)!r}); run `kb-rerank guard export --model {folder}` first")
    return out


def export_int8(folder: Path | str, *, force: bool = False, log=print) -> Path:
    """Write the int8 ONNX version of the checkpoint in ``folder`` into ``folder``/:data:`ONNX_DIR`
    (``kb-rerank guard export``): optimum-onnx's fp32 export (to a temporary folder), then ONNX
    Runtime's dynamic int8 quantisation with this CPU's preset, the tokenizer and config beside
    it and the manifest last. An existing complete export is reused unless ``force`` (which
    also drops its calibration: the new file's scores are calibrated again)."""
    import shutil
    import tempfile

    from kb_rerank.core.extras import require
    from kb_rerank.models.onnx import MANIFEST, _copy_preprocessors, _write_manifest, export_fp32, quantize_int8

    folder = check_folder(folder)
    out = folder / ONNX_DIR
    if not force and (out / MANIFEST).is_file():
        log(f"reusing {out}")
        return out
    require("optimum.exporters.onnx", "onnx", "exporting the injection model to ONNX")
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=".onnx-fp32-", dir=folder) as tmp:
        log(f"exporting {folder} to ONNX ...")
        try:
            export_fp32(str(folder), Path(tmp))
        except Exception as exc:  # noqa: BLE001 - optimum and torch.onnx raise many types
            raise GuardModelError(f"KB_GUARD_MODEL: cannot export {str(folder)!r} to ONNX: {type(exc).__name__}: "
                                  f"{str(exc)[:300]}") from exc
        out.mkdir()
        log(f"quantizing to int8 (dynamic) in {out} ...")
        preset = quantize_int8(Path(tmp) / ONNX_FILE, out / ONNX_FILE)
        _copy_preprocessors(Path(tmp), out)
    _write_manifest(out, model=str(folder), quantize="int8", preset=preset, seconds=round(time.perf_counter() - t0, 1),
                    created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    return out


def read_calibration(folder: Path, backend: str = "torch") -> Calibration | None:
    """The calibration in ``folder`` (None: none), refused when it was made for another backend."""
    path = Path(folder) / THRESHOLD_FILE
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        cal = Calibration(**{k: d[k] for k in Calibration.__dataclass_fields__ if k in d})
    except (ValueError, KeyError, TypeError) as exc:
        raise GuardModelError(f"KB_GUARD_MODEL: {str(path)!r} is not a calibration `kb-rerank guard calibrate` "
                              f"wrote ({type(exc).__name__}); run the command again") from exc
    if not (0.0 < cal.threshold <= 1.0) or not math.isfinite(cal.threshold):
        raise GuardModelError(f"KB_GUARD_MODEL: {str(path)!r} holds threshold {cal.threshold}, not in (0, 1]")
    if cal.backend != backend:
        raise GuardModelError(f"KB_GUARD_MODEL: {str(path)!r} calibrates the {cal.backend} backend, not {backend}; "
                              f"run `kb-rerank guard calibrate --backend {backend}`")
    return cal


def calibrate(model: InjectionModel, rows: Iterable[dict], target_fpr: float = 0.005,
              min_group: int = 50) -> tuple[Calibration, dict]:
    """The lowest threshold at which the model flags at most ``target_fpr`` of the ordinary
    passages ``rows`` (``{"text", "lang", "kind"}``) pooled and in every language and every
    kind of at least ``min_group`` passages; written beside the backend's files
    (:attr:`InjectionModel.files`). Returns the calibration
    and the flagged counts per group at it."""
    rows = [r for r in rows if str(r.get("text", "")).strip()]
    if not rows:
        raise GuardModelError("no ordinary passages to calibrate on")
    t0 = time.perf_counter()
    p = model.probabilities([r["text"] for r in rows])
    groups: dict[str, np.ndarray] = {"all": np.ones(len(rows), dtype=bool)}
    for key in ("lang", "kind"):
        for g in sorted({str(r.get(key) or "") for r in rows} - {""}):
            m = np.array([str(r.get(key) or "") == g for r in rows])
            if m.sum() >= min_group:
                groups[f"{key}:{g}"] = m
    threshold = 0.0
    for m in groups.values():
        s = np.sort(p[m])[::-1]
        k = int(math.floor(target_fpr * len(s)))  # flags allowed in this group
        if k < len(s):  # the (k+1)-th highest score must stay below the threshold
            threshold = max(threshold, float(np.nextafter(s[k], np.inf)))
    threshold = min(1.0, threshold)
    counts = {g: [int((p[m] >= threshold).sum()), int(m.sum())] for g, m in groups.items()}
    worst = max(((k / n, g) for g, (k, n) in counts.items()), default=(0.0, "all"))
    cal = Calibration(threshold=threshold, target_fpr=target_fpr, passages=len(rows), flagged=counts["all"][0],
                      worst_group=worst[1], worst_fpr=round(worst[0], 5), max_length=model.max_length,
                      backend=model.backend)
    body = {**cal.__dict__, "groups": counts, "seconds": round(time.perf_counter() - t0, 1)}
    (model.files / THRESHOLD_FILE).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    model.calibration = cal
    return cal, counts
