"""Issue 19: the injection detector's project-written data (bench/data/guard/, tests/data/injection/).

The second after-freeze set measured the 2026-12-01.1 weights (scored once) and is training
data since (source after_freeze_v2, from 2026-12-01.2); the next set, written after the next
freeze, measures, so the training script must not read any later set: the third
(after_freeze_v3, written after the 2026-12-01.2 freeze) measures the shipped weights. Every file holds
labelled, language-tagged rows of the shapes bench/train_guard.py and
bench/guard_after_freeze.py read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LANGS = {"en", "vi", "fr", "es", "de", "zh"}
TRAINING = [ROOT / "bench/data/guard" / n for n in
            ("hostile_written.jsonl", "benign_written.jsonl", "hostile_written2.jsonl", "benign_written2.jsonl")] + [
    ROOT / "tests/data/injection" / n for n in ("hostile.jsonl", "benign.jsonl", "after_freeze.jsonl",
                                                "after_freeze_v2.jsonl")]
# the second after-freeze set: scored once against 2026-12-01.1, training data since
MEASURING = ROOT / "tests/data/injection/after_freeze_v2.jsonl"
# the third: written after the 2026-12-01.2 freeze (commit 0e1c103), scored once against it
MEASURING_V3 = ROOT / "tests/data/injection/after_freeze_v3.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


@pytest.mark.parametrize("path", TRAINING[:4] + [MEASURING, MEASURING_V3], ids=lambda p: p.name)
def test_written_sets_are_labelled_balanced_and_multilingual(path):
    rows = _rows(path)
    assert rows
    for r in rows:
        assert r["label"] in (0, 1) and r["lang"] in LANGS and r["kind"] and r["text"].strip()
        assert r["label"] == 0 or not r.get("hard_negative")  # hard negatives are benign
    for lang in LANGS:  # every language, both classes where the file holds both
        labels = {r["label"] for r in rows if r["lang"] == lang}
        assert labels == {r["label"] for r in rows}, (lang, labels)


@pytest.mark.parametrize("path", [MEASURING, MEASURING_V3], ids=lambda p: p.name)
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


def test_v3_passages_are_new_to_every_training_source():
    # v3 measures the 2026-12-01.2 weights: none of its passages is in a source they were trained on
    measured = {_norm(r["text"]) for r in _rows(MEASURING_V3)}
    trained = {_norm(r["text"]) for p in TRAINING for r in _rows(p)}
    assert len(measured) == 216 and not measured & trained


def test_training_reads_the_scored_after_freeze_sets_and_no_later_one():
    import re

    src = (ROOT / "bench/train_guard.py").read_text(encoding="utf-8")
    # a set written after the next freeze (v3 or later) measures: the training script must not read it
    assert not re.search(r"after_freeze_v([3-9]|\d\d)", src)
    # the operating point is chosen on the after-freeze-like sources, v2 among them
    assert re.search(r'AFTER_FREEZE_LIKE = \([^)]*"after_freeze_v1"[^)]*"after_freeze_v2"', src)
