"""`kb-rerank guard export` (the dedicated injection model's int8 ONNX file) and `kb-rerank guard
calibrate --backend onnx-int8`, on a tiny random DeBERTa-v2 checkpoint built here. No database."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the rerank extra (torch, transformers) is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is not installed")
pytest.importorskip("optimum.exporters.onnx", reason="the onnx extra (optimum) is not installed")

from kb_rerank.cli import main as cli  # noqa: E402
from kb_rerank.guard.model import ONNX_DIR, THRESHOLD_FILE, InjectionModel  # noqa: E402
from kb_rerank.testing.tiny_model import build_tiny_injection_model, sample_words  # noqa: E402


def test_export_then_calibrate_the_int8_backend(tmp_path, capsys, monkeypatch):
    folder = build_tiny_injection_model(tmp_path / "m", seed=1)
    monkeypatch.setenv("KB_GUARD_MODEL", str(folder))  # the command's default folder
    assert cli.main(["guard", "export"]) == 0
    out = capsys.readouterr().out
    assert str(folder / ONNX_DIR) in out and "--backend onnx-int8" in out
    assert (folder / ONNX_DIR / "model.onnx").stat().st_size > 0
    stamp = (folder / ONNX_DIR / "kb-export.json").read_text()
    assert cli.main(["guard", "export"]) == 0  # reused, not redone
    assert (folder / ONNX_DIR / "kb-export.json").read_text() == stamp

    rng = np.random.default_rng(0)
    words = sample_words()
    rows = [{"text": " ".join(rng.choice(words, size=int(rng.integers(5, 60)))), "lang": "en", "kind": "faq"}
            for _ in range(120)]
    corpus = tmp_path / "ordinary.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert cli.main(["guard", "calibrate", "--backend", "onnx-int8", "--ordinary", str(corpus)]) == 0
    out = capsys.readouterr().out
    saved = json.loads((folder / ONNX_DIR / THRESHOLD_FILE).read_text())
    assert saved["backend"] == "onnx-int8" and f"threshold {saved['threshold']:.6g}" in out and "onnx-int8" in out
    assert not (folder / THRESHOLD_FILE).exists()  # the torch backend is still uncalibrated
    assert InjectionModel(folder, backend="onnx-int8").load().threshold == saved["threshold"]

    # --force exports again and drops the int8 calibration (the new file is calibrated again)
    assert cli.main(["guard", "export", "--force"]) == 0
    assert not (folder / ONNX_DIR / THRESHOLD_FILE).exists()


def test_export_errors_are_plain(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KB_GUARD_MODEL", raising=False)
    assert cli.main(["guard", "export"]) == 2
    assert "--model or KB_GUARD_MODEL" in capsys.readouterr().err
    assert cli.main(["guard", "export", "--model", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()
    # calibrating the int8 backend before exporting names the command to run
    folder = build_tiny_injection_model(tmp_path / "m", seed=1)
    corpus = tmp_path / "ordinary.jsonl"
    corpus.write_text(json.dumps({"text": "a passage", "lang": "en", "kind": "faq"}) + "\n")
    assert cli.main(["guard", "calibrate", "--model", str(folder), "--backend", "onnx-int8",
                     "--ordinary", str(corpus)]) == 2
    err = capsys.readouterr().err
    assert "kb-rerank guard export" in err and "Traceback" not in err
    assert not (folder / ONNX_DIR).exists()
