"""Calibrated confidence, label-free accuracy estimate and selective labeling on the
label-quality grid (issue 13).

    python bench/calibration.py --dump      # refine every cached received set (adaptive, seed 0)
    python bench/calibration.py --fit       # fit mrtf.trust.calibration.COEF, print it
    python bench/calibration.py --report    # tables: ECE before/after, estimate vs truth,
                                            # accuracy at 80 % vs 100 % coverage

``--grid`` is the folder of cached cells (``<cell>/received``, ``<cell>/target.h5``, written by
bench/label_quality.py). ``--dump`` keeps per cell: the refined probabilities, the consensus
targets, θ_{t+1}'s probabilities, the local models' logits, the refined model's penultimate
features (for bench/studies/calibration_select.py) and y (y only scores); the target's
neighbourhoods are computed from target.h5 on loading and cached beside. ``--fit`` fits the
logistic model on the 24 grid cells (the T = 200 cells are held out) and reports its leave-one-
scenario-out error (a scenario = one cell kind, its 3 seeds); ``--report`` uses the library's
fixed COEF, i.e. what ``mrtf refine`` does, so its numbers are in-sample for the fitted
constants (the LOSO column of ``--fit`` is the honest out-of-sample figure). ``--fallback``:
the same for the earlier model without neighbourhoods.

``--bands --fresh DIR --fresh-grid GRID`` sets mrtf.trust.calibration.ERROR_BANDS: the
out-of-sample errors of the grid's leave-one-scenario-out estimates, the T = 200 cells and
the fresh cells of bench/studies/calibration_fresh.py (DIR = its ``calib`` dumps, GRID = its
``received`` cells) per band of the estimate (RMS, 90th percentile of |error|: the ± refine
prints), and how often each rule's ± held.
"""

from __future__ import annotations

import argparse
import glob
import os
from pathlib import Path

import numpy as np

from mrtf.trust.calibration import (
    FALLBACK_FEATURES,
    FEATURES,
    Signals,
    calibrate,
    fallback_features,
    features,
)
from mrtf.trust.metrics import ece, ece_floor
from mrtf.trust.neighbours import target_neighbours
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
            feats = penultimate(r.model, src)
        np.savez(out, probs=r.probs, targets=r.target_probs, averaged=r.averaged_probs, y=y,
                 logits=lg, k=len(lg), feats=feats)
        print(cell, float((r.probs.argmax(1) == y).mean()), flush=True)


def penultimate(model, src) -> np.ndarray:
    """The refined model's input to its last linear layer on the target (M, D) float32."""
    import torch
    from torch import nn

    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    got: list[np.ndarray] = []
    h = last.register_forward_hook(lambda _m, i, _o: got.append(i[0].detach().float().numpy()))
    model.eval()
    with torch.inference_mode():
        for s in range(0, len(src), 1000):
            x = torch.as_tensor(src.read(s, s + 1000))
            model(x)
    h.remove()
    return np.concatenate(got)


def load(root: Path, grid: str = GRID, fallback: bool = False) -> dict[str, dict]:
    """The dumped cells with their label-free signals; the target's neighbourhoods are
    computed from ``grid``'s target.h5 (label-free, as refine does) and cached beside."""
    from mrtf.io import H5Dataset

    cells = {}
    for f in sorted(root.glob("*.npz")):
        d = np.load(f)
        k = int(d["k"])
        if d["logits"].size == 0:
            continue
        s = Signals.from_logits(d["logits"][:k], d["averaged"], d["targets"])
        if not fallback:
            cache = root / f"{f.stem}.neighbours.npy"
            if not cache.is_file():
                with H5Dataset(Path(grid) / f.stem / "target.h5") as src:
                    np.save(cache, target_neighbours(src))
            s.neighbours = np.load(cache)
        ok = d["probs"].argmax(1) == d["y"]
        phi = fallback_features if fallback else features
        cells[f.stem] = {"X": phi(d["probs"], s), "ok": ok, "probs": d["probs"],
                         "signals": s}
    return cells


def scenario(cell: str) -> str:
    return cell.rsplit("-s", 1)[0]


def held_out(cell: str) -> bool:
    """The T = 200 cells are never fitted on: they test the calibrator out of sample."""
    return "-T200" in cell


def fit(cells: dict[str, dict], c: float = 0.05) -> np.ndarray:
    from sklearn.linear_model import LogisticRegression

    x = np.concatenate([v["X"] for k, v in cells.items() if not held_out(k)])
    y = np.concatenate([v["ok"] for k, v in cells.items() if not held_out(k)]).astype(int)
    m = LogisticRegression(C=c, max_iter=5000).fit(x, y)
    return np.concatenate([m.coef_[0], m.intercept_])


def loso(cells: dict[str, dict], c: float = 0.05) -> dict[str, float]:
    """Leave one scenario out: the estimate of each grid cell from a model fitted without its
    scenario (all seeds); the held-out T = 200 cells from the model fitted on all 24."""
    est = {}
    for g in sorted({scenario(k) for k in cells if not held_out(k)}):
        coef = fit({k: v for k, v in cells.items() if scenario(k) != g}, c)
        for k, v in cells.items():
            if scenario(k) == g:
                est[k] = float(calibrate(v["probs"], v["signals"], coef).estimated_accuracy)
    coef = fit(cells, c)
    for k, v in cells.items():
        if held_out(k):
            est[k] = float(calibrate(v["probs"], v["signals"], coef).estimated_accuracy)
    return est


def bands(grid_cells: dict[str, dict], fresh_cells: dict[str, dict], c: float = 0.05) -> None:
    """The out-of-sample error of the estimate by its level (module docstring, --bands)."""
    from mrtf.trust.calibration import ERROR_BANDS, GRID_ERROR, band_error

    est = loso(grid_cells, c)
    rows = [("grid", est[k], float(v["ok"].mean())) for k, v in grid_cells.items()]
    rows += [("fresh", calibrate(v["probs"], v["signals"]).estimated_accuracy,
              float(v["ok"].mean())) for v in fresh_cells.values()]
    print("| band of the estimate | cells | RMS error: grid LOSO + T200 / fresh / all | 90th "
          "percentile of |error| | max |error| | mean error | ± held (banded / flat 0.092) |\n"
          "|---|---|---|---|---|---|---|")
    edges = [lo for lo, _ in ERROR_BANDS]
    for i, lo in enumerate(edges):
        hi = edges[i - 1] if i else 1.0 + 1e-9
        sel = [(src, e, a) for src, e, a in rows if lo <= e < hi]
        err = {src: np.array([e - a for s2, e, a in sel if s2 == src])
               for src in ("grid", "fresh")}
        both = np.concatenate(list(err.values()))
        rms = [f"{np.sqrt(np.mean(x ** 2)):.3f}" if len(x) else "–" for x in (*err.values(), both)]
        held = [np.mean([abs(e - a) <= rule(e) for _, e, a in sel])
                for rule in (band_error, lambda _e: GRID_ERROR)]
        print(f"| [{lo:.2f}, {min(hi, 1.0):.2f}) | {len(sel)} | {' / '.join(rms)} | "
              f"{np.quantile(np.abs(both), 0.9):.3f} | {np.abs(both).max():.3f} | "
              f"{both.mean():+.3f} | {held[0]:.0%} / {held[1]:.0%} |")


def perfect_above(conf: np.ndarray, bar: float, draws: int = 1000, seed: int = 0) -> float:
    """How often a perfectly calibrated confidence (each sample right with probability
    ``conf``) shows an ECE above ``bar`` on these samples: the sampling floor's tail."""
    rng = np.random.default_rng(seed)
    return float(np.mean([ece(conf, rng.random(len(conf)) < conf) > bar
                          for _ in range(draws)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default=GRID)
    ap.add_argument("--out", default="runs/calib")
    ap.add_argument("--dump", action="store_true")
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--C", type=float, default=0.05, help="inverse L2 strength of the fit")
    ap.add_argument("--fallback", action="store_true",
                    help="the fallback model (no target neighbourhoods)")
    ap.add_argument("--bands", action="store_true",
                    help="the estimate's out-of-sample error by its level (needs --fresh)")
    ap.add_argument("--fresh", help="--bands: calibration_fresh.py's calib/ dumps")
    ap.add_argument("--fresh-grid", help="--bands: calibration_fresh.py's received/ cells")
    args = ap.parse_args()
    root = Path(args.out)
    root.mkdir(parents=True, exist_ok=True)
    if args.dump:
        dump(args.grid, root)
    cells = load(root, args.grid, args.fallback)
    if args.bands:
        bands(cells, load(Path(args.fresh), args.fresh_grid), args.C)
    if args.fit:
        coef = fit(cells, args.C)
        print("COEF = (" + ", ".join(f"{w:.4f}" for w in coef) + ")")
        names = FALLBACK_FEATURES if args.fallback else FEATURES
        for name, w in zip((*names, "bias"), coef):
            print(f"  {w:+.4f}  {name}")
        est = loso(cells, args.C)
        errs = []
        print("\n| cell | accuracy | LOSO estimate | error (points) |\n|---|---|---|---|")
        for k, v in cells.items():
            acc = float(v["ok"].mean())
            errs += [] if held_out(k) else [est[k] - acc]
            print(f"| {k}{' (held out)' if held_out(k) else ''} | {acc:.3f} | {est[k]:.3f} | "
                  f"{100 * (est[k] - acc):+.1f} |")
        print(f"\nLOSO RMS error (the 24 grid cells) {np.sqrt(np.mean(np.square(errs))):.3f}, "
              f"max {np.max(np.abs(errs)):.3f}")
    if args.report:
        print("| cell | accuracy | max-prob ECE | calibrated ECE | sampling floor | perfect > "
              "0.03 | estimate (±) | error (points) | consensus view | acc @80 % coverage | "
              "acc @100 % |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for k, v in cells.items():
            cal = calibrate(v["probs"], v["signals"])
            ok = v["ok"]
            keep = ~select(cal.confidence, coverage=0.8).abstained
            cons = v["signals"].consensus[np.arange(len(ok)), v["probs"].argmax(1)].mean()
            print(f"| {k} | {ok.mean():.3f} | {ece(v['probs'].max(1), ok):.3f} | "
                  f"{ece(cal.confidence, ok):.3f} | {ece_floor(cal.confidence):.3f} | "
                  f"{perfect_above(cal.confidence, 0.03):.0%} | {cal.estimated_accuracy:.3f} "
                  f"(±{cal.plus_minus:.3f}) | {100 * (cal.estimated_accuracy - ok.mean()):+.1f}"
                  f" | {cons:.3f} | {ok[keep].mean():.3f} | {ok.mean():.3f} |")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
