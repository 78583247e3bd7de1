"""The ONNX cross-encoder (issue 16, item 1, ``KB_RERANKER_BACKEND=onnx``): ``kb-rerank model
export`` of the tiny model, agreement with the in-process (flag) backend, the shared
tokenisation and length-sorted batching, int8 made from the fused graph (ONNX Runtime's
transformer fusions: the graph it quantises agrees with fp32 like the export itself), and the fallbacks of the service (export
missing or broken, timeout) with /readyz naming the backend."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
import uuid

import onnx
import pytest
from litestar.testing import TestClient
from scipy.stats import spearmanr

from kb_rerank.cli import main as cli
from kb_rerank.app import build_reranker, create_app
from kb_rerank.models.cross_encoder import Reranker, RerankerTimeout, RerankerUnavailable
from kb_rerank.models.onnx import MANIFEST, OnnxReranker, _copy_preprocessors, _optimize_graph, export_dir_for
from kb_rerank.testing.tiny_model import sample_words

from tests.live_server import OPS, OPS_TOKEN
from tests.endpoints.test_rerank_route import SECRET, bearer, tiny_model_dir  # noqa: F401 - module fixture

MAX_LENGTH = 64  # small, so that the long passages below are truncated


def _pairs(n: int = 40) -> tuple[str, list[str]]:
    words = sample_words()
    query = " ".join(words[3:9])
    # lengths from 1 word to well past MAX_LENGTH tokens; some share the query's words
    passages = [" ".join(words[(7 * i) % 300:(7 * i) % 300 + 1 + (i * 5) % 90]) for i in range(n)]
    return query, passages


@pytest.fixture(scope="module")
def export_root(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("onnx-exports")
    assert cli.main(["model", "export", "--model", str(tiny_model_dir), "--quantize", "int8",
                     "--out", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def flag(tiny_model_dir):
    r = Reranker(str(tiny_model_dir), device="cpu", max_length=MAX_LENGTH, batch_size=8)
    r.load()
    yield r
    r.close()


def _onnx(settings, model_dir, root, quantize="none", **kw):
    s = settings.with_(reranker_backend="onnx", reranker_model=str(model_dir), reranker_onnx_dir=root,
                       reranker_onnx_quantize=quantize, rerank_max_length=MAX_LENGTH, rerank_batch_size=8, **kw)
    return build_reranker(s)


def test_export_writes_both_folders_once_and_reuses_them(tiny_model_dir, export_root, capsys):
    fp32 = export_dir_for(export_root, str(tiny_model_dir), "none")
    int8 = export_dir_for(export_root, str(tiny_model_dir), "int8")
    for folder in (fp32, int8):
        assert (folder / "model.onnx").is_file() and (folder / "tokenizer.json").is_file()
        assert json.loads((folder / MANIFEST).read_text())["model"] == str(tiny_model_dir)
    ops = {n.op_type for n in onnx.load(str(int8 / "model.onnx")).graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops  # dynamic int8
    # of the fused graph: attention is one quantised node per layer, no Softmax left
    assert {"QAttention", "SkipLayerNormalization", "BiasGelu"} <= ops and "Softmax" not in ops
    fused = json.loads((int8 / MANIFEST).read_text())["graph_optimization"]["fused_operators"]
    assert fused["Attention"] == 2 and fused["SkipLayerNormalization"] == 4  # 2 layers
    assert not export_dir_for(export_root, str(tiny_model_dir), "int8", optimize=False).exists()
    assert "MatMulInteger" not in {n.op_type for n in onnx.load(str(fp32 / "model.onnx")).graph.node}
    before = (int8 / "model.onnx").stat().st_mtime_ns, (fp32 / "model.onnx").stat().st_mtime_ns
    capsys.readouterr()
    assert cli.main(["model", "export", "--model", str(tiny_model_dir), "--quantize", "int8",
                     "--out", str(export_root)]) == 0
    out = capsys.readouterr().out
    assert "reusing" in out and out.strip().endswith(str(int8))
    assert ((int8 / "model.onnx").stat().st_mtime_ns, (fp32 / "model.onnx").stat().st_mtime_ns) == before


def test_fp32_agrees_with_the_flag_backend(settings, tiny_model_dir, export_root, flag):
    rr = _onnx(settings, tiny_model_dir, export_root)
    assert isinstance(rr, OnnxReranker) and rr.backend == "onnx"
    rr.load()
    try:
        query, passages = _pairs()
        # the same tokenisation (query and pair truncation) is the parent's code
        assert rr._encode(query, passages) == flag._encode(query, passages)
        assert max(len(e["input_ids"]) for e in flag._encode(query, passages)) == MAX_LENGTH
        a, b = flag.score(query, passages), rr.score(query, passages)
        assert all(0.0 <= x <= 1.0 for x in b)
        assert spearmanr(a, b).statistic >= 0.99
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
        # length-sorted batches of 8, results back in input order
        batches = rr.batches
        assert rr.score(query, passages[::-1]) == pytest.approx(b[::-1], abs=1e-6)
        assert rr.batches - batches == 5
        assert rr.info()["quantize"] == "none" and rr.ready
    finally:
        rr.close()


def test_the_fused_graph_agrees_with_the_flag_backend(settings, tiny_model_dir, export_root, flag, tmp_path):
    """The graph that int8 is made from (fp32 after the fusions) scores like the plain export."""
    fp32 = export_dir_for(export_root, str(tiny_model_dir), "none")
    fused = tmp_path / "fused"
    fused.mkdir()
    info = _optimize_graph(fp32, fused, log=lambda *_: None)
    assert info["fused_operators"]["Attention"] == 2
    _copy_preprocessors(fp32, fused)
    (fused / MANIFEST).write_text("{}")
    rr = _onnx(settings, tiny_model_dir, export_root)
    rr.export_dir = fused
    rr.load()
    try:
        ops = {n.op_type for n in onnx.load(str(fused / "model.onnx")).graph.node}
        assert "Attention" in ops and "Softmax" not in ops
        query, passages = _pairs()
        a, b = flag.score(query, passages), rr.score(query, passages)
        assert spearmanr(a, b).statistic >= 0.99
        assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4
    finally:
        rr.close()


def test_an_int8_export_from_before_the_fusions_is_quantized_again(tiny_model_dir, export_root, tmp_path, capsys):
    root = tmp_path / "old"
    shutil.copytree(export_root, root)
    int8 = export_dir_for(root, str(tiny_model_dir), "int8")
    fp32 = export_dir_for(root, str(tiny_model_dir), "none")
    manifest = json.loads((int8 / MANIFEST).read_text())
    del manifest["graph_optimization"]
    (int8 / MANIFEST).write_text(json.dumps(manifest))
    fp32_before = (fp32 / "model.onnx").stat().st_mtime_ns
    capsys.readouterr()
    assert cli.main(["model", "export", "--model", str(tiny_model_dir), "--quantize", "int8", "--out", str(root)]) == 0
    out = capsys.readouterr().out
    assert "predates the graph optimisation" in out and f"reusing {fp32}" in out
    assert json.loads((int8 / MANIFEST).read_text())["graph_optimization"]["fused_operators"]["Attention"] == 2
    assert (fp32 / "model.onnx").stat().st_mtime_ns == fp32_before
    assert not list(int8.parent.glob(".*tmp"))  # the fused fp32 intermediate is removed


def test_int8_runs_and_is_reported(settings, tiny_model_dir, export_root, flag):
    rr = _onnx(settings, tiny_model_dir, export_root, quantize="int8")
    rr.load()
    try:
        query, passages = _pairs()
        b = rr.score(query, passages)
        rho = spearmanr(flag.score(query, passages), b).statistic
        print(f"int8 Spearman against flag fp32 (tiny model, 40 pairs): {rho:.4f}")
        assert all(0.0 <= x <= 1.0 for x in b)
        assert rho >= 0.8  # quantisation noise, not a different model
        assert rr.info()["quantize"] == "int8"
        assert str(rr.info()["export_dir"]).endswith("int8")
    finally:
        rr.close()


def test_bad_quantize_setting_is_refused(settings, tiny_model_dir, export_root):
    with pytest.raises(ValueError, match="KB_RERANKER_ONNX_QUANTIZE"):
        _onnx(settings, tiny_model_dir, export_root, quantize="int4")


def test_missing_or_broken_export_fails_the_load_with_what_to_run(settings, tiny_model_dir, export_root, tmp_path):
    missing = _onnx(settings, tiny_model_dir, tmp_path / "empty")
    with pytest.raises(RerankerUnavailable):
        missing.load()
    assert missing.state == "failed" and "kb-rerank model export" in missing.last_error
    with pytest.raises(RerankerUnavailable):
        missing.score("q", ["p"])
    missing.close()

    broken_root = tmp_path / "broken"
    src = export_dir_for(export_root, str(tiny_model_dir), "none")
    dst = export_dir_for(broken_root, str(tiny_model_dir), "none")
    shutil.copytree(src, dst)
    (dst / "model.onnx").write_bytes(b"not an onnx file")
    broken = _onnx(settings, tiny_model_dir, broken_root)
    assert asyncio.run(broken.ensure_loaded_async()) is False
    assert broken.state == "failed" and broken.last_error
    broken.close()


def _serve(settings, embedder, tiny_model_dir, root, tenant, *, slow: bool = False, **changes):
    """The app with the reranker it builds itself from the settings (backend onnx)."""
    app = create_app(settings.with_(jwt_secret=SECRET, ops_token=OPS_TOKEN, reranker_backend="onnx",
                                    reranker_model=str(tiny_model_dir), reranker_onnx_dir=root,
                                    rerank_max_length=MAX_LENGTH, **changes), embedder=embedder)
    with TestClient(app) as client:
        rr = app.state.pipeline.reranker
        deadline = time.monotonic() + 30
        while rr.state in ("not_loaded", "loading") and time.monotonic() < deadline:
            time.sleep(0.05)
        if slow:
            run = rr._run_batch
            rr._run_batch = lambda features, **kw: (time.sleep(1.0), run(features, **kw))[1]
        r = client.post("/v1/kb/search/rerank", json={"query": f"ERR_402 at checkout {uuid.uuid4().hex[:6]}"},
                        headers=bearer(tenant))
        ready = client.get("/readyz", headers=OPS).json()
    assert r.status_code == 200, r.text
    return r.json(), ready["model"]


def test_the_service_serves_through_the_onnx_backend(settings, embedder, sample_tenant, tiny_model_dir, export_root):
    body, model = _serve(settings, embedder, tiny_model_dir, export_root, sample_tenant)
    assert model["backend"] == "onnx" and model["state"] == "ready"
    assert body["fallback"] is False and body["fallback_reason"] is None
    assert body["results"] and all(0.0 <= r["rerank_score"] <= 1.0 for r in body["results"])


@pytest.mark.parametrize("case,reason", [("missing", "model_not_ready"), ("timeout", "model_timeout")])
def test_the_service_falls_back_like_the_flag_backend(settings, embedder, sample_tenant, tiny_model_dir,
                                                      export_root, tmp_path, case, reason):
    root = tmp_path / "none" if case == "missing" else export_root
    body, model = _serve(settings, embedder, tiny_model_dir, root, sample_tenant, slow=case == "timeout",
                         rerank_timeout_s=0.3)
    assert body["fallback"] is True and body["fallback_reason"] == reason
    assert model["backend"] == "onnx"
    assert model["state"] == ("failed" if case == "missing" else "ready")
    if case == "missing":
        assert "kb-rerank model export" in model["last_error"]


def test_ascore_timeout_is_the_parents(settings, tiny_model_dir, export_root):
    rr = _onnx(settings, tiny_model_dir, export_root, rerank_timeout_s=0.2)
    rr.load()
    run = rr._run_batch
    rr._run_batch = lambda features, **kw: (time.sleep(0.6), run(features, **kw))[1]
    try:
        with pytest.raises(RerankerTimeout):
            asyncio.run(rr.ascore("q", ["p"]))
        assert rr.timeouts == 1
    finally:
        rr.close()
