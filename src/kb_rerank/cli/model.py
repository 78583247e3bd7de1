"""`kb-rerank` commands: cross-encoder files (model)."""

from __future__ import annotations

import sys
from pathlib import Path

from kb_rerank.cli.common import command_group, command
from kb_rerank.core.settings import Settings


def cmd_model(args, settings: Settings) -> int:
    """`kb-rerank model export`: the cross-encoder as ONNX (and dynamic int8) for
    KB_RERANKER_BACKEND=onnx, written once under KB_RERANKER_ONNX_DIR (<data_dir>/onnx)."""
    from kb_rerank.models.onnx import export_model

    model = args.model or settings.reranker_model
    quantize = args.quantize or settings.reranker_onnx_quantize
    root = Path(args.out) if args.out else settings.onnx_export_root
    folder = export_model(model, root, quantize=quantize, force=args.force)
    print(folder)
    return 0


def cmd_model_tiny(args, settings: Settings) -> int:
    """`kb-rerank model tiny DIR`: the tests' tiny cross-encoder (kb_rerank.testing.tiny_model:
    XLM-RoBERTa layout, random weights, a built-in vocabulary), written with no network, so that
    an offline machine can try KB_RERANKER_MODEL=DIR end to end. Named here, on request only:
    the service never imports the testing package."""
    import shlex

    from kb_rerank.core.extras import require

    for module in ("torch", "transformers"):
        require(module, "rerank", "writing a cross-encoder folder")
    from kb_rerank.testing.tiny_model import build_tiny_cross_encoder

    folder = Path(args.folder).expanduser().resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        print(f"kb-rerank: error: model tiny: {folder} exists and is not an empty folder", file=sys.stderr)
        return 2
    build_tiny_cross_encoder(folder, seed=args.seed)
    print(f"wrote a tiny cross-encoder to {folder} (random weights: it runs the rerank path, its scores mean nothing)")
    print(f"use it: KB_RERANKER_MODEL={shlex.quote(str(folder))} kb-rerank serve --dev")
    return 0


def register(sub) -> None:
    text = "cross-encoder files: a tiny offline one to try the service, an ONNX export for KB_RERANKER_BACKEND=onnx"
    mo_sub = command_group(sub, "model", dest="model_action", help=text)
    mx = command(mo_sub, "export", help="export KB_RERANKER_MODEL to ONNX once (reused afterwards); prints the "
                                         "folder the onnx backend loads")
    mx.add_argument("--model", default=None, help="hub id (in the local HF cache) or folder; default KB_RERANKER_MODEL")
    mx.add_argument("--quantize", choices=["none", "int8"], default=None,
                    help="int8: also the dynamic int8 version (of the graph after ONNX Runtime's transformer "
                         "fusions); default KB_RERANKER_ONNX_QUANTIZE (none)")
    mx.add_argument("--out", default=None, help="export root; default KB_RERANKER_ONNX_DIR (<data_dir>/onnx)")
    mx.add_argument("--force", action="store_true", help="export again even if a complete export exists")
    mx.set_defaults(func=cmd_model)
    mt = command(mo_sub, "tiny", help="write a tiny cross-encoder (random weights, about 300 kB, no download) to a "
                                       "folder, to try the rerank path offline: its scores mean nothing")
    mt.add_argument("folder", metavar="DIR", help="the folder to write (created; must be empty if it exists)")
    mt.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    mt.set_defaults(func=cmd_model_tiny)
