"""The cross-encoder exported to ONNX and run by ONNX Runtime (``KB_RERANKER_BACKEND=onnx``).

Export once (``kb-rerank model export``, :func:`export_model`): optimum-onnx writes the
checkpoint as ``model.onnx`` (with its tokenizer and config) under
``<KB_RERANKER_ONNX_DIR>/<model slug>/fp32/``; with ``--quantize int8`` the fp32 graph is
first optimised with ONNX Runtime's transformer fusions (``onnxruntime.transformers.optimizer``,
BERT rules, which match XLM-RoBERTa: one ``Attention`` node per layer, ``SkipLayerNormalization``,
``BiasGelu``), then ONNX Runtime's dynamic int8 quantisation (weights int8 ahead of time,
activations quantised per batch at run time; the fused ``Attention`` becomes ``QAttention``)
writes ``.../int8/``. Quantising the unfused graph instead leaves attention as separate
``MatMul``/``Softmax`` nodes that ONNX Runtime can no longer fuse once they are quantised
(measured in ``bench/results/model_cost-backends-optimized.md``). Each folder gets
``kb-export.json`` last (the int8 one records the fusions under ``graph_optimization``), so
a folder without it (an interrupted export) is not used; an int8 folder whose manifest
predates the optimisation is quantised again (the fp32 export is reused).

:class:`OnnxReranker` is :class:`~kb_rerank.models.cross_encoder.Reranker` with a
different engine: the tokenisation (FlagEmbedding's, query and pair truncation), the
length-sorted batching, the sigmoid, the state for /readyz, the worker thread, the timeout
and the errors are the parent's code; only loading (an ``onnxruntime.InferenceSession``
over the exported folder) and running one padded batch differ. The service does not export
at load: a missing export is a failed load whose ``last_error`` says which command to run,
and requests get the usual ``model_unavailable`` fallback (exporting bge-reranker-v2-m3
takes minutes and several GB of memory, which a serving process should not do implicitly).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from kb_rerank.models.cross_encoder import BatchTerminated, Reranker, _looks_like_path

__all__ = ["QUANTIZE_CHOICES", "OnnxReranker", "export_dir_for", "export_model", "open_session", "quantize_int8",
           "run_until"]

QUANTIZE_CHOICES = ("none", "int8")
MANIFEST = "kb-export.json"
_ONNX_FILE = "model.onnx"


def _slug(model: str) -> str:
    """A folder name for a hub id (``BAAI--bge-reranker-v2-m3``) or a local folder
    (its name plus a hash of its absolute path, so two folders called ``model`` differ)."""
    if _looks_like_path(model):
        path = Path(model).expanduser().resolve()
        return f"{path.name}-{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"
    return re.sub(r"[^A-Za-z0-9._-]+", "--", model.strip("/"))


def export_dir_for(root: Path | str, model: str, quantize: str, *, optimize: bool = True) -> Path:
    """Where the export of ``model`` with ``quantize`` lives under ``root``. ``optimize=False``
    (int8 only): the folder of the int8 quantisation of the unfused graph, which only the
    benchmark makes (``export_model(..., optimize=False)``); the service loads ``int8``."""
    if quantize not in QUANTIZE_CHOICES:
        raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_CHOICES)}, not {quantize!r}")
    name = "fp32" if quantize == "none" else quantize if optimize else f"{quantize}-unoptimized"
    return Path(root).expanduser() / _slug(model) / name


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def _quantization_config():
    """Dynamic int8 (no calibration data needed), per-tensor weights: the instruction set
    of this CPU picks optimum's preset (VNNI runs u8 x s8 products without the AVX2 path's
    saturation, which needs 7-bit weights there: reduce_range)."""
    from optimum.onnxruntime.configuration import AutoQuantizationConfig

    if platform.machine().lower() in ("arm64", "aarch64"):
        return "arm64", AutoQuantizationConfig.arm64(is_static=False, per_channel=False)
    if "avx512_vnni" in _cpu_flags():
        return "avx512_vnni", AutoQuantizationConfig.avx512_vnni(is_static=False, per_channel=False)
    return "avx2", AutoQuantizationConfig.avx2(is_static=False, per_channel=False, reduce_range=True)


def _write_manifest(folder: Path, **info: Any) -> None:
    tmp = folder / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(folder / MANIFEST)


def _copy_preprocessors(src: Path, dst: Path) -> None:
    for f in src.iterdir():
        if f.is_file() and f.suffix in (".json", ".txt", ".model") and f.name != MANIFEST:
            shutil.copy2(f, dst / f.name)


def _optimize_graph(src: Path, dst: Path, log=print) -> dict[str, Any]:
    """ONNX Runtime's transformer fusions (python rules, no ORT session: ``opt_level=0``) of
    ``src``/model.onnx into ``dst``/model.onnx; returns what the manifest records."""
    from onnxruntime.transformers.optimizer import optimize_model

    config = json.loads((src / "config.json").read_text()) if (src / "config.json").exists() else {}
    heads, hidden = int(config.get("num_attention_heads", 0)), int(config.get("hidden_size", 0))
    t0 = time.perf_counter()
    optimized = optimize_model(str(src / _ONNX_FILE), model_type="bert", num_heads=heads, hidden_size=hidden,
                               opt_level=0)
    fused = {k: v for k, v in optimized.get_fused_operator_statistics().items() if v}
    log(f"graph fusions: {fused}")
    if not fused.get("Attention"):
        log("warning: no Attention fusion matched; int8 is made from the graph with the other fusions only")
    size = sum(f.stat().st_size for f in src.iterdir() if f.name.startswith(_ONNX_FILE))
    # protobuf's 2 GB limit: a big model keeps its weights in one external file
    optimized.save_model_to_file(str(dst / _ONNX_FILE), use_external_data_format=size > 1_800_000_000)
    if (src / "config.json").exists():
        shutil.copy2(src / "config.json", dst / "config.json")
    return {"tool": "onnxruntime.transformers.optimizer.optimize_model", "model_type": "bert",
            "num_heads": heads, "hidden_size": hidden, "opt_level": 0, "fused_operators": fused,
            "seconds": round(time.perf_counter() - t0, 1)}


def _quantize_fused(src: Path, dst: Path, config) -> None:
    """Dynamic int8 of the fused graph with optimum's preset (``config``) through ONNX Runtime's
    ``quantize_dynamic``: ONNX shape inference does not know the fused (com.microsoft) ops, so
    tensors after them get ``DefaultTensorType`` float, which optimum's quantizer cannot pass."""
    import onnx
    from onnxruntime.quantization import quantize_dynamic

    quantize_dynamic(src, dst, per_channel=config.per_channel, reduce_range=config.reduce_range,
                     weight_type=config.weights_dtype,
                     op_types_to_quantize=[getattr(op, "value", op) for op in config.operators_to_quantize],
                     extra_options={"WeightSymmetric": config.weights_symmetric,
                                    "ActivationSymmetric": config.activations_symmetric,
                                    "DefaultTensorType": onnx.TensorProto.FLOAT})


def export_fp32(model: str, out: Path) -> None:
    """optimum-onnx's export of the sequence-classification checkpoint ``model`` (hub id in the
    local HF cache, or a folder) as ``out``/model.onnx with its tokenizer and config."""
    from optimum.exporters.onnx import main_export

    # do_validation=False: the check re-runs both models on random inputs (minutes for the
    # big model); agreement is tested by tests/models/test_onnx_reranker.py, tests/guard/ and the benchmarks.
    main_export(model, out, task="text-classification", device="cpu", do_validation=False,
                local_files_only=os.environ.get("HF_HUB_OFFLINE") == "1")


def quantize_int8(src: Path, dst: Path) -> str:
    """ONNX Runtime's dynamic int8 of the model file ``src`` into ``dst`` with this CPU's preset
    (:func:`_quantization_config`); returns the preset's name."""
    preset, config = _quantization_config()
    _quantize_fused(src, dst, config)
    return preset


def export_model(model: str, root: Path | str, *, quantize: str = "none", force: bool = False,
                 optimize: bool = True, log=print) -> Path:
    """Export ``model`` (hub id in the local HF cache, or a folder) to ONNX under ``root``;
    with ``quantize="int8"`` also the dynamic int8 version, made from the fp32 export after
    ONNX Runtime's transformer fusions (``optimize=False``: from the unfused fp32 graph, into
    a folder the service does not load; for the benchmark's comparison).
    Returns the folder the service loads for ``quantize``. An existing complete export is
    reused unless ``force``."""
    from kb_rerank.core.extras import require

    require("optimum.exporters.onnx", "onnx", "exporting the cross-encoder to ONNX")
    fp32 = export_dir_for(root, model, "none")
    if force or not (fp32 / MANIFEST).exists():
        if fp32.exists():
            shutil.rmtree(fp32)
        fp32.mkdir(parents=True)
        t0 = time.perf_counter()
        log(f"exporting {model} to {fp32} ...")
        export_fp32(model, fp32)
        _write_manifest(fp32, model=model, quantize="none", seconds=round(time.perf_counter() - t0, 1),
                        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    else:
        log(f"reusing {fp32}")
    if quantize == "none":
        return fp32
    out = export_dir_for(root, model, quantize, optimize=optimize)
    stale = False
    if not force and (out / MANIFEST).exists() and optimize:
        stale = "graph_optimization" not in json.loads((out / MANIFEST).read_text())
        if stale:
            log(f"{out} predates the graph optimisation: quantizing again")
    if force or stale or not (out / MANIFEST).exists():
        from optimum.onnxruntime import ORTQuantizer

        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        t0 = time.perf_counter()
        source, optimization = fp32, None
        if optimize:
            source = out.parent / f".{out.name}-optimized-fp32.tmp"
            if source.exists():
                shutil.rmtree(source)
            source.mkdir()
            log(f"optimising the fp32 graph (transformer fusions) in {source} ...")
            optimization = _optimize_graph(fp32, source, log=log)
        preset, config = _quantization_config()
        log(f"quantizing to int8 ({preset}, dynamic) in {out} ...")
        try:
            if optimize:
                _quantize_fused(source / _ONNX_FILE, out / _ONNX_FILE, config)
            else:
                quantizer = ORTQuantizer.from_pretrained(source, file_name=_ONNX_FILE)
                written = quantizer.quantize(quantization_config=config, save_dir=out, file_suffix=None)
                produced = Path(written) / _ONNX_FILE
                if not produced.exists():  # older optimum versions name it model_quantized.onnx
                    candidates = sorted(Path(written).glob("*.onnx"))
                    candidates[0].rename(produced)
        finally:
            if optimize:
                shutil.rmtree(source, ignore_errors=True)
        _copy_preprocessors(fp32, out)
        _write_manifest(out, model=model, quantize=quantize, preset=preset, graph_optimization=optimization,
                        seconds=round(time.perf_counter() - t0, 1),
                        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    else:
        log(f"reusing {out}")
    return out


def open_session(path: Path | str, threads: int = 0):
    """An ONNX Runtime CPU session over the model file ``path`` with one output (the logits):
    all graph optimisations, ``threads`` intra-op threads (0: ONNX Runtime's default, one per
    physical core), one forward pass at a time (each model runs on one worker thread). The
    cross-encoder's and the dedicated injection model's (:mod:`kb_rerank.guard.model`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if threads > 0:
        opts.intra_op_num_threads = int(threads)
    opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])
    outputs = session.get_outputs()
    if len(outputs) != 1:
        raise ValueError(f"expected one output (the logits), got {[o.name for o in outputs]}")
    return session


def run_until(session, feed: dict, deadline: float | None = None):
    """The logits of one padded batch ``feed`` through ``session``. With a ``deadline``
    (``time.monotonic()``) the run is terminated when it is reached (``RunOptions.terminate``,
    set from a timer thread): :class:`BatchTerminated`, so no model work outlives its request."""
    if deadline is None:
        (logits,) = session.run(None, feed)
        return logits
    import onnxruntime as ort

    options = ort.RunOptions()
    left = deadline - time.monotonic()
    if left <= 0:
        raise BatchTerminated("the deadline passed before the batch started")
    timer = threading.Timer(left, setattr, (options, "terminate", True))
    timer.daemon = True
    timer.start()
    try:
        (logits,) = session.run(None, feed, options)
    except Exception as exc:
        if options.terminate:
            raise BatchTerminated(f"stopped at the deadline: {type(exc).__name__}") from exc
        raise
    finally:
        timer.cancel()
    return logits


class OnnxReranker(Reranker):
    """``Reranker`` whose forward pass is an ONNX Runtime session over ``kb-rerank model
    export``'s folder for (``model``, ``quantize``) under ``export_root``. ``threads``:
    ONNX Runtime's intra-op threads (0: its default, one per physical core)."""

    backend = "onnx"

    def __init__(self, model: str, *, export_root: Path | str, quantize: str = "none", threads: int = 0,
                 **kwargs: Any) -> None:
        kwargs.setdefault("device", "cpu")
        super().__init__(model, **kwargs)
        self.quantize = quantize
        self.threads = int(threads)
        self.export_dir = export_dir_for(export_root, model, quantize)
        self._session: Any = None
        self._input_names: list[str] = []
        self._np: Any = None

    def info(self) -> dict[str, Any]:
        return {**super().info(), "quantize": self.quantize, "export_dir": str(self.export_dir),
                "onnx_threads": self.threads}

    def _load_model(self) -> None:
        from kb_rerank.core.extras import require

        ort = require("onnxruntime", "onnx", "the ONNX cross-encoder")
        if not (self.export_dir / MANIFEST).exists():
            raise FileNotFoundError(
                f"no ONNX export at {str(self.export_dir)!r}: run `kb-rerank model export"
                + (" --quantize int8" if self.quantize != "none" else "") + "` first")
        import numpy as np
        from FlagEmbedding.utils.tokenizer_compat import pad_with_compat, prepare_for_model_compat
        from transformers import AutoTokenizer

        session = open_session(self.export_dir / _ONNX_FILE, self.threads)
        self._np, self._session = np, session
        self._input_names = [i.name for i in session.get_inputs()]
        self._prepare, self._pad = prepare_for_model_compat, pad_with_compat
        self._tokenizer = self._quiet(AutoTokenizer.from_pretrained(str(self.export_dir)))
        self._model = session  # "loaded" for the parent's checks
        self.device, self.fp16 = "cpu", False
        self._smoke_test()

    def close(self) -> None:
        super().close()
        self._session = None

    def _run_batch(self, features: list[dict], *, deadline: float | None = None) -> list[float]:
        """One padded batch through the session. With a ``deadline`` (``time.monotonic()``) the
        run is terminated when it is reached (``RunOptions.terminate``, set from a timer
        thread): :class:`BatchTerminated`, so no model work outlives its request."""
        inputs = self._pad(self._tokenizer, features, padding=True, return_tensors="np")
        feed = {name: inputs[name].astype(self._np.int64) for name in self._input_names}
        return run_until(self._session, feed, deadline).reshape(-1).astype(float).tolist()
