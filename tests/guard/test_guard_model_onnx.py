"""The dedicated injection model's ONNX int8 backend (KB_GUARD_MODEL_BACKEND=onnx-int8) and its
batched scoring, on a tiny random DeBERTa-v2 checkpoint built here and exported by the real
code (:func:`kb_rerank.guard.model.export_int8`): loading, the errors a missing or broken
export gives, the calibration of each backend on its own, and batched votes giving the
verdicts of one-by-one scoring. No database."""

from __future__ import annotations

import asyncio
import json
import shutil
import time

import numpy as np
import pytest

pytest.importorskip("transformers", reason="the rerank extra (torch, transformers) is not installed")
pytest.importorskip("onnxruntime", reason="the onnx extra (onnxruntime) is not installed")
pytest.importorskip("optimum.exporters.onnx", reason="the onnx extra (optimum) is not installed")

from kb_rerank.core.settings import Settings  # noqa: E402
from kb_rerank.guard.model import (ONNX_DIR, THRESHOLD_FILE, GuardModelError, InjectionModel,  # noqa: E402
                                   calibrate, export_int8)
from kb_rerank.guard.verdict import Voters, chunk_flags, inspect_documents, voters_for  # noqa: E402
from kb_rerank.testing.tiny_model import build_tiny_injection_model, sample_words  # noqa: E402

WORDS = sample_words()


def _texts(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(5, 120)))) for _ in range(n)]


def _ordinary(n: int = 200) -> list[dict]:
    langs, kinds = ("en", "vi"), ("manual", "faq")
    return [{"text": t, "lang": langs[i % 2], "kind": kinds[i % 2]} for i, t in enumerate(_texts(n, 1))]


def _ranks(x: np.ndarray) -> np.ndarray:
    return np.argsort(np.argsort(x))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = build_tiny_injection_model(tmp_path_factory.mktemp("tiny-guard-onnx") / "model", seed=0)
    export_int8(folder, log=lambda *a: None)
    return folder


@pytest.fixture
def folder(exported, tmp_path):
    """A copy of the exported folder a test may calibrate or break."""
    return shutil.copytree(exported, tmp_path / "model")


def test_int8_loads_through_the_real_code(exported):
    m = InjectionModel(exported, need_threshold=False, backend="onnx-int8").load()
    assert m.label == 1 and m.device == "cpu" and m.files == exported / ONNX_DIR
    texts = _texts(80, 2) + [" ".join(["word"] * 2000)]  # a long one is cut at max_length
    p = m.probabilities(texts)
    assert p.shape == (81,) and np.all((p >= 0) & (p <= 1)) and len(set(np.round(p, 6))) > 70
    fp32 = InjectionModel(exported, need_threshold=False).load().probabilities(texts)
    # the same network (scores ordered alike), quantised (not the same scores: calibrated apart)
    assert np.corrcoef(_ranks(p), _ranks(fp32))[0, 1] > 0.8
    assert np.max(np.abs(p - fp32)) > 1e-4
    manifest = json.loads((exported / ONNX_DIR / "kb-export.json").read_text())
    assert manifest["quantize"] == "int8"
    # a complete export is reused, not redone
    said = []
    assert export_int8(exported, log=said.append) == exported / ONNX_DIR and said[0].startswith("reusing")


def test_a_missing_or_broken_export_names_the_setting_and_the_command(tmp_path, folder):
    bare = build_tiny_injection_model(tmp_path / "bare", seed=0)
    with pytest.raises(GuardModelError, match=r"KB_GUARD_MODEL_BACKEND=onnx-int8.*kb-rerank guard export"):
        InjectionModel(bare, need_threshold=False, backend="onnx-int8").load()
    with pytest.raises(GuardModelError, match="KB_GUARD_MODEL_BACKEND=onnx-int8"):
        voters_for(Settings(guard_model=bare, guard_model_backend="onnx-int8", guard_lexical_threshold=1.0))
    # an interrupted export (no manifest) is not used
    (folder / ONNX_DIR / "kb-export.json").rename(folder / ONNX_DIR / "kb-export.json.bak")
    with pytest.raises(GuardModelError, match="no complete int8 export"):
        InjectionModel(folder, need_threshold=False, backend="onnx-int8").load()
    (folder / ONNX_DIR / "kb-export.json.bak").rename(folder / ONNX_DIR / "kb-export.json")
    (folder / ONNX_DIR / "model.onnx").write_bytes(b"not an onnx file")
    with pytest.raises(GuardModelError, match=r"KB_GUARD_MODEL_BACKEND=onnx-int8: cannot load .*guard export"):
        InjectionModel(folder, need_threshold=False, backend="onnx-int8").load()
    with pytest.raises(GuardModelError, match="not one of torch, onnx-int8"):
        InjectionModel(folder, backend="onnx")


def test_each_backend_is_calibrated_on_its_own(folder):
    rows = _ordinary()
    torch_cal, _ = calibrate(InjectionModel(folder, need_threshold=False), rows, target_fpr=0.02)
    assert (folder / THRESHOLD_FILE).is_file() and not (folder / ONNX_DIR / THRESHOLD_FILE).exists()
    # the torch calibration does not serve the int8 backend
    with pytest.raises(GuardModelError, match="--backend onnx-int8"):
        InjectionModel(folder, backend="onnx-int8").load()
    int8 = InjectionModel(folder, need_threshold=False, backend="onnx-int8")
    int8_cal, counts = calibrate(int8, rows, target_fpr=0.02)
    p = int8.probabilities([r["text"] for r in rows])
    assert int8_cal.backend == "onnx-int8" and int8_cal.flagged == int((p >= int8_cal.threshold).sum())
    assert int8_cal.threshold != torch_cal.threshold
    saved = json.loads((folder / ONNX_DIR / THRESHOLD_FILE).read_text())
    assert saved["backend"] == "onnx-int8" and saved["groups"] == counts
    assert InjectionModel(folder).load().threshold == torch_cal.threshold
    loaded = InjectionModel(folder, backend="onnx-int8").load()
    assert loaded.threshold == int8_cal.threshold and loaded.version.endswith(f"[onnx-int8]@{int8_cal.threshold:.6g}")
    # a calibration copied to the other backend's folder is refused, not trusted
    shutil.copy(folder / THRESHOLD_FILE, folder / ONNX_DIR / THRESHOLD_FILE)
    with pytest.raises(GuardModelError, match="calibrates the torch backend"):
        InjectionModel(folder, backend="onnx-int8").load()


@pytest.mark.parametrize("backend", ["torch", "onnx-int8"])
def test_batched_votes_give_the_verdicts_of_one_by_one(folder, backend):
    texts = _texts(40, 3)
    one = InjectionModel(folder, need_threshold=False, backend=backend, batch_size=1)
    calibrate(one, [{"text": t, "lang": "en", "kind": "manual"} for t in texts], target_fpr=0.2, min_group=5)
    alone = one.probabilities(texts)
    batched = InjectionModel(folder, backend=backend, batch_size=8).load()
    together = batched.probabilities(texts)
    assert np.allclose(together, alone, atol=1e-5)
    assert [bool(x) for x in together >= batched.threshold] == [bool(x) for x in alone >= one.threshold]
    if backend == "onnx-int8":
        # int8 quantises a pass's activations with one scale over its texts: in passes of 8 a
        # score moves with its companions, so the service reads one text a pass
        assert batched.batch_size == 1
        mixed = InjectionModel(folder, backend=backend, batch_size=8, int8_batches=True).load()
        assert np.max(np.abs(mixed.probabilities(texts) - alone)) > 1e-3
    voters = Voters(model=batched)
    votes = voters.votes(texts)  # the ingestion path: a document's chunks together
    single = [chunk_flags(t, voters=Voters(model=one)) for t in texts]

    def verdict(f):  # the decision and its reasons (a float's last digits may differ in a batch)
        return f.injection_flag, f.strong, f.injection_reasons

    assert [verdict(chunk_flags(t, votes=v)) for t, v in zip(texts, votes)] == [verdict(f) for f in single]
    assert sum(f.injection_flag for f in single) == 8  # 20 % of 40: the model voted
    seen = asyncio.run(inspect_documents(texts, 5.0, voters=voters))  # the /v2/rerank path
    assert [f.injection_flag for f in seen.flags] == [f.injection_flag for f in single]
    assert seen.unclassified == 0


def test_no_batch_starts_after_the_deadline(exported):
    texts = _texts(20, 4)
    for backend in ("torch", "onnx-int8"):
        m = InjectionModel(exported, need_threshold=False, backend=backend, batch_size=4).load()
        assert np.isnan(m.probabilities(texts, deadline=time.monotonic() - 1)).all()
        assert not np.isnan(m.probabilities(texts, deadline=time.monotonic() + 60)).any()
        assert Voters(model=m).votes(texts, deadline=time.monotonic() - 1) == [None] * 20
    # /v2/rerank: a hard cap already passed leaves every document unclassified, not flagged
    seen = asyncio.run(inspect_documents(texts, 5.0, voters=Voters(model=m), embed_timeout_s=0.0))
    assert seen.unclassified == 20 and not any(f.injection_flag for f in seen.flags)
