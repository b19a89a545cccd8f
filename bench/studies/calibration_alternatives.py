"""Issue 13: estimators other than "mean of a per-sample logistic model", on the same LOSO
footing as bench/studies/calibration_estimate.py (y only scores; every choice made inside the loop):

- ATC (Garg et al. 2022): the share of samples whose score is above a threshold, the
  threshold fitted on the other scenarios; on each raw signal and on the calibrated
  confidence;
- one logistic model on every candidate signal (standardised, L2), C chosen inside the loop;
- a per-cell ridge model of the accuracy on the cells' mean signals, forward-selected inside
  the loop;
- for the adapted branch, a model of the refined model's own signals fitted on voted cells.

    cd bench && python calibration_alternatives.py --out CALIB_V2 --grid GRID --seed1 ../runs/seed1
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

import numpy as np  # noqa: E402
from calibration import held_out, scenario  # noqa: E402
from calibration_estimate import BASE, cells_with_signals, header, report  # noqa: E402
from calibration_select import design  # noqa: E402


def _folds(keys: list[str]) -> list[str]:
    return sorted({scenario(k) for k in keys})


def _grid(cells: dict) -> list[str]:
    return [k for k in cells if not held_out(k)]


def atc(cells: dict, score: dict[str, np.ndarray]) -> dict[str, float]:
    """LOSO ATC estimates: mean(score > t), t fitted on the other scenarios' cells."""
    grid = _grid(cells)
    ts = np.quantile(np.concatenate([score[k] for k in grid]), np.linspace(0, 1, 400))
    est = {}
    for g in _folds(grid):
        tr = [k for k in grid if scenario(k) != g]
        loss = [np.mean([((score[k] > t).mean() - cells[k]["ok"].mean()) ** 2 for k in tr])
                for t in ts]
        t = ts[int(np.argmin(loss))]
        est.update({k: float((score[k] > t).mean()) for k in grid if scenario(k) == g})
    return est


def calibrated_atc(cells: dict, feats: list[str], c: float = 0.05) -> dict[str, float]:
    """ATC on the logistic confidence; both the model and the threshold fitted per fold."""
    from sklearn.linear_model import LogisticRegression

    grid = _grid(cells)
    est = {}
    for g in _folds(grid):
        tr = [k for k in grid if scenario(k) != g]
        m = LogisticRegression(C=c, max_iter=3000).fit(
            np.concatenate([design(cells[k], feats) for k in tr]),
            np.concatenate([cells[k]["ok"] for k in tr]))
        conf = {k: m.predict_proba(design(cells[k], feats))[:, 1] for k in grid}
        ts = np.linspace(0.01, 0.99, 197)
        t = ts[int(np.argmin([np.mean([((conf[k] > t).mean() - cells[k]["ok"].mean()) ** 2
                                       for k in tr]) for t in ts]))]
        est.update({k: float((conf[k] > t).mean()) for k in grid if scenario(k) == g})
    return est


def _ridge_logistic(cells: dict, feats: list[str], keys: list[str], c: float,
                    targets: list[str]) -> dict[str, float]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    x = np.concatenate([design(cells[k], feats) for k in keys])
    sc = StandardScaler().fit(x)
    m = LogisticRegression(C=c, max_iter=3000).fit(
        sc.transform(x), np.concatenate([cells[k]["ok"] for k in keys]))
    return {k: float(m.predict_proba(sc.transform(design(cells[k], feats)))[:, 1].mean())
            for k in targets}


def all_signals(cells: dict, feats: list[str], cs=(1e-4, 1e-3, 1e-2, 1e-1, 1.0)
                ) -> dict[str, float]:
    """Every signal in one L2 logistic model, C chosen by the inner LOSO."""
    grid = _grid(cells)

    def loso(keys: list[str], c: float) -> float:
        est = {}
        for g in _folds(keys):
            est.update(_ridge_logistic(cells, feats, [k for k in keys if scenario(k) != g], c,
                                       [k for k in keys if scenario(k) == g]))
        return float(np.mean([(est[k] - cells[k]["ok"].mean()) ** 2 for k in keys]))

    est = {}
    for g in _folds(grid):
        keys = [k for k in grid if scenario(k) != g]
        c = min(cs, key=lambda c: loso(keys, c))
        est.update(_ridge_logistic(cells, feats, keys, c,
                                   [k for k in grid if scenario(k) == g]))
    return est


def per_cell(cells: dict, alpha: float = 0.01, steps: int = 3) -> dict[str, float]:
    """Ridge regression of a cell's accuracy on its mean signals (≤ ``steps`` of them,
    forward-selected on the inner LOSO), clipped to [0, 1]."""
    from sklearn.linear_model import Ridge

    grid = _grid(cells)
    names = sorted(n for n in cells[grid[0]]["F"] if not n.startswith("c_"))
    s = {k: {n: float(np.mean(1 / (1 + np.exp(-v["F"][n])) if n in _LOGIT or "logit" in n
                              else v["F"][n])) for n in names} for k, v in cells.items()}
    for k, v in cells.items():  # the cell-level signals as they are
        s[k].update({n: float(a[0]) for n, a in v["F"].items() if n.startswith("c_")})
    acc = {k: float(v["ok"].mean()) for k, v in cells.items()}

    def pred(feats, tr, te):
        m = Ridge(alpha=alpha).fit([[s[k][f] for f in feats] for k in tr], [acc[k] for k in tr])
        return {k: float(np.clip(m.predict([[s[k][f] for f in feats]])[0], 0, 1)) for k in te}

    def loso(feats, keys):
        est = {}
        for g in _folds(keys):
            est.update(pred(feats, [k for k in keys if scenario(k) != g],
                            [k for k in keys if scenario(k) == g]))
        return float(np.mean([(est[k] - acc[k]) ** 2 for k in keys]))

    est = {}
    for g in _folds(grid):
        keys = [k for k in grid if scenario(k) != g]
        cur: list[str] = []
        best = 1.0
        for _ in range(steps):
            r, f = min((loso(cur + [f], keys), f) for f in s[grid[0]] if f not in cur)
            if r >= best - 1e-6:
                break
            best, cur = r, cur + [f]
        est.update(pred(cur, keys, [k for k in grid if scenario(k) == g]))
    return est


_LOGIT = ("refined_p", "parties_p", "refined_p_adapted", "parties_p_voted")


def own_signals(cells: dict, feats: list[str], c: float = 0.05) -> dict[str, float]:
    """Adapted cells estimated by a model of the refined model's own signals fitted on the
    voted cells only (the grid has one adapted scenario: no adapted cell to fit on when it is
    held out); voted cells by LOSO of the same model. T = 200 cells included."""
    from sklearn.linear_model import LogisticRegression

    grid = _grid(cells)
    voted = [k for k in grid if cells[k]["F"]["adapt"][0] == 0]
    est = {}
    for g in _folds(list(cells)) + [None]:
        tr = [k for k in voted if scenario(k) != g]
        m = LogisticRegression(C=c, max_iter=3000).fit(
            np.concatenate([design(cells[k], feats) for k in tr]),
            np.concatenate([cells[k]["ok"] for k in tr]))
        for k in cells:
            if scenario(k) == g or (g is None and k not in est):
                est[k] = float(m.predict_proba(design(cells[k], feats))[:, 1].mean())
    return est


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="runs/label_quality/received")
    ap.add_argument("--out", default="runs/calib")
    ap.add_argument("--seed1", default="runs/seed1")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    cells = cells_with_signals(Path(args.out), args.grid, Path(args.seed1))
    names = sorted(next(iter(cells.values()))["F"])
    header(cells)
    for n in ("refined_p", "parties_p", "knn_pix", "knn_feat", "soft_feat", "r_margin"):
        report(cells, f"ATC on {n}", atc(cells, {k: v["F"][n] for k, v in cells.items()}))
    report(cells, "ATC on the calibrated confidence (6)", calibrated_atc(cells, BASE))
    report(cells, "all signals, L2, C nested", all_signals(cells, names))
    report(cells, "per-cell ridge, ≤ 3 mean signals nested", per_cell(cells))
    own = own_signals(cells, ["knn_feat", "c_label_spread"])
    report(cells, "own signals (knn_feat, label spread) fitted on voted cells", own)
    print("  T200 and adapted cells: " + " ".join(
        f"{k} {100 * (own[k] - cells[k]['ok'].mean()):+.1f}" for k in cells
        if cells[k]["F"]["adapt"][0] == 1))


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
