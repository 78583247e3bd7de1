"""Cross-encoder forward cost: tokens/s for rerank-sized workloads.

Scores 40 (query, passage) pairs with ``kb_rerank.models.cross_encoder.Reranker`` (the code
the service uses: FlagReranker-identical tokenization, length-sorted batches)
for several batch sizes and max_length values, with and without length-sorted
batching, on two workloads:

* ``uniform``: every pair ~256 tokens (query ~12 tokens + passage);
* ``mixed``:   passage lengths spread from ~16 to ~480 tokens (seeded), where
               length sorting matters because unsorted batches pad to their
               longest member.

Models:

* the big one: ``--model PATH_OR_HUB_ID`` (``--model configured`` = the
  service setting ``KB_RERANKER_MODEL``, default ``BAAI/bge-reranker-v2-m3``,
  which must already be in the local HF cache), or by default a randomly
  initialised model with bge-reranker-v2-m3's exact architecture built in a
  temporary folder (compute cost depends on architecture and sequence length,
  not on weight values);
* the tiny random test model (``kb_rerank.testing.tiny_model``), as a floor.

Outside ``--quick`` the big model also runs ``FlagReranker.compute_score`` once
(batch 16, max_length 512, uniform) to show its extra per-call probe forward.

Writes ``bench/results/model_cost.json`` and prints a Markdown table.

``--fit`` ("which model fits which machine"): for each cross-encoder of
``kb_rerank.testing.tiny_model.CROSS_ENCODER_ARCHS`` (ms-marco-MiniLM-L-6/L-12-v2,
bge-reranker-base, mxbai-rerank-xsmall-v1, jina-reranker-v2-base-multilingual where it can be
built, bge-reranker-v2-m3), its published architecture with random weights: ms per pair at 128 /
256 / 512 tokens, 1 and 2 threads, torch fp32 and ONNX Runtime int8, from batches of 8 pairs, and
how many of 40 candidates fit 300 / 100 ms. Writes ``bench/results/model-fit.json`` and ``.md``::

    OPENBLAS_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=src python bench/model_cost.py --fit

    HF_HUB_OFFLINE=1 PYTHONPATH=src python bench/model_cost.py --quick

``--quick``: 1 repetition, and a single configuration for the big model
(uniform, max_length 512, batch 16, sorted).  The tiny model always runs every
configuration with an untimed pass + 3 repetitions (it takes seconds).
The minimum over repetitions is reported.  The full run on 2 CPU cores
takes tens of minutes (each big-model forward of 40x256 tokens is ~tens of s).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from kb_rerank.models.cross_encoder import Reranker, plan_batches  # noqa: E402
from kb_rerank.testing.tiny_model import (  # noqa: E402
    CROSS_ENCODER_ARCHS,
    build_random_bge_reranker_v2_m3,
    build_random_cross_encoder,
    build_tiny_cross_encoder,
    sample_words,
)

N_PAIRS = 40
QUERY_WORDS = 12
BATCH_SIZES = (8, 16, 40)
MAX_LENGTHS = (256, 512)


# ------------------------------------------------------------------ workloads
def _passage(tok, rng: random.Random, words: list[str], target_tokens: int) -> str:
    """Words drawn at random until the passage reaches ~target_tokens tokens."""
    out: list[str] = []
    n = 0
    while n < target_tokens:
        w = rng.choice(words)
        k = len(tok(w, add_special_tokens=False)["input_ids"])
        if n + k > target_tokens and n > 0:
            break
        out.append(w)
        n += k
    return " ".join(out)


def make_workloads(tok, seed: int = 0) -> tuple[str, dict[str, list[str]]]:
    rng = random.Random(seed)
    words = sample_words()
    query = " ".join(rng.choice(words) for _ in range(QUERY_WORDS))
    q_tokens = len(tok(query, add_special_tokens=False)["input_ids"])
    # <s> q </s></s> p </s>: 4 special tokens.
    uniform_target = max(8, 256 - q_tokens - 4)
    uniform = [_passage(tok, rng, words, uniform_target) for _ in range(N_PAIRS)]
    mixed = [_passage(tok, rng, words, rng.randint(16, 480)) for _ in range(N_PAIRS)]
    return query, {"uniform": uniform, "mixed": mixed}


# ------------------------------------------------------------------ measuring
def _set_max_length(r: Reranker, max_length: int) -> None:
    # Bench-only: reuse one loaded model for several max_length values
    # (same as constructing Reranker(max_length=...), without reloading).
    r.max_length = max_length
    r.query_max_length = max_length * 3 // 4


def measure(r: Reranker, query: str, passages: list[str], *, batch_size: int, sort: bool, reps: int,
            warm: bool = False) -> dict:
    t0 = time.perf_counter()
    encoded = r._encode(query, passages)
    tokenize_s = time.perf_counter() - t0
    lengths = [len(e["input_ids"]) for e in encoded]
    batches = plan_batches(lengths, batch_size, sort_by_length=sort)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    if warm:  # untimed pass: first use of new shapes pays one-off kernel set-up
        r._forward(encoded, batches)
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        logits = r._forward(encoded, batches)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # CPU seconds of all threads: steadier than wall on a busy host
        assert len(logits) == len(passages)
    sec = min(times)
    real = sum(lengths)
    return {
        "pairs": len(passages),
        "batches": len(batches),
        "tokens_mean": round(real / len(passages), 1),
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "tokens_real": real,
        "tokens_padded": padded,
        "padding_overhead": round(padded / real - 1, 4),
        "tokenize_s": round(tokenize_s, 4),
        "forward_s": round(sec, 4),
        "forward_s_all": [round(t, 4) for t in times],
        "cpu_s": round(min(cpu), 4),
        "cpu_s_all": [round(t, 4) for t in cpu],
        "tokens_per_s": round(real / sec, 1),
        "padded_tokens_per_s": round(padded / sec, 1),
        "pairs_per_s": round(len(passages) / sec, 2),
        "logits": logits,  # the last repetition's (callers comparing backends pop it)
    }


def measure_flag_compute_score(r: Reranker, query: str, passages: list[str], *, batch_size: int, reps: int) -> dict:
    """FlagReranker.compute_score as shipped (probe forward + sorting + tqdm)."""
    flag = r.flag_reranker
    pairs = [(query, p) for p in passages]
    times, forwards = [], []
    model = flag.model
    real_forward = model.forward
    count = [0]

    def counting_forward(*a, **k):
        count[0] += 1
        return real_forward(*a, **k)

    model.forward = counting_forward
    try:
        for _ in range(reps):
            count[0] = 0
            t0 = time.perf_counter()
            flag.compute_score(pairs, batch_size=batch_size, max_length=r.max_length,
                               query_max_length=r.query_max_length, normalize=True)
            times.append(time.perf_counter() - t0)
            forwards.append(count[0])
    finally:
        del model.forward
    return {"forward_s": round(min(times), 4), "forward_s_all": [round(t, 4) for t in times],
            "forward_calls": forwards[0], "pairs": len(passages)}


def warm_up(r: Reranker, query: str) -> None:
    r._forward(r._encode(query, ["warm up passage"] * 2), [[0, 1]])


def run_model(label: str, r: Reranker, configs: list[tuple[str, int, int, bool]], reps: int,
              warm_each: bool = False) -> list[dict]:
    query, workloads = make_workloads(r._tokenizer)
    warm_up(r, query)
    rows = []
    for workload, max_length, batch_size, sort in configs:
        _set_max_length(r, max_length)
        res = measure(r, query, workloads[workload], batch_size=batch_size, sort=sort, reps=reps,
                      warm=warm_each)
        res.pop("logits")
        row = {"model": label, "workload": workload, "max_length": max_length,
               "batch_size": batch_size, "sorted": sort, **res}
        rows.append(row)
        print(f"  {label:>14} {workload:>7} ml={max_length:<3} bs={batch_size:<2} sorted={sort!s:<5} "
              f"{res['forward_s']:8.3f}s {res['tokens_per_s']:10.1f} tok/s", flush=True)
    return rows


def full_matrix() -> list[tuple[str, int, int, bool]]:
    return [(w, ml, bs, s) for w in ("uniform", "mixed") for ml in MAX_LENGTHS
            for bs in BATCH_SIZES for s in (True, False)]


# ------------------------------------------------------------------ output
def markdown(rows: list[dict]) -> str:
    head = ("| model | workload | max_len | batch | sorted | tokens/pair (min-max) | padding | forward s "
            "| tokens/s | pairs/s |")
    sep = "|" + "---|" * 10
    lines = [head, sep]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['workload']} | {r['max_length']} | {r['batch_size']} | "
            f"{'yes' if r['sorted'] else 'no'} | {r['tokens_mean']:.0f} ({r['tokens_min']}-{r['tokens_max']}) | "
            f"{100 * r['padding_overhead']:.0f}% | {r['forward_s']:.3f} | {r['tokens_per_s']:,.0f} | "
            f"{r['pairs_per_s']:.2f} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ backends
BACKENDS = ("torch-fp32", "onnx-fp32", "onnx-fp32-opt", "onnx-int8", "onnx-int8-opt")
# onnx-int8: dynamic int8 of the plain export (export_model(optimize=False), the int8 of
# bench/results/model_cost-backends.md); onnx-int8-opt: of the graph after ONNX Runtime's
# transformer fusions (what `kb-rerank model export --quantize int8` writes now);
# onnx-fp32-opt: the fused fp32 graph itself (made here only; the service loads fp32/).
DEFAULT_BACKENDS = ("torch-fp32", "onnx-fp32", "onnx-int8", "onnx-int8-opt")


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _spearman(a: list[float], b: list[float]) -> float:
    from scipy.stats import spearmanr

    return round(float(spearmanr(a, b).statistic), 4)


def _export_folders(model: str, onnx_root: Path, names) -> dict[str, Path]:
    """The export folder of each ONNX backend in ``names``, exported when missing (reused
    otherwise), by ``kb-rerank model export``'s function."""
    from kb_rerank.models.onnx import MANIFEST, _copy_preprocessors, _optimize_graph, _write_manifest, export_model

    folders = {"onnx-fp32": export_model(model, onnx_root, quantize="none")}
    if "onnx-int8" in names:
        folders["onnx-int8"] = export_model(model, onnx_root, quantize="int8", optimize=False)
    if "onnx-int8-opt" in names:
        folders["onnx-int8-opt"] = export_model(model, onnx_root, quantize="int8")
    if "onnx-fp32-opt" in names:
        folders["onnx-fp32-opt"] = opt = folders["onnx-fp32"].parent / "fp32-optimized"
        if not (opt / MANIFEST).exists():
            opt.mkdir(parents=True, exist_ok=True)
            info = _optimize_graph(folders["onnx-fp32"], opt)
            _copy_preprocessors(folders["onnx-fp32"], opt)
            _write_manifest(opt, model=model, quantize="none", graph_optimization=info, seconds=info["seconds"])
    return {name: folders[name] for name in names if name in folders}


def _backend_models(model: str, onnx_root: Path, *, threads: int, batch_size: int,
                    names=DEFAULT_BACKENDS) -> dict:
    """The backends over one checkpoint: the service's Reranker (torch) and its ONNX subclass
    over the exports (``kb-rerank model export``'s function), in the order of ``names``."""
    from kb_rerank.models.onnx import OnnxReranker

    folders = _export_folders(model, onnx_root, names)
    out = {}
    for name in names:
        if name == "torch-fp32":
            out[name] = Reranker(model, device="cpu", max_length=512, batch_size=batch_size)
        else:
            out[name] = r = OnnxReranker(model, export_root=onnx_root, quantize="int8" if "int8" in name else "none",
                                         threads=threads, max_length=512, batch_size=batch_size)
            r.export_dir = folders[name]
    for r in out.values():
        r.load()
    return out


def agreement(models: dict, query: str, workloads: dict[str, list[str]]) -> list[dict]:
    """Spearman of each ONNX backend's scores against torch fp32, per workload and max_length."""
    rows = []
    for workload, passages in workloads.items():
        for ml in MAX_LENGTHS:
            scores = {}
            for name, r in models.items():
                _set_max_length(r, ml)
                scores[name] = r._compute_logits(query, passages)  # logits: same order as sigmoid scores
            for name in (n for n in models if n != "torch-fp32"):
                rows.append({"workload": workload, "max_length": ml, "backend": name,
                             "spearman_vs_torch_fp32": _spearman(scores["torch-fp32"], scores[name]),
                             "max_abs_logit_diff": round(max(abs(x - y) for x, y in
                                                             zip(scores["torch-fp32"], scores[name])), 5)})
    return rows


def run_backends(args) -> int:
    """torch fp32 vs the ONNX backends (``--backend-list``) on bge-reranker-v2-m3's
    architecture: 40 pairs of the ``mixed`` workload, max_length 256 and 512, 1 and 2 threads,
    backends interleaved per configuration (rotating who goes first); agreement on the tiny
    model (and the big one). Each timed pass records the host's 1-minute load average."""
    import torch

    names = tuple(args.backend_list)
    if names[0] != "torch-fp32":
        raise SystemExit("--backend-list must start with torch-fp32 (the reference of the ratios)")
    reps = max(1, args.reps if not args.quick else 1)
    result: dict = {"meta": {"python": platform.python_version(), "torch": torch.__version__,
                             "cpu_count": os.cpu_count(), "machine": platform.machine(), "n_pairs": N_PAIRS,
                             "reps": reps, "batch_size": args.batch_size, "workload": "mixed",
                             "backends": list(names), "command": shlex.join(["python", *sys.argv]),
                             "loadavg_start": _loadavg(),
                             "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}}
    try:
        import onnxruntime

        result["meta"]["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    md = Path(args.out).with_suffix(".md")

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        md.write_text(backends_markdown(result))

    with tempfile.TemporaryDirectory(prefix="kb-model-cost-") as tmp:
        tmp = Path(tmp)
        onnx_root = Path(args.onnx_root) if args.onnx_root else tmp / "onnx"
        if not args.skip_tiny:
            print("tiny random model: agreement", flush=True)
            tiny = _backend_models(str(build_tiny_cross_encoder(tmp / "tiny")), onnx_root, threads=0,
                                   batch_size=args.batch_size, names=names)
            query, workloads = make_workloads(tiny["torch-fp32"]._tokenizer)
            result["agreement_tiny"] = agreement(tiny, query, workloads)
            for r in tiny.values():
                r.close()
            save()
        if args.skip_big:
            print(backends_markdown(result))
            return 0

        big = args.model or str(build_random_bge_reranker_v2_m3(tmp / "bge-v2-m3-random"))
        t0 = time.perf_counter()
        rows: list[dict] = []
        result["rows"] = rows
        result["big_model"] = {"model": args.model_label or ("random bge-reranker-v2-m3 architecture"
                                                             if not args.model else big)}
        agreement_big: list[dict] = []
        result["agreement_big"] = agreement_big
        for threads in args.threads:
            torch.set_num_threads(threads)
            models = _backend_models(big, onnx_root, threads=threads, batch_size=args.batch_size, names=names)
            result["big_model"]["export_s"] = {
                name: json.loads((r.export_dir / "kb-export.json").read_text()).get("seconds")
                for name, r in models.items() if name != "torch-fp32"}
            result["big_model"]["graph_optimization"] = {
                name: json.loads((r.export_dir / "kb-export.json").read_text()).get("graph_optimization")
                for name, r in models.items() if name != "torch-fp32"}
            query, workloads = make_workloads(models["torch-fp32"]._tokenizer)
            passages = workloads["mixed"]
            for name, r in models.items():  # untimed: first calls pay one-off set-up
                warm_up(r, query)
            for k, ml in enumerate(args.max_lengths):
                order = list(names[k % len(names):] + names[:k % len(names)])
                logits: dict[str, list[float]] = {}
                for rep in range(reps):
                    for name in order if rep % 2 == 0 else order[::-1]:
                        r = models[name]
                        _set_max_length(r, ml)
                        load_before = _loadavg()
                        res = measure(r, query, passages, batch_size=args.batch_size, sort=True, reps=1)
                        logits[name] = res.pop("logits")
                        res["loadavg_all"] = [load_before, _loadavg()]
                        row = next((x for x in rows if (x["backend"], x["threads"], x["max_length"])
                                    == (name, threads, ml)), None)
                        if row is None:
                            rows.append({"backend": name, "threads": threads, "max_length": ml, **res})
                        else:
                            for key in ("forward_s", "cpu_s"):
                                row[key + "_all"] += res[key + "_all"]
                                row[key] = min(row[key + "_all"])
                            row["loadavg_all"] += res["loadavg_all"]
                        print(f"  threads={threads} ml={ml} {name:>13}: {res['forward_s']:8.2f}s "
                              f"(CPU {res['cpu_s']:.2f}s, load {res['loadavg_all']}) "
                              f"({res['tokens_mean']:.0f} tokens/pair)", flush=True)
                        save()
                # agreement on the big model, from the timed passes' own logits
                for name in names[1:]:
                    agreement_big.append({
                        "workload": f"mixed, {threads} thread(s)", "max_length": ml, "backend": name,
                        "spearman_vs_torch_fp32": _spearman(logits["torch-fp32"], logits[name]),
                        "max_abs_logit_diff": round(max(abs(x - y) for x, y in
                                                        zip(logits["torch-fp32"], logits[name])), 5)})
            for r in models.values():
                r.close()
            save()
        result["big_model"]["wall_s"] = round(time.perf_counter() - t0, 1)
    result["meta"]["loadavg_end"] = _loadavg()
    result["ratios"] = ratios(result["rows"])
    save()
    print(backends_markdown(result))
    print(f"\nwrote {args.out} and {md}")
    return 0


def ratios(rows: list[dict]) -> list[dict]:
    out = []
    for threads in sorted({r["threads"] for r in rows}):
        for ml in sorted({r["max_length"] for r in rows}):
            sel = [r for r in rows if (r["threads"], r["max_length"]) == (threads, ml)]
            by = {r["backend"]: r["forward_s"] for r in sel}
            cpu = {r["backend"]: r["cpu_s"] for r in sel if "cpu_s" in r}
            if "torch-fp32" in by:
                out.append({"threads": threads, "max_length": ml, "torch_fp32_s": by["torch-fp32"],
                            **{f"speedup_{b.replace('-', '_')}": round(by["torch-fp32"] / by[b], 2)
                               for b in BACKENDS[1:] if b in by},
                            **{f"cpu_speedup_{b.replace('-', '_')}": round(cpu["torch-fp32"] / cpu[b], 2)
                               for b in BACKENDS[1:] if b in cpu and "torch-fp32" in cpu}})
    return out


def backends_markdown(result: dict) -> str:
    m = result["meta"]
    names = m.get("backends", DEFAULT_BACKENDS)
    lines = ["# Cross-encoder backends: " + " vs ".join(names), ""]
    lines.append(f"{m['n_pairs']} pairs (workload `{m['workload']}`), length-sorted batches of {m['batch_size']}, "
                 f"{m['reps']} timed repetition(s) after an untimed warm-up, backends interleaved; "
                 f"torch {m['torch']}, onnxruntime {m.get('onnxruntime', '-')}, {m['cpu_count']} CPUs, "
                 f"started {m['started']}.")
    if m.get("command"):
        lines += ["", f"Command: `{m['command']}`; 1-minute load average at start "
                      f"{m.get('loadavg_start')}, at end {m.get('loadavg_end', '-')}."]
    lines += ["", "Backends: onnx-int8 = dynamic int8 of the plain optimum export (the int8 of "
                  "model_cost-backends.md); onnx-int8-opt = dynamic int8 after ONNX Runtime's transformer "
                  "fusions (what `kb-rerank model export --quantize int8` writes); onnx-fp32-opt = the fused "
                  "fp32 graph."]
    if result.get("rows"):
        lines += ["", "## Time per request (bge-reranker-v2-m3 architecture, random weights)", "",
                  "| threads | max_length | backend | tokens/pair (min-max) | wall s | CPU s | pairs/s | load avg |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in sorted(result["rows"], key=lambda r: (r["threads"], r["max_length"], BACKENDS.index(r["backend"]))):
            cpu = f"{r['cpu_s']:.2f}" if "cpu_s" in r else "-"
            load = "-".join(f"{x:.1f}" for x in r.get("loadavg_all", []) if x is not None) or "-"
            lines.append(f"| {r['threads']} | {r['max_length']} | {r['backend']} | {r['tokens_mean']:.0f} "
                         f"({r['tokens_min']}-{r['tokens_max']}) | {r['forward_s']:.2f} | {cpu} | {r['pairs_per_s']:.2f} "
                         f"| {load} |")
    if result.get("ratios"):
        onnx = [b for b in BACKENDS[1:] if any(f"speedup_{b.replace('-', '_')}" in r for r in result["ratios"])]
        lines += ["", "## Speed-up over torch fp32 (same run), wall / CPU seconds", "",
                  "| threads | max_length | torch fp32 wall s | " + " | ".join(onnx) + " |",
                  "|---|---|---|" + "---|" * len(onnx)]
        for r in result["ratios"]:
            cells = []
            for b in onnx:
                k = b.replace("-", "_")
                cells.append(f"{r.get('speedup_' + k, '-')}x / {r.get('cpu_speedup_' + k, '-')}x")
            lines.append(f"| {r['threads']} | {r['max_length']} | {r['torch_fp32_s']:.2f} | " + " | ".join(cells) + " |")
    for key, title in (("agreement_tiny", "tiny random model"), ("agreement_big", "bge-reranker-v2-m3 architecture")):
        if result.get(key):
            lines += ["", f"## Agreement with torch fp32 ({title}): Spearman of the 40 scores", "",
                      "| workload | max_length | backend | Spearman | max abs logit diff |", "|---|---|---|---|---|"]
            for r in result[key]:
                lines.append(f"| {r['workload']} | {r['max_length']} | {r['backend']} | "
                             f"{r['spearman_vs_torch_fp32']:.4f} | {r['max_abs_logit_diff']} |")
    return "\n".join(lines) + "\n"

# ------------------------------------------------------------------ which model fits
FIT_LENGTHS = (128, 256, 512)
FIT_THREADS = (1, 2)
FIT_BATCH = 8  # pairs per forward pass (one batch) in each measurement
FIT_BACKENDS = ("torch-fp32", "onnx-int8")
FIT_BUDGETS_MS = (300, 100)
N_CANDIDATES = 40  # what the rerank endpoint sends to the cross-encoder at most


def fit_count(ms_per_pair: float, budget_ms: float, n: int = N_CANDIDATES) -> int:
    """How many of ``n`` candidates a model at ``ms_per_pair`` scores within ``budget_ms``:
    min(n, floor(budget_ms / ms_per_pair))."""
    if not ms_per_pair > 0:
        raise ValueError(f"ms_per_pair must be > 0, got {ms_per_pair!r}")
    return min(n, math.floor(budget_ms / ms_per_pair))


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _cpu_isa() -> list[str]:
    from kb_rerank.models.onnx import _cpu_flags

    return sorted(_cpu_flags() & {"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "fma"})


def fit_workload(tok, seed: int = 0) -> tuple[str, list[str]]:
    """A 12-word query and FIT_BATCH passages of ~600 tokens: truncated to max_length (the
    passage side only, as the service does), every pair is exactly max_length tokens."""
    rng = random.Random(seed)
    words = sample_words()
    query = " ".join(rng.choice(words) for _ in range(QUERY_WORDS))
    return query, [_passage(tok, rng, words, 600) for _ in range(FIT_BATCH)]


def _fit_onnx_export(folder: Path, onnx_root: Path) -> tuple[Path, dict]:
    """int8 export by ``kb-rerank model export --quantize int8``'s function (fused graph); where the
    BERT fusion rules fail on an architecture, the int8 of the unfused graph, said so."""
    from kb_rerank.models.onnx import export_model

    t0 = time.perf_counter()
    try:
        out = export_model(str(folder), onnx_root, quantize="int8")
        variant = "int8 of the fused graph (kb-rerank model export --quantize int8)"
    except Exception as exc:  # noqa: BLE001 - recorded, then the unfused variant
        print(f"  fused int8 export failed ({type(exc).__name__}: {exc}); int8 of the unfused graph", flush=True)
        out = export_model(str(folder), onnx_root, quantize="int8", optimize=False)
        variant = f"int8 of the unfused graph (fused export failed: {type(exc).__name__})"
    manifest = json.loads((out / "kb-export.json").read_text())
    fp32 = json.loads((out.parent / "fp32" / "kb-export.json").read_text())
    return out, {"variant": variant, "export_s": round(time.perf_counter() - t0, 1),
                 "fp32_export_s": fp32.get("seconds"), "int8_s": manifest.get("seconds"),
                 "preset": manifest.get("preset"),
                 "fused_operators": (manifest.get("graph_optimization") or {}).get("fused_operators"),
                 "int8_mb": round(sum(f.stat().st_size for f in out.iterdir() if f.name.startswith("model.onnx"))
                                  / 1e6, 1)}


def _fit_measure(r: Reranker, query: str, passages: list[str], max_length: int) -> dict:
    _set_max_length(r, max_length)
    load_before = _loadavg()
    res = measure(r, query, passages, batch_size=FIT_BATCH, sort=True, reps=1)
    res.pop("logits")
    if not res["tokens_min"] == res["tokens_max"] == max_length:
        raise AssertionError(f"pairs of {res['tokens_min']}-{res['tokens_max']} tokens, not {max_length}")
    return {"forward_s": res["forward_s"], "cpu_s": res["cpu_s"], "loadavg": [load_before, _loadavg()]}


def run_fit_model(name: str, tmp: Path, args, result: dict, save) -> None:
    """Build ``name``'s architecture (random weights), then torch fp32 and ONNX int8 (unless
    skipped) interleaved: per thread count and length an untimed pass each, then ``reps``
    timed passes alternating which backend goes first. Rows are saved as they come."""
    import torch

    entry = CROSS_ENCODER_ARCHS[name]
    info: dict = {"model": name, "family": entry["family"], "published_params": entry["published_params"]}
    earlier_info = next((m for m in result["models"] if m["model"] == name), {})
    result["models"] = [m for m in result["models"] if m["model"] != name] + [info]
    # --merge with figures of this model already there: its timed passes join the earlier run's
    # (the minimum is over both runs' passes); a fresh run starts from none
    earlier = {(r["backend"], r["threads"], r["max_length"]): r for r in result["rows"] if r["model"] == name}
    result["rows"] = [r for r in result["rows"] if r["model"] != name]
    if "unavailable" in entry:
        info.update(built=False, reason=entry["unavailable"])
        print(f"{name}: not built: {entry['unavailable']}", flush=True)
        save()
        return
    reps = args.reps if name != "BAAI/bge-reranker-v2-m3" else min(args.reps, args.big_reps)
    t0 = time.perf_counter()
    folder = tmp / name.replace("/", "--")
    done = folder / ".kb-model-fit-built"  # --work-dir: reuse a complete build (deterministic: seed 0)
    if done.exists():
        info.update(built=True, build_s=earlier_info.get("build_s"), reused_build=True, reps=reps)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        build_random_cross_encoder(folder, name)
        done.write_text("ok")
        info.update(built=True, build_s=round(time.perf_counter() - t0, 1), reps=reps)
    print(f"{name}: built in {info['build_s']}s", flush=True)
    backends = list(FIT_BACKENDS)
    if name in args.skip_onnx:
        backends.remove("onnx-int8")
        info["onnx"] = {"skipped": "--skip-onnx"}
    elif "onnx-int8" in backends:
        try:
            export, info["onnx"] = _fit_onnx_export(folder, tmp / "onnx")
        except Exception as exc:  # noqa: BLE001 - a failed export is a result
            backends.remove("onnx-int8")
            info["onnx"] = {"error": f"{type(exc).__name__}: {exc}"[:600]}
        print(f"  onnx: {info['onnx']}", flush=True)
        save()
    from kb_rerank.models.onnx import OnnxReranker

    torch_r = Reranker(str(folder), device="cpu", max_length=512, batch_size=FIT_BATCH)
    torch_r.load()
    info["parameters"] = sum(p.numel() for p in torch_r._model.parameters())
    query, passages = fit_workload(torch_r._tokenizer)
    for threads in args.threads:
        torch.set_num_threads(threads)
        models = {"torch-fp32": torch_r}
        if "onnx-int8" in backends:
            models["onnx-int8"] = onnx_r = OnnxReranker(str(folder), export_root=tmp / "onnx", quantize="int8",
                                                        threads=threads, max_length=512, batch_size=FIT_BATCH)
            onnx_r.export_dir = export
            onnx_r.load()
        for k, ml in enumerate(args.max_lengths):
            for r in models.values():  # untimed: the first pass at a new shape pays one-off set-up
                _set_max_length(r, ml)
                r._forward(r._encode(query, passages), [list(range(len(passages)))])
            order = list(models) if k % 2 == 0 else list(models)[::-1]
            rows = {b: {"model": name, "backend": b, "threads": threads, "max_length": ml, "pairs": FIT_BATCH,
                        "forward_s_all": [], "cpu_s_all": [], "loadavg_all": []} for b in models}
            for rep in range(reps):
                for b in order if rep % 2 == 0 else order[::-1]:
                    m = _fit_measure(models[b], query, passages, ml)
                    row = rows[b]
                    row["forward_s_all"].append(m["forward_s"])
                    row["cpu_s_all"].append(m["cpu_s"])
                    row["loadavg_all"] += m["loadavg"]
            for b, row in rows.items():
                before = earlier.pop((b, threads, ml), None)
                if before:
                    row["runs"] = before.get("runs", 1) + 1
                    for key in ("forward_s_all", "cpu_s_all", "loadavg_all"):
                        row[key] = before[key] + row[key]
                row["ms_per_pair"] = round(1000 * min(row["forward_s_all"]) / FIT_BATCH, 2)
                row["cpu_ms_per_pair"] = round(1000 * min(row["cpu_s_all"]) / FIT_BATCH, 2)
                result["rows"].append(row)
                print(f"  threads={threads} len={ml} {b:>10}: {row['ms_per_pair']:9.2f} ms/pair "
                      f"(CPU {row['cpu_ms_per_pair']:.2f} ms/pair; load {row['loadavg_all']})", flush=True)
            save()
        if "onnx-int8" in models:
            models["onnx-int8"].close()
    result["rows"] += earlier.values()  # --merge: the earlier run's configurations not measured again
    torch_r.close()
    if not args.work_dir:  # a temporary folder: free its disk before the next model
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(tmp / "onnx", ignore_errors=True)
    info["wall_s"] = round(earlier_info.get("wall_s", 0) + time.perf_counter() - t0, 1)  # over the runs merged
    save()


def fit_table(result: dict, *, any_threads: bool = False) -> list[dict]:
    """Per model and length: the best backend at the most threads measured (``any_threads``: the
    best backend and thread count), and how many of N_CANDIDATES candidates fit each budget at
    its cost per pair."""
    out = []
    for m in result["models"]:
        rows = [r for r in result["rows"] if r["model"] == m["model"]]
        if not rows:
            continue
        threads = max(r["threads"] for r in rows)
        for ml in sorted({r["max_length"] for r in rows}):
            sel = [r for r in rows if r["max_length"] == ml and (any_threads or r["threads"] == threads)]
            if not sel:  # a run still under way
                continue
            best = min(sel, key=lambda r: r["ms_per_pair"])
            out.append({"model": m["model"], "max_length": ml, "threads": best["threads"],
                        "backend": best["backend"],
                        "ms_per_pair": best["ms_per_pair"],
                        **{f"fit_{b}ms": fit_count(best["ms_per_pair"], b) for b in FIT_BUDGETS_MS}})
    return out


def _fit_summary(result: dict, table: list[dict], *, show_threads: bool = False) -> list[str]:
    fit = {(f["model"], f["max_length"]): f for f in table}
    lines = ["| model | params | 256 tokens: ms/pair (backend) | in 300 ms | in 100 ms "
             "| 512 tokens: ms/pair (backend) | in 300 ms | in 100 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for m in result["models"]:
        if not m.get("built"):
            lines.append(f"| {m['model']} | {m['published_params'] / 1e6:.0f}M (published) | not built | - | - "
                         f"| not built | - | - |")
            continue
        cells = []
        for ml in (256, 512):
            f = fit.get((m["model"], ml))
            how = f"{f['backend']}, {f['threads']} thr" if f and show_threads else f["backend"] if f else ""
            cells += ([f"{f['ms_per_pair']:.1f} ({how})", str(f["fit_300ms"]), str(f["fit_100ms"])]
                      if f else ["-", "-", "-"])
        params = f"{m['parameters'] / 1e6:.1f}M" if m.get("parameters") else "-"
        lines.append(f"| {m['model']} | {params} | " + " | ".join(cells) + " |")
    return lines


def fit_markdown(result: dict) -> str:
    meta = result["meta"]
    lines = ["# Which model fits which machine: cost per pair of the cross-encoders users pick", "",
             f"Command: `{meta['command']}`; started {meta['started']}, ended {meta.get('ended', '-')} "
             f"(wall {meta.get('wall_s', '-')} s)."]
    for run in meta.get("earlier_runs", []):  # --merge
        lines[-1] += (f" Merged with the figures of the models of `{run['command']}` (started {run['started']}, "
                      f"wall {run.get('wall_s')} s, load average {run.get('loadavg_start')} -> "
                      f"{run.get('loadavg_end')}).")
    lines += ["",
             f"Host: {meta['cpu_model']} ({', '.join(meta['cpu_isa']) or '-'}), {meta['cpu_count']} CPUs, shared "
             f"with other work; 1-minute load average {meta['loadavg_start']} at start, "
             f"{meta.get('loadavg_end', '-')} "
             f"at end (each measurement's before/after pairs are in the JSON). torch {meta['torch']}, "
             f"onnxruntime {meta.get('onnxruntime', '-')}, transformers {meta['transformers']}, "
             f"Python {meta['python']}.", "",
             "Each model is its published architecture with random weights (cost does not depend on the "
             "weights; `kb_rerank.testing.tiny_model.CROSS_ENCODER_ARCHS`), run through the service's code: "
             "torch fp32 by `kb_rerank.models.cross_encoder.Reranker`, ONNX Runtime int8 by "
             "`kb_rerank.models.onnx.OnnxReranker` over `export_model(..., quantize=\"int8\")`. One measurement "
             f"= one forward pass over a batch of {FIT_BATCH} pairs of exactly the given length (a 12-word query, "
             "passages truncated to it); ms per pair = batch time / 8; an untimed pass first, then "
             f"the minimum of {meta['reps']} timed passes (bge-reranker-v2-m3: {meta['big_reps']}), the two "
             "backends interleaved. Threads: `torch.set_num_threads` / ONNX Runtime intra-op threads. CPU ms "
             "counts all threads of the process."]
    pooled = sorted({r["model"] for r in result["rows"] if r.get("runs", 1) > 1})
    if pooled:
        lines[-1] += (" Some configurations were measured in more than one run (`--merge`, each run with its own "
                      "untimed pass; `runs` in the JSON), of: " + ", ".join(pooled)
                      + "; their figures are the minimum over all those runs' timed passes.")
    lines.append("")
    lengths = sorted({r["max_length"] for r in result["rows"]})
    lines += [f"## Of {N_CANDIDATES} candidates, how many fit the budget (best backend, "
              f"{max((r['threads'] for r in result['rows']), default='-')} threads)", ""]
    lines += _fit_summary(result, result.get("fit", []))
    lines += ["", "## The same, best backend and thread count", "",
              "On a shared host a second thread can cost more than it gives (another process holds "
              "the other core): this table takes whichever of the measured thread counts was faster.", ""]
    lines += _fit_summary(result, result.get("fit_any_threads", []), show_threads=True)
    lines += ["", "## ms per pair, every configuration (wall; CPU in brackets)", "",
              "| model | backend | threads | " + " | ".join(f"{ml} tokens" for ml in lengths) + " |",
              "|---|---|---:|" + "---:|" * len(lengths)]
    keys = sorted({(r["model"], r["backend"], r["threads"]) for r in result["rows"]},
                  key=lambda k: ([m["model"] for m in result["models"]].index(k[0]), k[1], k[2]))
    for model, backend, threads in keys:
        cells = []
        for ml in lengths:
            r = next((r for r in result["rows"] if (r["model"], r["backend"], r["threads"], r["max_length"])
                      == (model, backend, threads, ml)), None)
            cells.append(f"{r['ms_per_pair']:.1f} ({r['cpu_ms_per_pair']:.1f})" if r else "-")
        lines.append(f"| {model} | {backend} | {threads} | " + " | ".join(cells) + " |")
    lines += ["", "## Models", ""]
    for m in result["models"]:
        if not m.get("built"):
            lines.append(f"- {m['model']}: **not built**: {m['reason']}.")
            continue
        onnx = m.get("onnx", {})
        if "variant" in onnx:
            o = (f"ONNX {onnx['variant']}, {onnx['int8_mb']} MB; export: fp32 {onnx['fp32_export_s']} s, "
                 f"fusions + int8 {onnx['int8_s']} s (fused: {onnx.get('fused_operators') or 'none'})")
        elif "error" in onnx:
            o = f"ONNX export failed: {onnx['error']}"
        else:
            o = f"ONNX not measured ({onnx.get('skipped', '-')})"
        built = f"{m['parameters']:,} parameters built" if m.get("parameters") else "built"
        build = "build reused (--work-dir)" if m.get("reused_build") else f"build {m['build_s']} s"
        lines.append(f"- {m['model']} ({m['family']}): {built} "
                     f"(published {m['published_params'] / 1e6:.1f}M); {build}; {o}; "
                     f"{m.get('wall_s', '-')} s in all.")
    if meta.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in meta["notes"]]
    return "\n".join(lines) + "\n"


def run_fit(args) -> int:
    import torch
    import transformers

    out = Path(args.out)
    md = out.with_suffix(".md")
    models = args.fit_models or list(CROSS_ENCODER_ARCHS)
    unknown = [m for m in models if m not in CROSS_ENCODER_ARCHS]
    if unknown:
        raise SystemExit(f"unknown --fit-models {unknown}; choose from {list(CROSS_ENCODER_ARCHS)}")
    result: dict = {"meta": {}, "models": [], "rows": []}
    if args.merge and out.exists():  # keep the other models' figures of an earlier run
        old = json.loads(out.read_text())
        result["models"], result["rows"] = old.get("models", []), old.get("rows", [])
        result["meta"]["earlier_runs"] = old["meta"].get("earlier_runs", []) + [
            {k: old["meta"].get(k) for k in ("command", "started", "ended", "wall_s", "loadavg_start",
                                               "loadavg_end", "models")}]
    result["meta"].update({
        "command": shlex.join(["python", *sys.argv]), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
        "cpu_model": _cpu_model(), "cpu_isa": _cpu_isa(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
        "loadavg_start": _loadavg(), "reps": args.reps, "big_reps": min(args.reps, args.big_reps),
        "threads": list(args.threads), "max_lengths": list(args.max_lengths), "batch": FIT_BATCH,
        "n_candidates": N_CANDIDATES, "budgets_ms": list(FIT_BUDGETS_MS), "models": models,
        "skip_onnx": list(args.skip_onnx)})
    result["meta"]["notes"] = result["meta"].get("notes", []) + list(args.note or [])  # kept over --merge
    try:
        import onnxruntime

        result["meta"]["onnxruntime"] = onnxruntime.__version__
    except ImportError:
        pass
    t0 = time.perf_counter()

    def save() -> None:
        result["fit"] = fit_table(result)
        result["fit_any_threads"] = fit_table(result, any_threads=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, ensure_ascii=False))
        md.write_text(fit_markdown(result))

    if args.work_dir:
        Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kb-model-fit-") as tmp:
        for name in models:
            run_fit_model(name, Path(args.work_dir or tmp), args, result, save)
    order = list(CROSS_ENCODER_ARCHS)
    result["models"].sort(key=lambda m: order.index(m["model"]))
    result["meta"].update(ended=time.strftime("%Y-%m-%dT%H:%M:%S%z"), wall_s=round(time.perf_counter() - t0, 1),
                          loadavg_end=_loadavg())
    save()
    print(md.read_text())
    print(f"wrote {out} and {md}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="folder or hub id of the big model; 'configured' = KB_RERANKER_MODEL "
                                   "setting; default: build a random bge-reranker-v2-m3-architecture model")
    p.add_argument("--quick", action="store_true", help="1 repetition, one config for the big model")
    p.add_argument("--reps", type=int, default=None,
                   help="repetitions per config (min is reported; default 2, --fit 3)")
    p.add_argument("--device", default=None, help="cpu / cuda:0 (default: cuda if available)")
    p.add_argument("--skip-big", action="store_true", help="tiny model only")
    p.add_argument("--skip-tiny", action="store_true", help="--backends: no agreement run on the tiny model")
    p.add_argument("--out", type=Path, default=None,
                   help="default bench/results/model_cost.json (model_cost-backends.json with --backends)")
    p.add_argument("--backends", action="store_true",
                   help="torch fp32 vs the ONNX backends of --backend-list instead of the batch-size matrix")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="--backends / --fit: thread counts (default 2 1 / 1 2)")
    p.add_argument("--max-lengths", type=int, nargs="+", default=None,
                   help="--backends / --fit (default 256 512 / 128 256 512)")
    p.add_argument("--batch-size", type=int, default=16, help="--backends")
    p.add_argument("--model-label", default=None, help="--backends: how the results name --model")
    p.add_argument("--onnx-root", default=None, help="--backends: export cache to reuse (default: a temporary one)")
    p.add_argument("--backend-list", nargs="+", choices=BACKENDS, default=list(DEFAULT_BACKENDS),
                   help="--backends: which backends, torch-fp32 first (default: %(default)s)")
    p.add_argument("--fit", action="store_true",
                   help="which model fits which machine: ms per pair of each architecture of "
                        "CROSS_ENCODER_ARCHS, torch fp32 and ONNX int8, at --max-lengths and --threads")
    p.add_argument("--fit-models", nargs="+", default=None, help="--fit: which models (default: all)")
    p.add_argument("--skip-onnx", nargs="*", default=[], help="--fit: models measured with torch only")
    p.add_argument("--big-reps", type=int, default=2, help="--fit: timed passes for bge-reranker-v2-m3")
    p.add_argument("--merge", action="store_true",
                   help="--fit: keep the figures already in --out; a model measured again adds its timed "
                        "passes to the earlier ones (the minimum is over both)")
    p.add_argument("--note", action="append", help="--fit: a note for the Markdown (repeatable)")
    p.add_argument("--work-dir", default=None,
                   help="--fit: keep the built models and their ONNX exports here and reuse them "
                        "(default: a temporary folder, emptied after each model)")
    args = p.parse_args(argv)
    if args.fit:
        args.out = args.out or ROOT / "bench" / "results" / "model-fit.json"
        args.reps = args.reps or 3
        args.threads = args.threads or list(FIT_THREADS)
        args.max_lengths = args.max_lengths or list(FIT_LENGTHS)
        return run_fit(args)
    args.reps = args.reps or 2
    args.threads = args.threads or [2, 1]
    args.max_lengths = args.max_lengths or list(MAX_LENGTHS)
    if args.backends:
        args.out = args.out or ROOT / "bench" / "results" / "model_cost-backends.json"
        return run_backends(args)
    args.out = args.out or ROOT / "bench" / "results" / "model_cost.json"
    reps = 1 if args.quick else max(1, args.reps)

    import torch

    meta = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "quick": args.quick,
        "reps": reps,
        "n_pairs": N_PAIRS,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rows: list[dict] = []
    extra: dict = {}

    with tempfile.TemporaryDirectory(prefix="kb-model-cost-") as tmp:
        tmp = Path(tmp)
        print("tiny random model:", flush=True)
        tiny = Reranker(str(build_tiny_cross_encoder(tmp / "tiny")), device=args.device, max_length=512)
        tiny.load()
        # Cheap: always an untimed pass + 3 timed repetitions per config.
        rows += run_model("tiny-random", tiny, full_matrix(), max(3, reps), warm_each=True)
        meta["device"] = tiny.device
        tiny.close()

        if not args.skip_big:
            if args.model == "configured":
                from kb_rerank.core.settings import Settings

                big_name, label = Settings.from_env().reranker_model, "configured"
            elif args.model:
                big_name, label = args.model, "given"
            else:
                print("building random bge-reranker-v2-m3 architecture model...", flush=True)
                t0 = time.perf_counter()
                big_name = str(build_random_bge_reranker_v2_m3(tmp / "bge-v2-m3-random"))
                extra["build_s"] = round(time.perf_counter() - t0, 1)
                label = "bge-v2-m3-arch"
            big = Reranker(big_name, device=args.device, max_length=512, batch_size=16)
            big.load()
            extra.update(big_model=big_name if label != "bge-v2-m3-arch" else "random bge-reranker-v2-m3 architecture",
                         load_s=round(big.load_seconds or 0, 1), device=big.device, fp16=big.fp16,
                         parameters=sum(p.numel() for p in big._model.parameters()))
            print(f"{label}: loaded in {extra['load_s']}s on {big.device} (fp16={big.fp16})", flush=True)
            configs = [("uniform", 512, 16, True)] if args.quick else full_matrix()
            rows += run_model(label, big, configs, reps)
            if not args.quick:
                query, workloads = make_workloads(big._tokenizer)
                _set_max_length(big, 512)
                extra["flag_compute_score_uniform_ml512_bs16"] = measure_flag_compute_score(
                    big, query, workloads["uniform"], batch_size=16, reps=reps)
            big.close()

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"meta": meta, "big_model": extra, "rows": rows}, indent=2, ensure_ascii=False))
    print()
    print(f"device={meta['device']} torch={meta['torch']} threads={meta['torch_threads']} reps={reps}"
          + (f"; big model: build {extra.get('build_s', '-')}s, load {extra.get('load_s')}s, "
             f"{extra.get('parameters', 0) / 1e6:.0f}M params" if extra else ""))
    print()
    print(markdown(rows))
    if "flag_compute_score_uniform_ml512_bs16" in extra:
        f = extra["flag_compute_score_uniform_ml512_bs16"]
        print(f"\nFlagReranker.compute_score (uniform, ml 512, bs 16): {f['forward_s']:.3f}s, "
              f"{f['forward_calls']} forward calls for {f['pairs']} pairs")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
