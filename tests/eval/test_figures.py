"""`make figures` (bench/figures.py): the PNGs drawn from the committed benchmark JSON, their
numbers those of docs/quality.md's summary table, and a clear failure on a missing input."""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "figures.py"
RESULTS = ROOT / "bench" / "results"
PNGS = ("quality-ndcg.png", "latency-tenant-size.png")

import matplotlib  # noqa: E402,F401 - the dev extra installs it: a missing one is an error, not a skip


def _figures_module():
    spec = importlib.util.spec_from_file_location("kb_bench_figures", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(results: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--results", str(results), "--out", str(out)],
                          capture_output=True, text=True, timeout=300)


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_figures_drawn_from_committed_json(tmp_path):
    out = tmp_path / "img"
    r = _run(RESULTS, out)
    assert r.returncode == 0, r.stderr
    import matplotlib.image as mpimg

    for name in PNGS:
        path = out / name
        assert path.is_file(), name
        w, h = _png_size(path)
        assert w >= 800 and h >= 350, (name, w, h)
        assert path.stat().st_size > 20_000, name
        pixels = mpimg.imread(path)
        assert pixels.std() > 0.05, f"{name} looks blank"  # drawn, not an empty canvas
        # the committed copy in docs/img is the same kind of picture (same dimensions)
        assert _png_size(ROOT / "docs" / "img" / name) == (w, h), name
    assert str(out / PNGS[0]) in r.stdout


def test_quality_figure_numbers_are_the_documented_ones():
    """The bars are the numbers of docs/quality.md's summary table (to its 4 decimals)."""
    mod = _figures_module()
    data = mod.quality_data(RESULTS, mod.default_fusion())
    text = (ROOT / "docs" / "quality.md").read_text(encoding="utf-8")
    header = next(line for line in text.splitlines() if line.startswith("| collection | lexical (ours) | bm25s + stemming"))
    rows = text.split(header, 1)[1].splitlines()[2:6]
    hybrid = next(k for k in data if k.startswith("hybrid"))
    checked = 0
    for row in rows:
        cells = [c.strip().strip("*") for c in row.strip("|").split("|")]
        coll = cells[0]
        documented = {"lexical (ours)": cells[1], "bm25s + stemming": cells[2], "dense exact": cells[3],
                      "textbook RRF (k=60)": cells[4], hybrid: cells[5]}
        for series, value in documented.items():
            assert f"{data[series][coll]:.4f}" == value, (coll, series, data[series][coll], value)
            checked += 1
    assert checked == 20


def test_missing_input_fails_clearly(tmp_path):
    results = tmp_path / "results"
    shutil.copytree(RESULTS, results, ignore=shutil.ignore_patterns("*.md"))
    (results / "quality-cisi.json").unlink()
    out = tmp_path / "img"
    r = _run(results, out)
    assert r.returncode == 2
    assert re.search(r"missing input file: .*quality-cisi\.json", r.stderr), r.stderr
    assert not any(out.glob("*.png"))  # nothing drawn from partial inputs

    shutil.copy(RESULTS / "quality-cisi.json", results / "quality-cisi.json")
    (results / "search-2026-11-30.json").unlink()
    r = _run(results, out)
    assert r.returncode == 2 and "search-2026-11-30.json" in r.stderr, r.stderr
