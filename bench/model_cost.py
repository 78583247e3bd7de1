"""Cross-encoder forward cost: tokens/s for rerank-sized workloads.

Scores 40 (query, passage) pairs with ``kb_rerank.rerank.Reranker`` (the code
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
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        logits = r._forward(encoded, batches)
        times.append(time.perf_counter() - t0)
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
        "tokens_per_s": round(real / sec, 1),
        "padded_tokens_per_s": round(padded / sec, 1),
        "pairs_per_s": round(len(passages) / sec, 2),
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", help="folder or hub id of the big model; 'configured' = KB_RERANKER_MODEL "
                                   "setting; default: build a random bge-reranker-v2-m3-architecture model")
    p.add_argument("--quick", action="store_true", help="1 repetition, one config for the big model")
    p.add_argument("--reps", type=int, default=2, help="repetitions per config (min is reported)")
    p.add_argument("--device", default=None, help="cpu / cuda:0 (default: cuda if available)")
    p.add_argument("--skip-big", action="store_true", help="tiny model only")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "model_cost.json")
    args = p.parse_args(argv)
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
