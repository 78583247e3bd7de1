"""The dedicated injection model's cost per chunk (KB_GUARD_MODEL), at 256 and 512 tokens.

A randomly initialised checkpoint of the model's architecture (kb_rerank.testing.tiny_model:
``tiny``, or the published sizes of Prompt Guard 2 86M / the ProtectAI model, DeBERTa-v2 with
relative attention; the cost of a forward pass depends on the sizes and the sequence length,
not on the weights) is written to a temporary folder and loaded through the service's own code
(:class:`kb_rerank.guard.model.InjectionModel`); texts of exactly ``L`` tokens are scored in
batches of ``--batch``, timed after a warm-up, the best of ``--repeats``.

    OPENBLAS_NUM_THREADS=1 python bench/guard_model_cost.py [--arch tiny|meta-llama/Llama-Prompt-Guard-2-86M|protectai/deberta-v3-base-prompt-injection-v2]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", nargs="+", default=["tiny"])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="guard-model-cost")
    args = ap.parse_args()
    import torch

    from kb_rerank.guard.model import InjectionModel
    from kb_rerank.testing.tiny_model import build_random_injection_model, build_tiny_injection_model, sample_words

    words = sample_words()
    rows = []
    for arch in args.arch:
        with tempfile.TemporaryDirectory(prefix="guard-model-") as tmp:
            t = time.perf_counter()
            folder = (build_tiny_injection_model(Path(tmp) / "m") if arch == "tiny"
                      else build_random_injection_model(Path(tmp) / "m", arch))
            built = time.perf_counter() - t
            for length in args.lengths:
                m = InjectionModel(folder, max_length=length, batch_size=args.batch, need_threshold=False).load()
                params = sum(p.numel() for p in m._model.parameters())
                # one word a token with this tokenizer; the framing adds two, truncation caps at length
                texts = [" ".join(words[(i + k) % len(words)] for k in range(length)) for i in range(args.batch)]
                ntok = len(m._tokenizer(texts[0], truncation=True, max_length=length)["input_ids"])
                m.probabilities(texts)  # warm
                best = float("inf")
                for _ in range(args.repeats):
                    t = time.perf_counter()
                    m.probabilities(texts)
                    best = min(best, time.perf_counter() - t)
                rows.append({"arch": arch, "params": params, "tokens": ntok, "batch": args.batch,
                             "ms_per_chunk": round(best / args.batch * 1000, 2), "device": m.device,
                             "torch_threads": torch.get_num_threads(), "build_s": round(built, 1)})
                print(rows[-1], flush=True)
    res = ROOT / "bench" / "results"
    (res / f"{args.out}.json").write_text(json.dumps({"rows": rows, "load_avg": os.getloadavg()}, indent=1) + "\n")
    md = ["# The dedicated injection model's cost per chunk", "",
          f"`OPENBLAS_NUM_THREADS=1 python bench/guard_model_cost.py --arch {' '.join(args.arch)} --batch {args.batch} "
          f"--repeats {args.repeats} --out {args.out}` "
          f"(random weights of the architecture; {os.cpu_count()} cores shared, load average "
          f"{os.getloadavg()[0]:.1f} at the end).", "",
          "| architecture | parameters | tokens | ms a chunk | device, torch threads |", "|---|---|---|---|---|"]
    md += [f"| {r['arch']} | {r['params'] / 1e6:.1f}M | {r['tokens']} | {r['ms_per_chunk']} | {r['device']}, "
           f"{r['torch_threads']} |" for r in rows]
    (res / f"{args.out}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
