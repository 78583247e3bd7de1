"""The dedicated injection model's cost per chunk (KB_GUARD_MODEL): torch fp32 against the
ONNX int8 backend (KB_GUARD_MODEL_BACKEND=onnx-int8), at 256 and 512 tokens, in forward passes
of 1 and of 8 chunks; and how often the int8 verdicts agree with the fp32 ones, each backend
at its own calibrated threshold.

A randomly initialised checkpoint of the model's architecture (kb_rerank.testing.tiny_model:
``tiny``, or the published sizes of Prompt Guard 2 86M / the ProtectAI model, DeBERTa-v2 with
relative attention; the cost of a forward pass depends on the sizes and the sequence length,
not on the weights) is written to a temporary folder, exported by the service's own
``kb-rerank guard export`` code and loaded through :class:`kb_rerank.guard.model.InjectionModel`.
Texts of exactly ``L`` tokens are scored, 8 of them a round; the four variants (backend x
batch) run interleaved in every round, after a warm-up; the median round per variant.

Agreement (``--agree``, per architecture named there): both backends calibrated on the
ordinary corpus (bench/data/ordinary, the calibration the service uses:
:func:`kb_rerank.guard.model.calibrate`), then both score the ordinary corpus and the
labelled injection sets (tests/data/injection); reported: the share of texts whose verdict is
the same, on each set; and the int8 verdicts in passes of 8 against the service's passes of 1
at the same threshold (dynamic int8 quantises each pass's activations with one scale, so in a
pass of several a text's int8 score depends on the texts beside it: why the service's int8
backend reads one text a pass). Random weights: the verdicts themselves mean
nothing, their agreement measures what int8 changes.

    OPENBLAS_NUM_THREADS=1 python bench/guard_model_cost.py --arch tiny meta-llama/Llama-Prompt-Guard-2-86M --agree tiny
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]
ROUND = 8  # texts scored per timed round


def _rows(paths: list[Path]) -> list[dict]:
    out = []
    for p in paths:
        for line in p.read_text(encoding="utf-8").splitlines():
            if line.strip():
                out.append(json.loads(line))
    return out


def _cost(folder: Path, lengths: list[int], batches: list[int], repeats: int, words: list[str], arch: str,
          params: int) -> list[dict]:
    from kb_rerank.guard.model import InjectionModel

    rows = []
    for length in lengths:
        models = {(be, b): InjectionModel(folder, max_length=length, batch_size=b, need_threshold=False,
                                          backend=be, int8_batches=True).load()
                  for be in ("torch", "onnx-int8") for b in batches}
        # one word a token with this tokenizer; the framing adds two, truncation caps at length
        texts = [" ".join(words[(i + k) % len(words)] for k in range(length)) for i in range(ROUND)]
        any_model = next(iter(models.values()))
        ntok = len(any_model._tokenizer(texts[0], truncation=True, max_length=length)["input_ids"])
        times: dict[tuple, list[float]] = {k: [] for k in models}
        for m in models.values():
            m.probabilities(texts)  # warm
        for r in range(repeats):
            keys = list(models) if r % 2 == 0 else list(reversed(models))  # interleaved, order alternated
            for k in keys:
                t = time.perf_counter()
                models[k].probabilities(texts)
                times[k].append(time.perf_counter() - t)
        base = {b: statistics.median(times[("torch", b)]) for b in batches}
        for (be, b), ts in times.items():
            med = statistics.median(ts)
            rows.append({"arch": arch, "params": params, "tokens": ntok, "backend": be, "batch": b,
                         "ms_per_chunk": round(med / ROUND * 1000, 2),
                         "vs_torch_same_batch": round(med / base[b], 3),
                         "vs_batch1_same_backend": round(med / statistics.median(times[(be, batches[0])]), 3)})
            print(rows[-1], flush=True)
    return rows


def _agreement(folder: Path, arch: str, length: int, limit: int | None) -> dict:
    import numpy as np

    from kb_rerank.guard.model import InjectionModel, calibrate

    ordinary = _rows(sorted((ROOT / "bench" / "data" / "ordinary").glob("*.jsonl")))
    labelled = _rows(sorted((ROOT / "tests" / "data" / "injection").glob("*.jsonl")))
    if limit:
        ordinary, labelled = ordinary[:limit], labelled[:limit]
    out = {"arch": arch, "tokens": length, "ordinary": len(ordinary), "labelled": len(labelled)}
    scores, thresholds = {}, {}
    t0 = time.perf_counter()
    for be in ("torch", "onnx-int8"):  # as the service runs them (int8: one text a pass)
        m = InjectionModel(folder, max_length=length, batch_size=8, need_threshold=False, backend=be)
        cal, _ = calibrate(m, ordinary)
        thresholds[be] = cal.threshold
        scores[be] = {"ordinary": m.probabilities([r["text"] for r in ordinary]),
                      "labelled": m.probabilities([r["text"] for r in labelled])}
    eight = InjectionModel(folder, max_length=length, batch_size=8, need_threshold=False, backend="onnx-int8",
                           int8_batches=True)
    batched = {"ordinary": eight.probabilities([r["text"] for r in ordinary]),
               "labelled": eight.probabilities([r["text"] for r in labelled])}
    for s in ("ordinary", "labelled"):
        vt = scores["torch"][s] >= thresholds["torch"]
        vi = scores["onnx-int8"][s] >= thresholds["onnx-int8"]
        vb = batched[s] >= thresholds["onnx-int8"]
        out[f"{s}_agree_int8_fp32"] = round(float(np.mean(vt == vi)), 4)
        out[f"{s}_flagged_fp32_int8"] = [int(vt.sum()), int(vi.sum())]
        out[f"{s}_agree_int8_batch8_batch1"] = round(float(np.mean(vi == vb)), 4)
        out[f"{s}_max_abs_diff_int8_batch8_batch1"] = round(float(np.max(np.abs(scores["onnx-int8"][s] - batched[s]))), 4)
        out[f"{s}_rank_corr_int8_fp32"] = round(float(np.corrcoef(np.argsort(np.argsort(scores["torch"][s])),
                                                                  np.argsort(np.argsort(scores["onnx-int8"][s])))[0, 1]), 4)
    out["thresholds"] = {k: round(v, 6) for k, v in thresholds.items()}
    out["seconds"] = round(time.perf_counter() - t0, 1)
    print(out, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["tiny"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--agree", nargs="*", default=["tiny"], help="architectures whose int8/fp32 agreement is measured")
    ap.add_argument("--agree-length", type=int, default=256)
    ap.add_argument("--agree-limit", type=int, default=None, help="at most this many texts of each set")
    ap.add_argument("--out", default="guard-model-cost")
    args = ap.parse_args()
    import torch

    from kb_rerank.guard.model import export_int8
    from kb_rerank.testing.tiny_model import build_random_injection_model, build_tiny_injection_model, sample_words

    words = sample_words()
    rows, agree, exports = [], [], {}
    for arch in args.arch:
        with tempfile.TemporaryDirectory(prefix="guard-model-") as tmp:
            folder = (build_tiny_injection_model(Path(tmp) / "m") if arch == "tiny"
                      else build_random_injection_model(Path(tmp) / "m", arch))
            from transformers import AutoConfig, AutoModelForSequenceClassification

            params = sum(p.numel() for p in AutoModelForSequenceClassification.from_config(
                AutoConfig.from_pretrained(folder)).parameters())
            t = time.perf_counter()
            out = export_int8(folder, log=lambda *a: None)
            exports[arch] = {"seconds": round(time.perf_counter() - t, 1),
                             "int8_mb": round((out / "model.onnx").stat().st_size / 1e6, 1),
                             "fp32_mb": round(sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e6, 1)}
            print(arch, exports[arch], flush=True)
            rows += _cost(folder, args.lengths, args.batches, args.repeats, words, arch, params)
            if arch in (args.agree or []):
                agree.append(_agreement(folder, arch, args.agree_length, args.agree_limit))
    res = ROOT / "bench" / "results"
    cmd = ("OPENBLAS_NUM_THREADS=1 python bench/guard_model_cost.py --arch " + " ".join(args.arch)
           + f" --lengths {' '.join(map(str, args.lengths))} --batches {' '.join(map(str, args.batches))}"
           + f" --repeats {args.repeats} --agree {' '.join(args.agree or [])} --agree-length {args.agree_length}"
           + (f" --agree-limit {args.agree_limit}" if args.agree_limit else "") + f" --out {args.out}")
    load = os.getloadavg()[0]
    (res / f"{args.out}.json").write_text(json.dumps({"command": cmd, "rows": rows, "agreement": agree,
                                                      "exports": exports, "load_avg": load,
                                                      "torch_threads": torch.get_num_threads()}, indent=1) + "\n")
    md = ["# The dedicated injection model's cost per chunk: torch fp32 and ONNX int8", "",
          f"`{cmd}` (random weights of the architecture; {os.cpu_count()} cores shared, torch threads "
          f"{torch.get_num_threads()}, ONNX Runtime's default threads, load average {load:.1f} at the end; "
          f"{ROUND} chunks a round, the four variants interleaved each round, median of {args.repeats}).", "",
          "| architecture | parameters | tokens | backend | batch | ms a chunk | x torch, same batch | x batch 1 |",
          "|---|---|---|---|---|---|---|---|"]
    md += [f"| {r['arch']} | {r['params'] / 1e6:.1f}M | {r['tokens']} | {r['backend']} | {r['batch']} | "
           f"{r['ms_per_chunk']} | {r['vs_torch_same_batch']} | {r['vs_batch1_same_backend']} |" for r in rows]
    md += ["", "Exports (`kb-rerank guard export`): " + "; ".join(
        f"{a}: {e['seconds']} s, int8 file {e['int8_mb']} MB (checkpoint {e['fp32_mb']} MB)" for a, e in exports.items())]
    if agree:
        md += ["", "Verdicts, each backend at its own threshold calibrated on the ordinary corpus (target 0.5 %):", "",
               "| architecture | tokens | set | texts | int8 = fp32 | flagged fp32 / int8 | rank corr. | "
               "int8 batch 8 = batch 1 | max score change, batch 8 vs 1 |", "|---|---|---|---|---|---|---|---|---|"]
        for a in agree:
            for s in ("ordinary", "labelled"):
                md.append(f"| {a['arch']} | {a['tokens']} | {s} | {a[s]} | {a[f'{s}_agree_int8_fp32']} | "
                          f"{a[f'{s}_flagged_fp32_int8'][0]} / {a[f'{s}_flagged_fp32_int8'][1]} | "
                          f"{a[f'{s}_rank_corr_int8_fp32']} | {a[f'{s}_agree_int8_batch8_batch1']} | "
                          f"{a[f'{s}_max_abs_diff_int8_batch8_batch1']} |")
    (res / f"{args.out}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
