"""Calibrated confidence, label-free accuracy estimate and selective labeling on the
label-quality grid (issue 13).

    python bench/calibration.py --dump      # refine every cached received set (adaptive, seed 0)
    python bench/calibration.py --fit       # fit mrtf.trust.calibration.COEF, print it
    python bench/calibration.py --report    # tables: ECE before/after, estimate vs truth,
                                            # accuracy at 80 % vs 100 % coverage

``--grid`` is the folder of cached cells (``<cell>/received``, ``<cell>/target.h5``, written by
bench/label_quality.py). ``--dump`` keeps per cell: the refined probabilities, the consensus
targets, θ_{t+1}'s probabilities, the local models' logits and y (y only scores). ``--fit``
fits the logistic model on all cells and reports its leave-one-scenario-out error (a scenario
= one cell kind, its 3 seeds); ``--report`` uses the library's fixed COEF, i.e. what ``mrtf
refine`` does, so its numbers are in-sample for the fitted constants (the LOSO column of
``--fit`` is the honest out-of-sample figure).
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path

import numpy as np

from mrtf.trust.calibration import FEATURES, Signals, calibrate, features
from mrtf.trust.metrics import ece
from mrtf.trust.selective import select

GRID = "runs/label_quality/received"


def dump(grid: str, root: Path, seed: int = 0) -> None:
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine
    from mrtf.refinery.pipeline import newest_locals
    from mrtf.refinery.teachers import teacher_logits

    for d in sorted(glob.glob(f"{grid}/*/received")):
        cell = Path(d).parent.name
        out = root / f"{cell}.npz"
        if out.is_file():
            continue
        rs = load_received(d)
        with H5Dataset(Path(d).parent / "target.h5") as src:
            r = refine(rs, src, RefineConfig(seed=seed, progress=False))
            lg = teacher_logits([m.build() for m in newest_locals(rs)], src).logits
            y = src.labels()
        np.savez(out, probs=r.probs, targets=r.target_probs, averaged=r.averaged_probs, y=y,
                 logits=lg, k=len(lg))
        print(cell, float((r.probs.argmax(1) == y).mean()), flush=True)


def load(root: Path) -> dict[str, dict]:
    cells = {}
    for f in sorted(root.glob("*.npz")):
        d = np.load(f)
        k = int(d["k"])
        if d["logits"].size == 0:
            continue
        s = Signals.from_logits(d["logits"][:k], d["averaged"], d["targets"])
        ok = d["probs"].argmax(1) == d["y"]
        cells[f.stem] = {"X": features(d["probs"], s), "ok": ok, "probs": d["probs"],
                         "signals": s}
    return cells


def scenario(cell: str) -> str:
    return cell.rsplit("-s", 1)[0]


def fit(cells: dict[str, dict], c: float = 1.0) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    x = np.concatenate([v["X"] for v in cells.values()])
    y = np.concatenate([v["ok"] for v in cells.values()]).astype(int)
    m = LogisticRegression(C=c, max_iter=5000).fit(x, y)
    return np.concatenate([m.coef_[0], m.intercept_])


def loso(cells: dict[str, dict], c: float = 1.0) -> dict[str, float]:
    """Leave one scenario out: the estimate of each cell from a model fitted without its
    scenario (all seeds)."""
    est = {}
    for g in sorted({scenario(k) for k in cells}):
        coef = fit({k: v for k, v in cells.items() if scenario(k) != g}, c)
        for k, v in cells.items():
            if scenario(k) == g:
                est[k] = float(calibrate(v["probs"], v["signals"], coef).estimated_accuracy)
    return est


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=GRID)
    ap.add_argument("--out", default="runs/calib")
    ap.add_argument("--dump", action="store_true")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--C", type=float, default=1.0, help="inverse L2 strength of the fit")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    if args.dump:
        dump(args.grid, root)
    cells = load(root)
    if args.fit:
        coef = fit(cells, args.C)
        print("COEF = (" + ", ".join(f"{w:.4f}" for w in coef) + ")")
        for name, w in zip((*FEATURES, "bias"), coef):
            print(f"  {w:+.4f}  {name}")
        est = loso(cells, args.C)
        errs = []
        print("\n| cell | accuracy | LOSO estimate | error (points) |\n|---|---|---|---|")
        for k, v in cells.items():
            acc = float(v["ok"].mean())
            errs.append(est[k] - acc)
            print(f"| {k} | {acc:.3f} | {est[k]:.3f} | {100 * (est[k] - acc):+.1f} |")
        print(f"\nLOSO RMS error {np.sqrt(np.mean(np.square(errs))):.3f}, "
              f"max {np.max(np.abs(errs)):.3f}")
    if args.report:
        print("| cell | accuracy | max-prob ECE | calibrated ECE | estimate (±) | error "
              "(points) | consensus view | acc @80 % coverage | acc @100 % |")
        print("|---|---|---|---|---|---|---|---|---|")
        for k, v in cells.items():
            cal = calibrate(v["probs"], v["signals"])
            ok = v["ok"]
            keep = ~select(cal.confidence, coverage=0.8).abstained
            cons = v["signals"].consensus[np.arange(len(ok)), v["probs"].argmax(1)].mean()
            print(f"| {k} | {ok.mean():.3f} | {ece(v['probs'].max(1), ok):.3f} | "
                  f"{ece(cal.confidence, ok):.3f} | {cal.estimated_accuracy:.3f} "
                  f"(±{cal.plus_minus:.3f}) | {100 * (cal.estimated_accuracy - ok.mean()):+.1f}"
                  f" | {cons:.3f} | {ok[keep].mean():.3f} | {ok.mean():.3f} |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
