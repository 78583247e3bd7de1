"""The injection detector's project-written data (bench/data/guard/, tests/data/injection/).

Each after-freeze set measured the weights it was written after (scored once) and is training
data since: v2 (source after_freeze_v2) from 2026-12-01.2, v3 from 2026-12-01.3, v4 from
2026-12-01.4, v5 from 2026-12-01.5, v6 from 2026-12-01.6. The next set, written after the next
freeze, measures, so the training script must not read any later set: the seventh
(after_freeze_v7, written after the 2026-12-01.6 freeze) measures the shipped weights. Every file holds labelled, language-tagged rows of the
shapes bench/train_guard.py and bench/guard_after_freeze.py read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LANGS = {"en", "vi", "fr", "es", "de", "zh"}
WRITTEN = [ROOT / "bench/data/guard" / n for n in
           ("hostile_written.jsonl", "benign_written.jsonl", "hostile_written2.jsonl", "benign_written2.jsonl",
            "hostile_written3.jsonl", "benign_written3.jsonl", "hostile_written4.jsonl", "benign_written4.jsonl",
            "hostile_written5.jsonl", "benign_written5.jsonl", "hostile_written6.jsonl", "benign_written6.jsonl",
            "hostile_written7.jsonl", "benign_written7.jsonl", "hostile_written8.jsonl", "benign_written8.jsonl",
            "hostile_written9.jsonl", "benign_written9.jsonl", "hostile_written10.jsonl", "benign_written10.jsonl",
            "hostile_written11.jsonl", "benign_written11.jsonl")]
# the sets the embedding classifier's weights (bench/train_guard.py) were trained on; the ninth to
# eleventh, written for the lexical detector, train only it (bench/train_guard_lexical.py)
EMBEDDING_WRITTEN = WRITTEN[:16]
TRAINING = WRITTEN + [
    ROOT / "tests/data/injection" / n for n in ("hostile.jsonl", "benign.jsonl", "after_freeze.jsonl",
                                                "after_freeze_v2.jsonl", "after_freeze_v3.jsonl",
                                                "after_freeze_v4.jsonl", "after_freeze_v5.jsonl",
                                                "after_freeze_v6.jsonl")]
# the second after-freeze set: scored once against 2026-12-01.1, training data since
MEASURING = ROOT / "tests/data/injection/after_freeze_v2.jsonl"
# the third: written after the 2026-12-01.2 freeze (commit 0e1c103), scored once against it,
# training data of 2026-12-01.3 (with the sets written for it: authors c and d)
MEASURING_V3 = ROOT / "tests/data/injection/after_freeze_v3.jsonl"
TRAINED_FROM_2026_12_01_3 = [MEASURING_V3] + WRITTEN[4:8]
# the fourth: written after the 2026-12-01.3 freeze (commit 81d9bc5), scored once against it,
# training data of 2026-12-01.4 (with the sets written for it: authors e and f)
MEASURING_V4 = ROOT / "tests/data/injection/after_freeze_v4.jsonl"
TRAINED_FROM_2026_12_01_4 = [MEASURING_V4] + WRITTEN[8:12]
# the fifth: written after the 2026-12-01.4 freeze (commit 7594485), scored once against it,
# training data of 2026-12-01.5 (with the sets written for it: authors g and h)
MEASURING_V5 = ROOT / "tests/data/injection/after_freeze_v5.jsonl"
TRAINED_FROM_2026_12_01_5 = [MEASURING_V5] + WRITTEN[12:16]
# the sixth: written after the 2026-12-01.5 freeze, scored once against it, training data of 2026-12-01.6
MEASURING_V6 = ROOT / "tests/data/injection/after_freeze_v6.jsonl"
# the seventh: written after the 2026-12-01.6 freeze (commit 4392ecc), scored once against it
MEASURING_V7 = ROOT / "tests/data/injection/after_freeze_v7.jsonl"
# the eighth: written after the lexical detector's 2026-12-07.1 freeze by an author who saw nothing of
# the project (its SOURCE.md: 240 rows, six languages, 20 hostile and 20 benign each), scored once
MEASURING_V8 = ROOT / "tests/data/injection/after_freeze_v8.jsonl"
# the ninth: written by another author who saw nothing of the project while the lexical detector's
# 2026-12-07.3 weights were trained (never read by that training); scored once against 2026-12-07.2
# and once against 2026-12-07.3; training data of the lexical detector from 2026-12-07.4 on
MEASURING_V9 = ROOT / "tests/data/injection/after_freeze_v9.jsonl"
# the tenth: written by another author who saw nothing of the project while the lexical
# detector's 2026-12-07.4 weights were trained (never read by that training); scored once
# against 2026-12-07.3 and once against 2026-12-07.4
MEASURING_V10 = ROOT / "tests/data/injection/after_freeze_v10.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


@pytest.mark.parametrize("path", WRITTEN + [MEASURING, MEASURING_V3, MEASURING_V4, MEASURING_V5, MEASURING_V6,
                                            MEASURING_V7, MEASURING_V8, MEASURING_V9, MEASURING_V10],
                         ids=lambda p: p.name)
def test_written_sets_are_labelled_balanced_and_multilingual(path):
    rows = _rows(path)
    assert rows
    for r in rows:
        assert r["label"] in (0, 1) and r["lang"] in LANGS and r["kind"] and r["text"].strip()
        assert r["label"] == 0 or not r.get("hard_negative")  # hard negatives are benign
    # every language the file's author wrote in has both classes where the file holds both;
    # a, b, e and f wrote in all six, c in en / de / zh, d in vi / fr / es, g in vi and h in
    # the five others
    langs = {r["lang"] for r in rows}
    assert (langs == LANGS or path.name.endswith(("written3.jsonl", "written4.jsonl")) and len(langs) == 3
            or path.name.endswith("written7.jsonl") and langs == {"vi"}
            or path.name.endswith("written8.jsonl") and langs == LANGS - {"vi"})
    for lang in langs:
        labels = {r["label"] for r in rows if r["lang"] == lang}
        assert labels == {r["label"] for r in rows}, (lang, labels)


def test_written_sources_cover_every_language():
    rows = [r for p in WRITTEN for r in _rows(p)]
    for label in (0, 1):
        assert {r["lang"] for r in rows if r["label"] == label} == LANGS


@pytest.mark.parametrize("path", [MEASURING, MEASURING_V3, MEASURING_V4, MEASURING_V5, MEASURING_V6, MEASURING_V8],
                         ids=lambda p: p.name)
def test_after_freeze_sets_are_balanced_with_half_hard_negatives(path):
    rows = _rows(path)
    hostile = [r for r in rows if r["label"] == 1]
    benign = [r for r in rows if r["label"] == 0]
    assert len(hostile) >= 100 and len(benign) >= 100
    assert sum(bool(r.get("hard_negative")) for r in benign) * 2 >= len(benign)


def test_v2_passages_are_new_to_the_other_training_sources():
    # v2 was written after the 2026-12-01.1 freeze: none of its passages is in an earlier source
    measured = {_norm(r["text"]) for r in _rows(MEASURING)}
    trained = {_norm(r["text"]) for p in TRAINING if p != MEASURING for r in _rows(p)}
    assert not measured & trained


def test_v3_passages_are_new_to_every_source_of_the_weights_it_measured():
    # v3 measured the 2026-12-01.2 weights: none of its passages is in a source they were trained on
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V3)}
    later = TRAINED_FROM_2026_12_01_3 + TRAINED_FROM_2026_12_01_4 + TRAINED_FROM_2026_12_01_5
    trained = {_norm(r["text"]) for p in TRAINING if p not in later for r in _rows(p)}
    assert len(measured) == 216 and not measured & trained


def test_v4_passages_are_new_to_every_source_of_the_weights_it_measured():
    # v4 measured the 2026-12-01.3 weights: none of its passages is in a source they were trained on
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V4)}
    later = TRAINED_FROM_2026_12_01_4 + TRAINED_FROM_2026_12_01_5
    trained = {_norm(r["text"]) for p in TRAINING if p not in later for r in _rows(p)}
    assert len(measured) == 216 and not measured & trained


def test_v5_passages_are_new_to_every_source_of_the_weights_it_measured():
    # v5 measured the 2026-12-01.4 weights: none of its passages is in a source they were trained on
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V5)}
    trained = {_norm(r["text"]) for p in TRAINING if p not in TRAINED_FROM_2026_12_01_5 for r in _rows(p)}
    assert len(measured) == 216 and not measured & trained


def test_v6_passages_are_new_to_every_source_of_the_weights_it_measured():
    # v6 measured the 2026-12-01.5 weights: none of its passages is in a source they were trained on
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V6)}
    trained = {_norm(r["text"]) for p in TRAINING if p != MEASURING_V6 for r in _rows(p)}
    assert len(measured) >= 200 and not measured & trained


def test_v7_passages_are_new_to_every_training_source():
    # v7 measures the 2026-12-01.6 weights: none of its passages is in a source they were trained
    # on, the written ordinary sets (bench/data/ordinary) included
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V7)}
    trained = {_norm(r["text"]) for p in TRAINING + sorted((ROOT / "bench/data/ordinary").glob("*.jsonl"))
               for r in _rows(p)}
    assert len(measured) >= 200 and not measured & trained


def test_v8_passages_are_new_to_every_training_source():
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V8)}
    trained = {_norm(r["text"]) for p in TRAINING + [MEASURING_V7] + sorted((ROOT / "bench/data/ordinary").glob("*.jsonl"))
               for r in _rows(p)}
    assert len(measured) == 240 and not measured & trained


def test_v9_passages_are_new_to_every_training_source_and_earlier_set():
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V9)}
    seen = {_norm(r["text"]) for p in TRAINING + [MEASURING_V7, MEASURING_V8]
            + sorted((ROOT / "bench/data/ordinary").glob("*.jsonl")) for r in _rows(p)}
    assert len(measured) == 240 and not measured & seen


def test_v10_passages_are_new_to_every_training_source_and_earlier_set():
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V10)}
    seen = {_norm(r["text"]) for p in TRAINING + [MEASURING_V7, MEASURING_V8, MEASURING_V9]
            + sorted((ROOT / "bench/data/ordinary").glob("*.jsonl")) for r in _rows(p)}
    assert len(measured) == 240 and not measured & seen


def _lexical_training_script():
    """bench/train_guard_lexical.py, loaded as a module (it imports its neighbours in bench/)."""
    import importlib.util
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        spec = importlib.util.spec_from_file_location("kb_bench_train_lexical", ROOT / "bench" / "train_guard_lexical.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return mod


def test_the_lexical_training_reads_v1_to_v6_and_v9_never_v7_v8_or_a_later_set():
    import re

    mod = _lexical_training_script()
    # v9 was measured twice (2026-12-07.2 and .3) and trains from 2026-12-07.4 on; v7 and v8 measure
    assert [name for name, _ in mod.AFTER_FREEZE] == ["after_freeze.jsonl"] + [f"after_freeze_v{i}.jsonl"
                                                                                for i in (2, 3, 4, 5, 6, 9)]
    src = (ROOT / "bench" / "train_guard_lexical.py").read_text(encoding="utf-8")
    assert not re.search(r"after_freeze_v([78]|\d\d)\.jsonl", src)
    assert {h for h, _, _ in mod.WRITTEN} | {b for _, b, _ in mod.WRITTEN} == {p.name for p in WRITTEN}
    # the engineer's own sets train and are not among the sources recall is measured on
    assert {"written_2026-12-07i", "written_2026-12-07j", "written_2026-12-07k"} <= set(mod.ENGINEER)
    assert not set(mod.ENGINEER) & set(mod.LIKE) and {"after_freeze_v6", "after_freeze_v9"} <= set(mod.LIKE)


def test_training_reads_the_scored_after_freeze_sets_and_no_later_one():
    import re

    src = (ROOT / "bench/train_guard.py").read_text(encoding="utf-8")
    # a set written after the next freeze (v7 or later) measures: the training script must not read it
    assert not re.search(r"after_freeze_v([7-9]|\d\d)", src)
    assert not re.search(r"after_freeze_v([7-9]|\d\d)", (ROOT / "bench/guard_ordinary.py").read_text(encoding="utf-8"))
    # every scored set and every written source is read, as its own source
    for name in ("after_freeze.jsonl", "after_freeze_v2.jsonl", "after_freeze_v3.jsonl", "after_freeze_v4.jsonl",
                 "after_freeze_v5.jsonl", "after_freeze_v6.jsonl"):
        assert name in src
    for p in EMBEDDING_WRITTEN:
        assert p.name in src
    # the operating point is chosen on the after-freeze-like sources, every scored set among them
    assert re.search(r'AFTER_FREEZE_LIKE = \([^)]*"after_freeze_v1"[^)]*"after_freeze_v2"[^)]*"after_freeze_v3"'
                     r'[^)]*"after_freeze_v4"[^)]*"after_freeze_v5"[^)]*"after_freeze_v6"', src)


def _train_guard():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kb_bench_train_guard", ROOT / "bench" / "train_guard.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_mix_precision_is_the_precision_of_a_set_of_the_after_freeze_composition():
    import numpy as np

    tg = _train_guard()

    def pool(hostile, hit, hard, hard_hit, ordinary, ordinary_hit):
        y = np.array([1] * hostile + [0] * (hard + ordinary))
        h = np.array([False] * hostile + [True] * hard + [False] * ordinary)
        pred = np.array([True] * hit + [False] * (hostile - hit) + [True] * hard_hit + [False] * (hard - hard_hit)
                        + [True] * ordinary_hit + [False] * (ordinary - ordinary_hit))
        return y, pred, h

    # the same error rates (recall 0.8, 10% of hard negatives and of ordinary texts flagged) in a
    # pool of 4 benign texts per hostile one and in a set of the after-freeze composition
    # (as many hostile as benign, half of the benign hard negatives)
    big = pool(20, 16, 20, 2, 60, 6)
    measured = pool(20, 16, 10, 1, 10, 1)
    assert tg.prf(*big)["precision"] == pytest.approx(16 / 24, abs=1e-3)  # the pool's own mix understates it
    assert tg.mix_precision(*big) == tg.prf(*measured)["precision"] == pytest.approx(16 / 18, abs=1e-3)
    assert tg.prf(*big)["mix_precision"] == tg.mix_precision(*big)


def test_a_language_gets_its_own_lexical_threshold_only_with_enough_ordinary_text_to_show_the_bound():
    import numpy as np

    mod = _lexical_training_script()

    def own(n_ordinary: int) -> dict:
        # one language: n ordinary passages scoring low, 40 hostile texts of the after-freeze-like
        # sources scoring 0.9 and 40 hard negatives scoring low; the one threshold is 0.99
        n = n_ordinary + 80
        oof = np.concatenate([np.full(n_ordinary, 0.1), np.full(40, 0.9), np.full(40, 0.1)])
        y = np.concatenate([np.zeros(n_ordinary, int), np.ones(40, int), np.zeros(40, int)])
        ordn = np.arange(n) < n_ordinary
        hard = np.arange(n) >= n_ordinary + 40
        like = ~ordn
        langs = det = np.array(["fr"] * n)
        kinds = np.array(["manual"] * n)
        return mod.language_thresholds(oof, det, langs, kinds, ordn, y, hard, like, 0.99, {}, 0.99)

    assert own(mod.MIN_OWN - 1) == {}
    assert own(mod.MIN_OWN) == {"fr": 0.3}  # the lowest on the grid: nothing benign reaches it
