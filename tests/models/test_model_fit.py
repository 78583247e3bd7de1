"""Which model fits which machine (bench/model_cost.py --fit): the published
architectures of kb_rerank.testing.tiny_model.CROSS_ENCODER_ARCHS build with their published
sizes, the one transformers cannot build says so, and the fit arithmetic is right."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kb_rerank.testing.tiny_model import (
    CROSS_ENCODER_ARCHS,
    ArchitectureUnavailable,
    build_random_cross_encoder,
    cross_encoder_config,
)

ROOT = Path(__file__).resolve().parents[2]
PARAMS_TOLERANCE = 0.02  # built parameter count within 2% of the published one
BUILDABLE = [name for name, e in CROSS_ENCODER_ARCHS.items() if "unavailable" not in e]

# the transformers class each published config.json names in "architectures"
EXPECTED_CLASS = {
    "cross-encoder/ms-marco-MiniLM-L-6-v2": "BertForSequenceClassification",
    "cross-encoder/ms-marco-MiniLM-L-12-v2": "BertForSequenceClassification",
    "BAAI/bge-reranker-base": "XLMRobertaForSequenceClassification",
    "mixedbread-ai/mxbai-rerank-xsmall-v1": "DebertaV2ForSequenceClassification",
    "BAAI/bge-reranker-v2-m3": "XLMRobertaForSequenceClassification",
}


def _model_cost():
    spec = importlib.util.spec_from_file_location("kb_bench_model_cost", ROOT / "bench" / "model_cost.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_issue_models_are_all_listed():
    assert set(CROSS_ENCODER_ARCHS) == set(EXPECTED_CLASS) | {"jinaai/jina-reranker-v2-base-multilingual"}


@pytest.mark.parametrize("name", BUILDABLE)
def test_published_architecture_builds_with_published_size(name):
    import torch  # the rerank extra (in dev): a missing one is an error, not a skip
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING

    config = cross_encoder_config(name)
    assert config.num_labels == 1
    published = CROSS_ENCODER_ARCHS[name]["config"]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                "max_position_embeddings"):
        assert getattr(config, key) == published[key]
    with torch.device("meta"):  # the full-size graph without allocating its weights
        model = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)](config)
    assert type(model).__name__ == EXPECTED_CLASS[name]
    assert model.config.num_labels == 1
    n = sum(p.numel() for p in model.parameters())
    want = CROSS_ENCODER_ARCHS[name]["published_params"]
    assert abs(n - want) <= PARAMS_TOLERANCE * want, f"{name}: {n:,} parameters, published {want:,}"


def test_published_sizes_of_the_family():
    assert cross_encoder_config("cross-encoder/ms-marco-MiniLM-L-12-v2").num_hidden_layers == 12
    assert cross_encoder_config("BAAI/bge-reranker-base").max_position_embeddings == 514
    deberta = cross_encoder_config("mixedbread-ai/mxbai-rerank-xsmall-v1")
    assert (deberta.relative_attention, deberta.position_buckets, deberta.num_attention_heads) == (True, 256, 6)


def test_jina_is_not_faked():
    with pytest.raises(ArchitectureUnavailable, match="trust_remote_code"):
        cross_encoder_config("jinaai/jina-reranker-v2-base-multilingual")
    with pytest.raises(ArchitectureUnavailable):
        build_random_cross_encoder(Path("/nonexistent/never-written"), "jinaai/jina-reranker-v2-base-multilingual")
    assert not Path("/nonexistent/never-written").exists()


def test_smallest_model_scores_through_the_service_code(tmp_path):
    """MiniLM-L-6 at its published size, written to disk and scored by the service's Reranker:
    the BERT-style tokenizer frames pairs with token type ids 0/1."""
    import FlagEmbedding  # noqa: F401 - the rerank extra (in dev): missing is an error, not a skip
    from kb_rerank.models.cross_encoder import Reranker

    folder = build_random_cross_encoder(tmp_path / "minilm", "cross-encoder/ms-marco-MiniLM-L-6-v2")
    r = Reranker(str(folder), device="cpu", max_length=128, batch_size=8)
    r.load()
    try:
        assert sum(p.numel() for p in r._model.parameters()) == pytest.approx(22_700_000, rel=PARAMS_TOLERANCE)
        (enc,) = r._encode("the water", ["a long passage " * 100])
        assert len(enc["input_ids"]) == 128  # truncated to max_length, as the benchmark relies on
        assert enc["token_type_ids"][0] == 0 and enc["token_type_ids"][-1] == 1
        scores = r.score("the water", ["water is here", "the car is red"])
        assert len(scores) == 2 and all(0 <= s <= 1 for s in scores)
    finally:
        r.close()


def test_fit_arithmetic():
    mc = _model_cost()
    assert mc.N_CANDIDATES == 40
    assert mc.fit_count(7.5, 300) == 40  # 300 / 7.5 = 40
    assert mc.fit_count(5.0, 300) == 40  # capped at the 40 candidates
    assert mc.fit_count(7.6, 300) == 39
    assert mc.fit_count(33.4, 100) == 2
    assert mc.fit_count(100.0, 100) == 1
    assert mc.fit_count(100.1, 100) == 0
    assert mc.fit_count(1500.0, 300) == 0
    with pytest.raises(ValueError):
        mc.fit_count(0, 300)


def test_fit_table_takes_the_best_backend_at_the_most_threads():
    mc = _model_cost()
    rows = [
        {"model": "m", "backend": "torch-fp32", "threads": 2, "max_length": 256, "ms_per_pair": 20.0},
        {"model": "m", "backend": "onnx-int8", "threads": 2, "max_length": 256, "ms_per_pair": 8.0},
        {"model": "m", "backend": "onnx-int8", "threads": 1, "max_length": 256, "ms_per_pair": 5.0},  # not 2 threads
        {"model": "m", "backend": "torch-fp32", "threads": 2, "max_length": 512, "ms_per_pair": 45.0},
        {"model": "m", "backend": "onnx-int8", "threads": 2, "max_length": 512, "ms_per_pair": 60.0},
    ]
    fit = mc.fit_table({"models": [{"model": "m"}, {"model": "not built"}], "rows": rows})
    assert fit == [
        {"model": "m", "max_length": 256, "threads": 2, "backend": "onnx-int8", "ms_per_pair": 8.0,
         "fit_300ms": 37, "fit_100ms": 12},
        {"model": "m", "max_length": 512, "threads": 2, "backend": "torch-fp32", "ms_per_pair": 45.0,
         "fit_300ms": 6, "fit_100ms": 2},
    ]


def test_fit_table_of_a_run_under_way():
    mc = _model_cost()
    rows = [{"model": "m", "backend": "torch-fp32", "threads": 1, "max_length": 512, "ms_per_pair": 20.0},
            {"model": "m", "backend": "torch-fp32", "threads": 2, "max_length": 128, "ms_per_pair": 5.0}]
    assert [f["max_length"] for f in mc.fit_table({"models": [{"model": "m"}], "rows": rows})] == [128]
