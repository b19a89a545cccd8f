"""The calibrator refitted with every weight >= 0 against the free fit (docs/results.md, "On
the second replicate"): every signal of mrtf.trust.calibration.FEATURES should raise P(label
right), yet the free fit gives the parties' pairwise agreement a negative weight.

    cd bench
    python calibration_signs.py --grid ../runs/label_quality/received --dumps ../runs/calib-r2 \
        --fresh-grid ../runs/fresh/received --fresh ../runs/fresh/calib-r2

Needs ``calibration.py --dump`` of both sets (y only scores). Prints the shipped constants'
error, then per fit (free, signs >= 0): its weights, the grid's leave-one-scenario-out error,
the grid fit scored on the fresh cells, and grid + fresh as one grid left out by scenario.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from calibration import load, scenario
from scipy.optimize import minimize

from mrtf.trust.calibration import COEF


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", required=True, help="the grid's received/ cells")
    ap.add_argument("--dumps", required=True, help="calibration.py --dump of the grid")
    ap.add_argument("--fresh-grid", required=True, help="the fresh received/ cells")
    ap.add_argument("--fresh", required=True, help="calibration.py --dump of the fresh cells")
    a = ap.parse_args()
    grid = load(Path(a.dumps), a.grid)
    fresh = load(Path(a.fresh), a.fresh_grid)
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
