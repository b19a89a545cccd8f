"""What ``--class-prior uniform`` gains on balanced targets and costs on skewed ones (issue 10).

For every received set of the label-quality grid (bench/label_quality.py, same cells and
seeds, simulated once and cached there), the adaptive consensus' targets (before distillation)
are scored against ``y`` with the learned class prior (the default) and the uniform one, on
the balanced 1,000-image target and on the same target subsampled to skewed classes (class c
kept with probability ``--skew`` ** c, seed 0). The teachers' logits and θ_{t+1}'s features
are cached per received set under ``--out``/class_prior::

    OMP_NUM_THREADS=1 python bench/class_prior.py            # writes class_prior.{json,md}
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from label_quality import GRID, SEEDS, received_set  # bench/ is on sys.path when run

from mrtf.io import H5Dataset, load_received
from mrtf.refinery import RefineConfig, newest_locals, refine, teacher_logits
from mrtf.refinery.adaptive import adaptive_targets
from mrtf.refinery.teachers import _softmax_np, stabilized_probs

PRIORS = ("learned", "uniform")


def teachers(cell: str, seed: int, root: Path) -> dict[str, np.ndarray]:
    """Logits (K+2, M, C) of the locals, θ_t, θ_{t+1}; θ_{t+1}'s features; y; K (cached)."""
    path = root / "class_prior" / f"{cell}-s{seed}.npz"
    if not path.is_file():
        rx_dir, target_path = received_set(cell, seed, root)
        rx = load_received(rx_dir)
        with H5Dataset(target_path) as target:
            avg = refine(rx, target, RefineConfig(method="fedavg", progress=False)).model
            locs = [m.build("cpu") for m in newest_locals(rx)]
            glob = [m.build("cpu") for m in rx.by_role("global")]
            out = teacher_logits(locs + glob + [avg], target, features_of=avg)
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, logits=out.logits, feats=out.features, y=target.labels(),
                     k=len(locs))
    d = np.load(path)
    return {key: d[key] for key in d.files}


def score(d: dict[str, np.ndarray], keep: np.ndarray, prior: str) -> float:
    """Accuracy of the adaptive targets on the samples ``keep`` (y only scores)."""
    logits, y, k = d["logits"][:, keep], d["y"][keep], int(d["k"])
    probs = stabilized_probs(logits, 4.0)
    names = [str(i) for i in range(len(probs))]
    out = adaptive_targets(probs, names, _softmax_np(logits[-1]), d["feats"][keep], 0, k,
                           class_prior=prior)
    return float((out.targets.argmax(1) == y).mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/label_quality")
    ap.add_argument("--skew", type=float, default=0.6)
    args = ap.parse_args()
    root = Path(args.out)
    rows = []
    for cell in GRID:
        for seed in SEEDS:
            d = teachers(cell, seed, root)
            rng = np.random.default_rng(0)
            skewed = np.flatnonzero(rng.random(len(d["y"])) < args.skew ** d["y"])
            row = {"cell": cell, "seed": seed, "skewed_n": int(len(skewed))}
            for prior in PRIORS:
                row[f"balanced_{prior}"] = score(d, np.arange(len(d["y"])), prior)
                row[f"skewed_{prior}"] = score(d, skewed, prior)
            rows.append(row)
            print(json.dumps(row), flush=True)
    cols = [f"{t}_{p}" for t in ("balanced", "skewed") for p in PRIORS]
    lines = ["| cell | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for cell in GRID:
        sel = [r for r in rows if r["cell"] == cell]
        lines.append(f"| {cell} | " + " | ".join(f"{np.mean([r[c] for r in sel]):.3f}"
                                                   for c in cols) + " |")
    lines.append("| **mean** | " + " | ".join(f"{np.mean([r[c] for r in rows]):.3f}"
                                             for c in cols) + " |")
    (root / "class_prior.json").write_text(json.dumps(rows, indent=1))
    (root / "class_prior.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
