"""Where an ONNX export's time goes, by operator (ONNX Runtime's profiler), at two lengths.

One batch of 16 pairs of random token ids at each --lengths value, one intra-op thread, run
twice; prints each operator type's share of the kernel time. Used to explain why the int8
export's speed-up over torch fp32 falls with max_length (docs/models.md).

    python bench/onnx_profile.py --model <export>/int8/model.onnx [--lengths 256 480]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path


def main(argv=None) -> int:
    import numpy as np
    import onnxruntime as ort

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--lengths", nargs="+", type=int, default=[256, 480])
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for length in args.lengths:
            so = ort.SessionOptions()
            so.enable_profiling = True
            so.intra_op_num_threads = 1
            so.profile_file_prefix = str(Path(tmp) / f"profile{length}")
            sess = ort.InferenceSession(str(args.model), so, providers=["CPUExecutionProvider"])
            names = {i.name for i in sess.get_inputs()}
            shape = (args.batch, length)
            feed = {"input_ids": rng.integers(5, 1000, shape, dtype=np.int64),
                    "attention_mask": np.ones(shape, np.int64), "token_type_ids": np.zeros(shape, np.int64)}
            feed = {k: v for k, v in feed.items() if k in names}
            for _ in range(2):
                sess.run(None, feed)
            events = json.loads(Path(sess.end_profiling()).read_text())
            by_op: collections.Counter = collections.Counter()
            for e in events:
                if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                    by_op[e["args"]["op_name"]] += e["dur"]
            total = sum(by_op.values())
            shares = ", ".join(f"{op} {t / total:.1%}" for op, t in by_op.most_common(6))
            print(f"length {length}: {total / 2000:.0f} ms per run; {shares}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
