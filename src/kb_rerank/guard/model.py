"""A dedicated injection model, pluggable as the reranker is: a folder holding a Hugging Face
sequence-classification checkpoint (Meta's Llama Prompt Guard 2, mDeBERTa-v2; ProtectAI's
deberta-v3-base-prompt-injection-v2, DeBERTa-v2; any model with a label for injection), named
by ``KB_GUARD_MODEL`` and run in torch (the ``rerank`` extra) on the CPU or the first GPU.

Its vote joins the verdict (:func:`kb_rerank.guard.verdict.decide`: ``model_p=<p>``,
``fired:model``) at the threshold ``kb-rerank guard calibrate`` writes beside the model
(:data:`THRESHOLD_FILE`), chosen on ordinary text for the ordinary false-positive target in
every language and kind (:func:`calibrate`). A folder without that file is refused: an
uncalibrated injection model's default cut (0.5) flags ordinary documentation in the percents.

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


class InjectionModel:
    """The checkpoint in ``folder``, loaded once (:meth:`load`), scoring texts in batches."""

    def __init__(self, folder: Path | str, *, max_length: int = 512, batch_size: int = 16,
                 device: str | None = None, need_threshold: bool = True) -> None:
        self.folder = check_folder(folder)
        self.max_length = int(max_length)
        self.batch_size = int(batch_size)
        self.requested_device = device
        self.need_threshold = need_threshold
        self.calibration: Calibration | None = None
        self.label: int | None = None
        self.device: str | None = None
        self._model = self._tokenizer = self._torch = None
        self._lock = threading.Lock()

    @property
    def threshold(self) -> float:
        return 1.0 if self.calibration is None else self.calibration.threshold

    @property
    def version(self) -> str:
        """What a cache key holds of the model: its folder and calibrated threshold."""
        return f"{self.folder}@{self.threshold:.6g}"

    def load(self) -> InjectionModel:
        with self._lock:
            if self._model is not None:
                return self
            self.calibration = read_calibration(self.folder)
            if self.calibration is None and self.need_threshold:
                raise GuardModelError(f"KB_GUARD_MODEL: {str(self.folder)!r} has no {THRESHOLD_FILE}; run "
                                      f"`kb-rerank guard calibrate --model {self.folder} --ordinary CORPUS` first")
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
        return self

    def probabilities(self, texts: Sequence[str]) -> np.ndarray:
        """The injection probability of each text (its first ``max_length`` tokens)."""
        self.load()
        torch = self._torch
        out = np.zeros(len(texts), dtype=np.float64)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))  # similar lengths share a batch
        for s in range(0, len(order), self.batch_size):
            idx = order[s:s + self.batch_size]
            enc = self._tokenizer([texts[i] for i in idx], truncation=True, max_length=self.max_length,
                                  padding=True, return_tensors="pt").to(self.device)
            with torch.inference_mode():
                logits = self._model(**enc).logits.float()
            if logits.shape[-1] == 1:
                p = torch.sigmoid(logits[:, 0])
            else:
                p = torch.softmax(logits, dim=-1)[:, self.label]
            out[idx] = p.cpu().numpy()
        return out


def read_calibration(folder: Path) -> Calibration | None:
    path = Path(folder) / THRESHOLD_FILE
    if not path.is_file():
        return None
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
        cal = Calibration(**{k: d[k] for k in Calibration.__dataclass_fields__})
    except (ValueError, KeyError, TypeError) as exc:
        raise GuardModelError(f"KB_GUARD_MODEL: {str(path)!r} is not a calibration `kb-rerank guard calibrate` "
                              f"wrote ({type(exc).__name__}); run the command again") from exc
    if not (0.0 < cal.threshold <= 1.0) or not math.isfinite(cal.threshold):
        raise GuardModelError(f"KB_GUARD_MODEL: {str(path)!r} holds threshold {cal.threshold}, not in (0, 1]")
    return cal


def calibrate(model: InjectionModel, rows: Iterable[dict], target_fpr: float = 0.005,
              min_group: int = 50) -> tuple[Calibration, dict]:
    """The lowest threshold at which the model flags at most ``target_fpr`` of the ordinary
    passages ``rows`` (``{"text", "lang", "kind"}``) pooled and in every language and every
    kind of at least ``min_group`` passages; written beside the model. Returns the calibration
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
                      worst_group=worst[1], worst_fpr=round(worst[0], 5), max_length=model.max_length)
    body = {**cal.__dict__, "groups": counts, "seconds": round(time.perf_counter() - t0, 1)}
    (model.folder / THRESHOLD_FILE).write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    model.calibration = cal
    return cal, counts
