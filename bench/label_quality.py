"""Label-quality grid: which refinery gives the best labels, cell by cell (issue 10).

Every cell is a received set as a pilot party gets it (simulated on real data, then exported
exactly as ``mrtf simulate --export-received`` writes it) plus its unlabeled target set; every
method labels the target set, and the labels are scored against the held-back ``y`` (which no
method reads). Cells:

- one-shot (K=10 parties, 1 round, E=20, batch 32) on Dirichlet 0.1, Dirichlet 0.5, label:2;
- received after 1, 10 and 50 FedAvg rounds (K=20, R=0.2, E=2, batch 32, Dirichlet 0.1);
- cross-domain digits→mnist5k and mnist5k→mnistm5k, received after 30 FedAvg rounds.

Finished (cell, seed, method) results are cached as JSON under ``--out``, so a stopped run
loses nothing and a rerun only computes what is missing. Run two single-thread processes on a
2-core machine with ``--shard 0/2`` and ``--shard 1/2``, then ``--report`` to write
``label_quality.json``, ``label_quality.md`` and ``label_quality.png``::

    OMP_NUM_THREADS=1 python bench/label_quality.py --shard 0/2 &
    OMP_NUM_THREADS=1 python bench/label_quality.py --shard 1/2 &
    wait; python bench/label_quality.py --report
    python bench/label_quality.py --cells oneshot-dir0.1 --seeds 0 --methods st,adaptive

``--fresh`` runs and reports the 9 fresh scenarios (:data:`FRESH`) instead of the grid, e.g.
with ``--out runs/fresh``, where bench/studies/calibration_fresh.py simulated them.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from harness import (
    CELLS,
    FRESH,
    GRID,
    SEEDS,
    estimate_scored,
    provenance,
    received_set,
    softmax,
    write_json,
)

from mrtf.io import H5Dataset, load_received
from mrtf.refinery import RefineConfig, accuracy_of, newest_locals, refine, teacher_logits

# ------------------------------------------------------------------ methods (one row each)


def _refined(method: str, **extra) -> Callable:
    def run(received, target, seed: int) -> tuple[np.ndarray, dict]:
        res = refine(received, target, RefineConfig(method=method, seed=seed, progress=False,
                                                    **extra))
        return res.probs, ({"info": _jsonable(res.to_dict()), "timings": res.timings}
                           | estimate_scored(res, target.labels()))
    return run


def _ensemble(received, target, seed: int) -> tuple[np.ndarray, dict]:
    """argmax of the local models' AvgProb (Eq. 4), no distillation."""
    models = [m.build("cpu") for m in newest_locals(received)]
    logits = teacher_logits(models, target).logits
    return softmax(logits).mean(0), {}


def _shot(received, target, seed: int) -> tuple[np.ndarray, dict]:
    """SHOT-style source-free adaptation (Liang et al. 2020) of the parameter average."""
    from mrtf.refinery import predict_probs
    from mrtf.refinery.shot import shot_adapt

    avg = refine(received, target, RefineConfig(method="fedavg", progress=False)).model
    model = shot_adapt(avg, target, seed=seed)
    return predict_probs(model, target), {}


def _shot_paper(received, target, seed: int) -> tuple[np.ndarray, dict]:
    """SHOT's own digit recipe (ShotSettings.paper) on the parameter average."""
    from mrtf.refinery import predict_probs
    from mrtf.refinery.shot import ShotSettings, shot_adapt

    avg = refine(received, target, RefineConfig(method="fedavg", progress=False)).model
    model = shot_adapt(avg, target, ShotSettings.paper(), seed=seed)
    return predict_probs(model, target), {}


METHODS: dict[str, Callable] = {
    "fedavg": _refined("fedavg"),
    "ensemble": _ensemble,
    "feddf": _refined("feddf"),
    "st": _refined("st"),
    "st+rd": _refined("st+rd"),
    "mrtf": _refined("mrtf", clr_min_round=0),  # paper MrTF, CLR in every cell
    "shot": _shot,
    "shot-paper": _shot_paper,
    "adaptive": _refined("adaptive"),  # the default: class prior "auto"
    # the same with the class prior fixed: learned from the votes (the default until
    # 2026-11-23), or told the target's classes are balanced (they are, in every cell here)
    "adaptive-learned": _refined("adaptive", class_prior="learned"),
    "adaptive-uniform": _refined("adaptive", class_prior="uniform"),
}
#: the simple alternatives the default must match in every cell
BASELINES = ("fedavg", "ensemble", "feddf", "st")


@contextmanager
def other_branch() -> Iterator[None]:
    """Within: the default takes the branch it would not (novelty.py's choice reversed: adapt
    where it votes, vote where it adapts)."""
    import mrtf.refinery.methods.adaptive as pl

    orig = pl.target_novelty

    def forced(*a, **kw):
        nv = orig(*a, **kw)
        return orig(*a, gap=100.0 if nv.adapt else -100.0, **kw)

    pl.target_novelty = forced
    try:
        yield
    finally:
        pl.target_novelty = orig


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=str))


def run_one(cell: str, seed: int, method: str, root: Path) -> dict:
    """One (cell, seed, method) result, from the cache or computed and cached."""
    path = root / "cells" / f"{cell}-s{seed}-{method}.json"
    if path.is_file():
        return json.loads(path.read_text())
    rx, target_path = received_set(cell, seed, root)
    received = load_received(rx)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with H5Dataset(target_path) as target:
        probs, extra = METHODS[method](received, target, seed)
        y = target.labels()
    row = {"cell": cell, "seed": seed, "method": method, "accuracy": accuracy_of(probs, y),
           "seconds": time.perf_counter() - t0, "threads": torch.get_num_threads(), **extra,
           "provenance": provenance()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(row, indent=1))
    os.replace(tmp, path)
    return row


# ------------------------------------------------------------------ report


def collect(root: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((root / "cells").glob("*.json"))]


def summarise(rows: list[dict]) -> dict:
    """cell → method → {mean, std, per_seed}; plus grid means over cells that have all seeds."""
    table: dict[str, dict[str, dict]] = {}
    for r in rows:
        table.setdefault(r["cell"], {}).setdefault(r["method"], {})[r["seed"]] = r["accuracy"]
    out: dict[str, dict] = {}
    for cell, methods in table.items():
        out[cell] = {m: {"mean": float(np.mean(list(s.values()))),
                         "std": float(np.std(list(s.values()))),
                         "per_seed": {str(k): v for k, v in sorted(s.items())}}
                     for m, s in methods.items()}
    return out


def markdown(summary: dict, methods: list[str], grid: list[str] = GRID,
             title: str = "grid mean") -> str:
    """One row per cell of ``grid`` (bold: the best mean), their mean, then the cells outside
    it that the summary has (the T = 200 cells)."""
    cells = [c for c in grid if c in summary]
    head = "| cell | " + " | ".join(methods) + " |\n|---|" + "---|" * len(methods) + "\n"
    lines = []
    for c in cells:
        best = max((summary[c][m]["mean"] for m in methods if m in summary[c]), default=0)
        vals = []
        for m in methods:
            s = summary[c].get(m)
            if s is None:
                vals.append("–")
                continue
            txt = f"{s['mean']:.3f} ± {s['std']:.3f}"
            vals.append(f"**{txt}**" if s["mean"] == best else txt)
        lines.append(f"| {c} | " + " | ".join(vals) + " |")
    extra = [c for c in CELLS if c not in grid and c not in FRESH and c in summary]
    means = []
    for m in methods:
        have = [summary[c][m]["mean"] for c in cells if m in summary[c]]
        means.append(f"{np.mean(have):.3f}" if len(have) == len(cells) else "–")
    lines.append(f"| **{title}** | " + " | ".join(means) + " |")
    for c in extra:  # outside the grid mean
        vals = [f"{summary[c][m]['mean']:.3f}" if m in summary[c] else "–" for m in methods]
        seeds = sorted({s for m in summary[c].values() for s in m["per_seed"]})
        lines.append(f"| {c} (seeds {', '.join(seeds)}) | "
                     + " | ".join(vals) + " |")
    return head + "\n".join(lines) + "\n"


def plot(summary: dict, methods: list[str], path: Path, grid: list[str] = GRID) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = [c for c in grid if c in summary]
    width = 0.8 / len(methods)
    fig, ax = plt.subplots(figsize=(max(8, 1.4 * len(cells)), 4.5))
    for i, m in enumerate(methods):
        xs = np.arange(len(cells)) + (i - (len(methods) - 1) / 2) * width
        mean = [summary[c].get(m, {}).get("mean", np.nan) for c in cells]
        lo = [min(summary[c][m]["per_seed"].values()) if m in summary[c] else np.nan
              for c in cells]
        hi = [max(summary[c][m]["per_seed"].values()) if m in summary[c] else np.nan
              for c in cells]
        err = np.array([np.subtract(mean, lo), np.subtract(hi, mean)])
        ax.bar(xs, mean, width, label=m, yerr=err, capsize=2)
    ax.set_xticks(np.arange(len(cells)), cells, rotation=20, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("label accuracy on the target set")
    ax.set_title("Label quality per cell (bars: mean of seeds; whiskers: min-max over seeds)")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))  # outside the bars
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(root: Path, methods: list[str], grid: list[str] = GRID,
           title: str = "grid mean") -> None:
    rows = collect(root)
    summary = summarise(rows)
    write_json(root / "label_quality.json", {"summary": summary, "rows": rows})
    md = markdown(summary, methods, grid, title)
    (root / "label_quality.md").write_text(md)
    plot(summary, methods, root / "label_quality.png", grid)
    print(md)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/label_quality")
    ap.add_argument("--cells", default=None, help="default: the grid (or, with --fresh, FRESH)")
    ap.add_argument("--fresh", action="store_true",
                    help="the 9 fresh scenarios instead of the grid (run and report)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th job")
    ap.add_argument("--report", action="store_true", help="only tabulate the cache")
    args = ap.parse_args()
    root = Path(args.out)
    methods = args.methods.split(",")
    grid = list(FRESH) if args.fresh else GRID
    if args.report:
        report(root, methods, grid, "fresh mean" if args.fresh else "grid mean")
        return
    i, n = map(int, args.shard.split("/"))
    cells = args.cells.split(",") if args.cells else grid
    pairs = [(c, int(s)) for c in cells for s in args.seeds.split(",")]
    for j, (cell, seed) in enumerate(pairs):
        if j % n != i:
            continue
        for m in methods:
            r = run_one(cell, seed, m, root)
            print(f"{cell:22s} seed {seed} {m:9s} {r['accuracy']:.3f} ({r['seconds']:.0f} s)",
                  flush=True)


if __name__ == "__main__":
    main()
