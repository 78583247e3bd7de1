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
import os
import platform
import random
import shlex
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
    build_random_bge_reranker_v2_m3,
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


# ------------------------------------------------------------------ backends (issue 16)
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="folder or hub id of the big model; 'configured' = KB_RERANKER_MODEL "
                                   "setting; default: build a random bge-reranker-v2-m3-architecture model")
    p.add_argument("--quick", action="store_true", help="1 repetition, one config for the big model")
    p.add_argument("--reps", type=int, default=2, help="repetitions per config (min is reported)")
    p.add_argument("--device", default=None, help="cpu / cuda:0 (default: cuda if available)")
    p.add_argument("--skip-big", action="store_true", help="tiny model only")
    p.add_argument("--skip-tiny", action="store_true", help="--backends: no agreement run on the tiny model")
    p.add_argument("--out", type=Path, default=None,
                   help="default bench/results/model_cost.json (model_cost-backends.json with --backends)")
    p.add_argument("--backends", action="store_true",
                   help="torch fp32 vs the ONNX backends of --backend-list (issue 16) instead of the batch-size matrix")
    p.add_argument("--threads", type=int, nargs="+", default=[2, 1], help="--backends: thread counts")
    p.add_argument("--max-lengths", type=int, nargs="+", default=list(MAX_LENGTHS), help="--backends")
    p.add_argument("--batch-size", type=int, default=16, help="--backends")
    p.add_argument("--model-label", default=None, help="--backends: how the results name --model")
    p.add_argument("--onnx-root", default=None, help="--backends: export cache to reuse (default: a temporary one)")
    p.add_argument("--backend-list", nargs="+", choices=BACKENDS, default=list(DEFAULT_BACKENDS),
                   help="--backends: which backends, torch-fp32 first (default: %(default)s)")
    args = p.parse_args(argv)
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
                from kb_rerank.settings import Settings

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
