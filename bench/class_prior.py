"""What each class prior of the adaptive consensus gives on balanced and on skewed targets
(issue 10: ``--class-prior uniform``; 2026-11-23: ``auto``, the default, prior_choice.py;
column ``raw``: auto's earlier rule, the higher raw neighbour agreement).

For every received set of the label-quality grid (bench/label_quality.py, same cells and
seeds, simulated once and cached there), the adaptive consensus' targets (before distillation)
are scored against ``y`` with the learned class prior, the uniform one and the choice between
them from the target's own neighbourhoods (auto), on the balanced 1,000-image target and on
the same target subsampled to skewed classes (class c kept with probability ``--skew`` ** c,
seed 0; the neighbourhoods are those of the subsampled target). The teachers' logits and
θ_{t+1}'s features are cached per received set under ``--out``/class_prior::

    OMP_NUM_THREADS=1 python bench/class_prior.py            # writes class_prior.{json,md}
    # every received set cached under runs/fresh/received (bench/studies/calibration_fresh.py):
    # cells never used to choose the rule
    OMP_NUM_THREADS=1 python bench/class_prior.py --out runs/fresh --all-cached
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from harness import GRID, SEEDS, received_set, softmax  # bench/ is on sys.path when run

from mrtf.io import ArraySource, H5Dataset, load_received
from mrtf.refinery import RefineConfig, newest_locals, refine, teacher_logits
from mrtf.refinery.adaptive import adaptive_targets
from mrtf.refinery.teachers import stabilized_probs
from mrtf.trust.neighbours import target_neighbours

PRIORS = ("learned", "uniform", "auto")


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
    out = {key: d[key] for key in d.files}
    with H5Dataset(received_set(cell, seed, root)[1]) as target:
        out["x"] = target.read(0, len(target))
    return out


def score(d: dict[str, np.ndarray], keep: np.ndarray, prior: str) -> tuple[float, str, dict]:
    """Accuracy of the adaptive targets on the samples ``keep`` (y only scores), the prior
    used (auto: the one it chose from the kept samples' own neighbourhoods) and, for auto,
    each prior's neighbour agreement (the raw rule, the default until 2026-11-23, kept the
    higher one)."""
    logits, y, k = d["logits"][:, keep], d["y"][keep], int(d["k"])
    probs = stabilized_probs(logits, 4.0)
    names = [str(i) for i in range(len(probs))]
    neighbours = target_neighbours(ArraySource(d["x"][keep])) if prior == "auto" else None
    out = adaptive_targets(probs, names, softmax(logits[-1]), d["feats"][keep], 0, k,
                           class_prior=prior, neighbours=neighbours)
    acc = float((out.targets.argmax(1) == y).mean())
    if out.prior is None:
        return acc, prior, {}
    return acc, out.prior.chosen, out.prior.agreement


def _chose(rows: list[dict]) -> str:
    return ", ".join(f"{sum(r[f'{k}_auto_chose'] == 'uniform' for r in rows)}/{len(rows)}"
                     for k in ("balanced", "skewed"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/label_quality")
    ap.add_argument("--skew", type=float, default=0.6)
    ap.add_argument("--all-cached", action="store_true",
                    help="every received set under --out/received, not the grid's")
    args = ap.parse_args()
    root = Path(args.out)
    sets = [(c, s) for c in GRID for s in SEEDS]
    if args.all_cached:
        sets = sorted((p.name[:-3], int(p.name[-1])) for p in (root / "received").iterdir()
                      if p.name[-3:-1] == "-s")
    rows = []
    for cell, seed in sets:
        d = teachers(cell, seed, root)
        rng = np.random.default_rng(0)
        skewed = np.flatnonzero(rng.random(len(d["y"])) < args.skew ** d["y"])
        row = {"cell": cell, "seed": seed, "skewed_n": int(len(skewed))}
        for prior in PRIORS:
            for kind, keep in (("balanced", np.arange(len(d["y"]))), ("skewed", skewed)):
                row[f"{kind}_{prior}"], used, agree = score(d, keep, prior)
                if prior == "auto":
                    row[f"{kind}_auto_chose"] = used
                    raw = "uniform" if agree["uniform"] > agree["learned"] else "learned"
                    row[f"{kind}_raw"] = row[f"{kind}_{raw}"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    cols = [f"{t}_{p}" for t in ("balanced", "skewed") for p in (*PRIORS, "raw")]
    lines = ["| cell | " + " | ".join(cols) + " | auto chose uniform (balanced, skewed) |",
             "|---" * (len(cols) + 2) + "|"]
    for cell in dict.fromkeys(c for c, _ in sets):
        sel = [r for r in rows if r["cell"] == cell]
        lines.append(f"| {cell} | " + " | ".join(f"{np.mean([r[c] for r in sel]):.3f}"
                                                   for c in cols) + " | " + _chose(sel) + " |")
    lines.append("| **mean** | " + " | ".join(f"{np.mean([r[c] for r in rows]):.3f}"
                                             for c in cols) + " | " + _chose(rows) + " |")
    (root / "class_prior.json").write_text(json.dumps(rows, indent=1))
    (root / "class_prior.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
