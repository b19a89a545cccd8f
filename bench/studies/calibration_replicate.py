"""Two changes to the calibrator tried on the second replicate's grid
(docs/benchmarks/calibration.md, "On the second replicate"), neither adopted:

- the constants refitted with every weight >= 0 against the free fit: every signal of
  mrtf.trust.calibration.FEATURES should raise P(label right), yet the free fit gives the
  parties' pairwise agreement a negative weight;
- the labels' own max probability (the neighbour vote's) as the confidence, alone or blended,
  where the calibrated estimate is high (``--high-band``).

    cd bench
    python calibration_replicate.py --grid ../runs/label_quality/received \
        --dumps ../runs/calib-r2 --fresh-grid ../runs/fresh/received \
        --fresh ../runs/fresh/calib-r2 [--high-band]

Needs ``calibration.py --dump`` of both sets (y only scores). Prints the shipped constants'
error, then per fit (free, signs >= 0): its weights, the grid's leave-one-scenario-out error,
the grid fit scored on the fresh cells, and grid + fresh as one grid left out by scenario;
with ``--high-band``, the ECE and the estimate per band threshold and blend weight.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

import numpy as np  # noqa: E402
from calibration import load, scenario  # noqa: E402
from scipy.optimize import minimize  # noqa: E402

from mrtf.trust.calibration import COEF, calibrate  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402


def fit(cells: dict[str, dict], c: float = 0.05, lower: float | None = None) -> np.ndarray:
    """sklearn's L2 logistic objective (C · Σ log-loss + ½‖w‖², b not penalised), with the
    weights bounded below by ``lower`` (None: free); returns (w..., b)."""
    x = np.concatenate([v["X"] for v in cells.values()])
    y = np.concatenate([v["ok"] for v in cells.values()]).astype(np.float64)
    d = x.shape[1]

    def objective(w: np.ndarray) -> tuple[float, np.ndarray]:
        z = x @ w[:-1] + w[-1]
        p = 1.0 / (1.0 + np.exp(-z))
        loss = c * float(np.sum(np.logaddexp(0.0, z) - y * z)) + 0.5 * float(w[:-1] @ w[:-1])
        return loss, np.concatenate([c * x.T @ (p - y) + w[:-1], [c * np.sum(p - y)]])

    r = minimize(objective, np.zeros(d + 1), jac=True, method="L-BFGS-B",
                 bounds=[(lower, None)] * d + [(None, None)], options={"maxiter": 5000})
    return r.x


def estimate(cell: dict, w: np.ndarray) -> float:
    return float((1.0 / (1.0 + np.exp(-(cell["X"] @ w[:-1] + w[-1])))).mean())


def errors(cells: dict[str, dict], w: np.ndarray) -> np.ndarray:
    """Estimate − accuracy in points, per cell."""
    return np.array([estimate(v, w) - v["ok"].mean() for v in cells.values()]) * 100


def loso(cells: dict[str, dict], lower: float | None) -> np.ndarray:
    """Each scenario's cells estimated by a fit without that scenario (points)."""
    out = []
    for g in sorted({scenario(k) for k in cells}):
        w = fit({k: v for k, v in cells.items() if scenario(k) != g}, lower=lower)
        out += [100 * (estimate(v, w) - v["ok"].mean()) for k, v in cells.items()
                if scenario(k) == g]
    return np.array(out)


def summary(e: np.ndarray) -> str:
    return (f"RMS {np.sqrt(np.mean(e ** 2)):4.1f}  max {np.abs(e).max():4.1f}  "
            f"within ±3 {(np.abs(e) <= 3).sum()}/{len(e)}")


def high_band(cells: dict[str, dict], name: str) -> None:
    """The confidence (1 − w)·calibrated + w·max-prob in the cells whose calibrated estimate
    is ≥ ``lo`` (the calibrated one elsewhere): ECE and estimate per (w, lo)."""
    pre = [(calibrate(v["probs"], v["signals"]).confidence, v["probs"].max(1), v["ok"])
           for v in cells.values()]
    for w in (0.25, 0.5, 0.75, 1.0):
        for lo in (0.0, 0.8, 0.85, 0.9):
            conf = [(1 - w) * cal + w * mp if cal.mean() >= lo else cal for cal, mp, _ in pre]
            e = np.array([ece(c, ok) for c, (_, _, ok) in zip(conf, pre)])
            err = np.array([100 * (c.mean() - ok.mean()) for c, (_, _, ok) in zip(conf, pre)])
            print(f"{name}: max-prob weight {w:.2f} from estimate {lo:.2f}: ECE mean "
                  f"{e.mean():.3f}, ≤ 0.03 in {(e <= 0.03).sum()}/{len(e)}; {summary(err)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True, help="the grid's received/ cells")
    ap.add_argument("--dumps", required=True, help="calibration.py --dump of the grid")
    ap.add_argument("--fresh-grid", required=True, help="the fresh received/ cells")
    ap.add_argument("--fresh", required=True, help="calibration.py --dump of the fresh cells")
    ap.add_argument("--high-band", action="store_true",
                    help="the max-probability confidence where the estimate is high instead")
    a = ap.parse_args()
    grid = load(Path(a.dumps), a.grid)
    fresh = load(Path(a.fresh), a.fresh_grid)
    if a.high_band:
        high_band(grid, "grid")
        high_band(fresh, "fresh")
        return
    shipped = np.asarray(COEF)
    print(f"shipped: grid {summary(errors(grid, shipped))}; "
          f"fresh {summary(errors(fresh, shipped))}")
    for name, lower in (("free", None), ("signs >= 0", 0.0)):
        w = fit(grid, lower=lower)
        print(f"{name}: weights {np.round(w, 3).tolist()}")
        print(f"  grid, leave one scenario out: {summary(loso(grid, lower))}")
        print(f"  fitted on the grid, fresh:    {summary(errors(fresh, w))}")
        print(f"  grid + fresh, LOSO:           {summary(loso(grid | fresh, lower))}")


if __name__ == "__main__":
    main()
