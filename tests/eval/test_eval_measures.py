"""Tests for kb_rerank.eval.measures: trec_eval-style nDCG/MRR/recall and the BEIR loader.

All expected values are computed by hand (arithmetic in the comments).
log2(2) = 1, log2(3) = 1.5849625, log2(4) = 2  ->  1/log2(3) = 0.6309298, 2/log2(3) = 1.2618595
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kb_rerank.eval.measures import BeirCollection, evaluate_run, load_beir, mrr_at_k, ndcg_at_k, recall_at_k

RANKED = ["d3", "d1", "d2"]
QRELS = {"d1": 2, "d2": 1}


# --------------------------------------------------------------------------- nDCG


def test_ndcg_graded_example():
    # DCG@10  = 0/log2(2) + 2/log2(3) + 1/log2(4) = 0 + 1.2618595 + 0.5 = 1.7618595
    # IDCG@10 = 2/log2(2) + 1/log2(3)             = 2 + 0.6309298       = 2.6309298
    # nDCG    = 1.7618595 / 2.6309298 = 0.6696718
    assert ndcg_at_k(RANKED, QRELS, 10) == pytest.approx(0.66967182, abs=1e-7)


def test_ndcg_uses_linear_gain_not_exponential():
    # With 2^rel - 1 the value would be (3/log2(3) + 1/2) / (3 + 1/log2(3))
    #   = (1.8927893 + 0.5) / 3.6309298 = 0.6590018  -- trec_eval's ndcg_cut does not do that.
    assert ndcg_at_k(RANKED, QRELS, 10) != pytest.approx(0.6590018, abs=1e-4)


def test_ndcg_k_cutoff():
    # k=2: DCG@2 = 0/1 + 2/log2(3) = 1.2618595; IDCG@2 = 2/1 + 1/log2(3) = 2.6309298
    #      nDCG@2 = 1.2618595 / 2.6309298 = 0.4796249
    assert ndcg_at_k(RANKED, QRELS, 2) == pytest.approx(0.47962493, abs=1e-7)
    # k=1: DCG@1 = 0 (d3 unjudged); IDCG@1 = 2 -> 0
    assert ndcg_at_k(RANKED, QRELS, 1) == 0.0


def test_ndcg_ideal_includes_unretrieved_relevant():
    # ranked [d1], qrels {d1:1, d2:1}: DCG = 1/1 = 1; IDCG = 1/1 + 1/log2(3) = 1.6309298
    # nDCG = 1 / 1.6309298 = 0.6131472
    assert ndcg_at_k(["d1"], {"d1": 1, "d2": 1}, 10) == pytest.approx(0.61314719, abs=1e-7)


def test_ndcg_ideal_sorted_by_grade():
    # ranked [a, b, c], qrels {a:1, b:3, c:2}
    # DCG  = 1/1 + 3/log2(3) + 2/log2(4) = 1 + 1.8927893 + 1   = 3.8927893
    # IDCG = 3/1 + 2/log2(3) + 1/log2(4) = 3 + 1.2618595 + 0.5 = 4.7618595
    # nDCG = 0.8174935
    assert ndcg_at_k(["a", "b", "c"], {"a": 1, "b": 3, "c": 2}, 10) == pytest.approx(0.81749351, abs=1e-7)


def test_ndcg_perfect_and_empty_ranking():
    assert ndcg_at_k(["d1", "d2"], QRELS, 10) == pytest.approx(1.0)
    assert ndcg_at_k([], QRELS, 10) == 0.0


def test_ndcg_negative_judgment_counts_as_zero():
    # qrels {d1:-1, d2:1}, ranked [d1, d2]: DCG = 0 + 1/log2(3) = 0.6309298; IDCG = 1/1 = 1
    assert ndcg_at_k(["d1", "d2"], {"d1": -1, "d2": 1}, 10) == pytest.approx(0.63092975, abs=1e-7)


def test_duplicates_in_ranking_count_once():
    # [d3, d3, d1] -> [d3, d1]: DCG = 0 + 1/log2(3) = 0.6309298; IDCG = 1 -> 0.6309298
    assert ndcg_at_k(["d3", "d3", "d1"], {"d1": 1}, 10) == pytest.approx(0.63092975, abs=1e-7)
    # [d1, d1] must not score above the ideal (1.0)
    assert ndcg_at_k(["d1", "d1"], {"d1": 1}, 10) == pytest.approx(1.0)
    assert mrr_at_k(["d3", "d3", "d1"], {"d1": 1}, 10) == 0.5
    assert recall_at_k(["d1", "d1"], {"d1": 1, "d2": 1}, 10) == 0.5


def test_no_relevant_docs_gives_zero():
    for fn in (ndcg_at_k, mrr_at_k, recall_at_k):
        assert fn(RANKED, {}, 10) == 0.0
        assert fn(RANKED, {"d3": 0, "d1": 0}, 10) == 0.0


@pytest.mark.parametrize("fn", [ndcg_at_k, mrr_at_k, recall_at_k])
@pytest.mark.parametrize("k", [0, -1])
def test_k_must_be_positive(fn, k):
    with pytest.raises(ValueError):
        fn(RANKED, QRELS, k)


# --------------------------------------------------------------------------- MRR


def test_mrr():
    # first relevant (d1) at rank 2 -> 1/2
    assert mrr_at_k(RANKED, QRELS, 10) == 0.5
    assert mrr_at_k(RANKED, QRELS, 2) == 0.5
    # k=1: only d3 (unjudged) -> 0
    assert mrr_at_k(RANKED, QRELS, 1) == 0.0
    # judged-but-zero docs are not relevant: first rel>0 is d2 at rank 3 -> 1/3
    assert mrr_at_k(["d3", "d1", "d2"], {"d3": 0, "d1": 0, "d2": 1}, 10) == pytest.approx(1 / 3)
    assert mrr_at_k(["d1"], QRELS, 10) == 1.0


# --------------------------------------------------------------------------- recall


def test_recall():
    qrels = {"d1": 2, "d2": 1, "d5": 1, "d3": 0}  # 3 relevant (d3 judged non-relevant)
    ranked = ["d3", "d1", "d2", "d4"]
    assert recall_at_k(ranked, qrels, 4) == pytest.approx(2 / 3)  # d1, d2 of {d1,d2,d5}
    assert recall_at_k(ranked, qrels, 100) == pytest.approx(2 / 3)  # k beyond the list
    assert recall_at_k(ranked, qrels, 2) == pytest.approx(1 / 3)  # only d1
    assert recall_at_k(ranked, qrels, 1) == 0.0  # only d3 (grade 0)
    assert recall_at_k(["d5", "d2", "d1"], qrels, 3) == 1.0


# --------------------------------------------------------------------------- evaluate_run


def test_evaluate_run_averages_over_queries_with_relevant_docs():
    qrels = {
        "q1": {"d1": 2, "d2": 1},
        "q2": {"d4": 1},  # missing from the run -> zeros
        "q3": {"d9": 0},  # no relevant doc -> not evaluated
    }
    run = {"q1": RANKED, "q3": ["d9"], "q4": ["d1"]}  # q4 has no qrels -> ignored
    res = evaluate_run(run, qrels, k=10, recall_k=100)
    # q1: ndcg 0.6696718 (see above), mrr 1/2, recall 2/2 = 1
    # q2: 0, 0, 0
    # means over 2 queries: ndcg 0.6696718/2 = 0.3348359, mrr 0.25, recall 0.5
    assert res["num_queries"] == 2
    assert res["num_missing"] == 1
    assert res["ndcg@10"] == pytest.approx(0.33483591, abs=1e-7)
    assert res["mrr@10"] == pytest.approx(0.25)
    assert res["recall@100"] == pytest.approx(0.5)
    assert set(res["per_query"]) == {"q1", "q2"}
    assert res["per_query"]["q1"] == pytest.approx({"ndcg@10": 0.66967182, "mrr@10": 0.5, "recall@100": 1.0})
    assert res["per_query"]["q2"] == {"ndcg@10": 0.0, "mrr@10": 0.0, "recall@100": 0.0}


def test_evaluate_run_key_names_follow_k():
    res = evaluate_run({"q1": RANKED}, {"q1": QRELS}, k=2, recall_k=2)
    # nDCG@2 = 0.4796249 (above); MRR@2 = 1/2; recall@2 = 1 of 2 relevant (d1) = 0.5
    assert res["ndcg@2"] == pytest.approx(0.47962493, abs=1e-7)
    assert res["mrr@2"] == 0.5
    assert res["recall@2"] == 0.5


def test_evaluate_run_empty():
    res = evaluate_run({}, {})
    assert res["num_queries"] == 0
    assert res["ndcg@10"] == res["mrr@10"] == res["recall@100"] == 0.0
    assert res["per_query"] == {}


# --------------------------------------------------------------------------- BEIR loader


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")


def _make_beir(root: Path, *, header: bool = True, split: str = "test") -> Path:
    root.mkdir(parents=True, exist_ok=True)
    _write_jsonl(
        root / "corpus.jsonl",
        [
            {"_id": "d1", "title": "Cats", "text": "Cats purr."},
            {"_id": "d2", "title": "", "text": "Dogs bark."},
            {"_id": 3, "text": "Mèo kêu meo meo."},  # int id, no title
        ],
    )
    _write_jsonl(
        root / "queries.jsonl",
        [
            {"_id": "q1", "text": "what do cats do"},
            {"_id": "q2", "text": "dogs"},
            {"_id": "q3", "text": "unjudged query"},  # no qrels -> dropped
        ],
    )
    (root / "qrels").mkdir(exist_ok=True)
    lines = ["query-id\tcorpus-id\tscore"] if header else []
    lines += ["q1\td1\t2", "q1\t3\t1", "q2\td2\t1", "q2\td1\t0", "q9\td1\t1", ""]  # q9: no query text
    (root / "qrels" / f"{split}.tsv").write_text("\n".join(lines), encoding="utf-8")
    return root


def test_load_beir(tmp_path):
    col = load_beir(_make_beir(tmp_path / "mini"))
    assert isinstance(col, BeirCollection)
    assert col.name == "mini"
    assert col.corpus == {
        "d1": ("Cats", "Cats purr."),
        "d2": ("", "Dogs bark."),
        "3": ("", "Mèo kêu meo meo."),
    }
    assert col.queries == {"q1": "what do cats do", "q2": "dogs"}
    assert col.qrels == {"q1": {"d1": 2, "3": 1}, "q2": {"d2": 1, "d1": 0}}


def test_load_beir_without_header_and_other_split(tmp_path):
    root = _make_beir(tmp_path / "c", header=False, split="dev")
    col = load_beir(root, split="dev")
    assert set(col.queries) == {"q1", "q2"}
    assert col.qrels["q1"] == {"d1": 2, "3": 1}
    with pytest.raises(ValueError, match=r"test\.tsv"):
        load_beir(root)  # no qrels/test.tsv


def test_load_beir_round_trip_into_evaluate_run(tmp_path):
    col = load_beir(_make_beir(tmp_path / "c"))
    res = evaluate_run({"q1": ["d1", "3"], "q2": ["d2"]}, col.qrels)
    assert res["num_queries"] == 2
    assert res["ndcg@10"] == pytest.approx(1.0)


@pytest.mark.parametrize("missing", ["corpus.jsonl", "queries.jsonl", "qrels/test.tsv"])
def test_load_beir_names_missing_file(tmp_path, missing):
    root = _make_beir(tmp_path / "c")
    (root / missing).unlink()
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        load_beir(root)


def test_load_beir_not_a_directory(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_beir(tmp_path / "nope")


def test_load_beir_bad_rows(tmp_path):
    root = _make_beir(tmp_path / "c")
    (root / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\thigh\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"test\.tsv:2"):
        load_beir(root)
    (root / "qrels" / "test.tsv").write_text("q1 d1 1\n", encoding="utf-8")  # spaces, not tabs
    with pytest.raises(ValueError, match=r"test\.tsv:1"):
        load_beir(root)


def test_load_beir_duplicate_doc_and_bad_json(tmp_path):
    root = _make_beir(tmp_path / "c")
    _write_jsonl(root / "corpus.jsonl", [{"_id": "d1", "text": "a"}, {"_id": "d1", "text": "b"}])
    with pytest.raises(ValueError, match="duplicate document id"):
        load_beir(root)
    (root / "corpus.jsonl").write_text('{"_id": "d1", "text": "a"}\n{not json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"corpus\.jsonl:2"):
        load_beir(root)
