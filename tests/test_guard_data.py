"""Issue 19: the injection detector's project-written data (bench/data/guard/, tests/data/injection/).

The second after-freeze set measures the shipped weights, so none of its passages may be in
any training source; every file holds labelled, language-tagged rows of the shapes
bench/train_guard.py and bench/guard_after_freeze.py read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LANGS = {"en", "vi", "fr", "es", "de", "zh"}
TRAINING = [ROOT / "bench/data/guard" / n for n in
            ("hostile_written.jsonl", "benign_written.jsonl", "hostile_written2.jsonl", "benign_written2.jsonl")] + [
    ROOT / "tests/data/injection" / n for n in ("hostile.jsonl", "benign.jsonl", "after_freeze.jsonl")]
MEASURING = ROOT / "tests/data/injection/after_freeze_v2.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]


def _norm(text: str) -> str:
    return " ".join(text.split()).casefold()


@pytest.mark.parametrize("path", TRAINING[:4] + [MEASURING], ids=lambda p: p.name)
def test_written_sets_are_labelled_balanced_and_multilingual(path):
    rows = _rows(path)
    assert rows
    for r in rows:
        assert r["label"] in (0, 1) and r["lang"] in LANGS and r["kind"] and r["text"].strip()
        assert r["label"] == 0 or not r.get("hard_negative")  # hard negatives are benign
    for lang in LANGS:  # every language, both classes where the file holds both
        labels = {r["label"] for r in rows if r["lang"] == lang}
        assert labels == {r["label"] for r in rows}, (lang, labels)


def test_after_freeze_v2_is_balanced_with_half_hard_negatives():
    rows = _rows(MEASURING)
    hostile = [r for r in rows if r["label"] == 1]
    benign = [r for r in rows if r["label"] == 0]
    assert len(hostile) >= 100 and len(benign) >= 100
    assert sum(bool(r.get("hard_negative")) for r in benign) * 2 >= len(benign)


def test_no_measuring_passage_is_in_a_training_source():
    measured = {_norm(r["text"]) for r in _rows(MEASURING)}
    trained = {_norm(r["text"]) for p in TRAINING for r in _rows(p)}
    assert not measured & trained
    # and the training script reads none of the measuring file
    assert "after_freeze_v2" not in (ROOT / "bench/train_guard.py").read_text(encoding="utf-8")
