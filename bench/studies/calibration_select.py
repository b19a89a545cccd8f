"""How mrtf.trust.calibration's features were chosen (issue 13): candidate label-free signals,
forward selection on the leave-one-scenario-out (LOSO) error, and the honest error of that
procedure (nested LOSO: the selection redone without each held-out scenario).

    python bench/studies/calibration_select.py --grid GRID --out runs/calib --table  # fixed
    python bench/studies/calibration_select.py --grid GRID --out runs/calib --forward  # select
    python bench/studies/calibration_select.py --grid GRID --out runs/calib --nested  # 40 min

Needs ``bench/calibration.py --dump`` first (its ``feats``: the refined model's penultimate
features, for the in-memory-only candidates ``knn_feat*``). y only scores. The T = 200 cells
are never fitted on; they are reported with the model fitted on the 24 grid cells.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks
import numpy as np  # noqa: E402
from calibration import held_out, load, scenario  # noqa: E402
from harness import logit  # noqa: E402

from mrtf.trust.calibration import fallback_features  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402
from mrtf.trust.neighbours import label_consistency  # noqa: E402

OLD = [f"old{i}" for i in range(12)]
NEW = ["refined_p", "parties_p", "knn_pix", "c_parties_conf", "c_pair", "c_label_spread"]


def _spread(p: np.ndarray) -> float:
    p = p / p.sum()
    p = p[p > 0]
    return float(-(p * np.log(p)).sum() / math.log(10))


def _unit_knn(z: np.ndarray, k: int = 10) -> np.ndarray:
    z = z - z.mean(0)
    z = z / (np.linalg.norm(z, axis=1, keepdims=True) + 1e-9)
    sim = z @ z.T
    np.fill_diagonal(sim, -np.inf)
    return np.argsort(-sim, 1)[:, :k]


def candidates(root: Path, grid: str) -> dict[str, dict]:
    """Every candidate signal per cell, per sample (cell-level ones broadcast)."""
    import h5py
    from sklearn.cluster import KMeans

    cells = load(root, grid)
    for name, v in cells.items():
        s, p = v["signals"], v["probs"]
        m, idx, yh = len(p), np.arange(len(p)), p.argmax(1)
        full = np.full
        f = {o: c for o, c in zip(OLD, fallback_features(p, s).T)}
        mp = s.mean_prob.astype(np.float64).copy()
        top = mp[idx, yh]
        mp[idx, yh] = -1
        ent = -(s.mean_prob * np.log(s.mean_prob + 1e-12)).sum(1)
        fe = np.load(root / f"{name}.npz")["feats"].astype(np.float64)
        knn_feat = label_consistency(yh, _unit_knn(fe))
        knn_pix = label_consistency(yh, s.neighbours)
        with h5py.File(Path(grid) / name / "target.h5") as h:
            x = h["x"][:].reshape(m, -1).astype(np.float64)
        x -= x.mean(0)
        zp = x @ np.linalg.svd(x, full_matrices=False)[2][:50].T
        from sklearn.metrics import normalized_mutual_info_score as nmi
        km = KMeans(10, n_init=4, random_state=0).fit_predict(zp)
        f.update({
            "refined_p": f["old0"], "parties_p": f["old3"], "knn_pix": knn_pix,
            "c_parties_conf": f["old7"], "c_pair": f["old8"],
            "c_label_spread": full(m, logit(_spread(np.bincount(yh, minlength=10) + 0.0))),
            "c_ens_spread": full(m, logit(_spread(s.mean_prob.mean(0).astype(np.float64)))),
            "mean_prob_margin": top - mp.max(1), "parties_entropy": ent,
            "c_parties_entropy": full(m, ent.mean()),
            "c_vote_share": full(m, s.votes[idx, yh].mean()),
            "knn_feat": knn_feat, "c_knn_feat": full(m, knn_feat.mean()),
            "c_knn_pix": full(m, knn_pix.mean()), "c_nmi_pix": full(m, nmi(km, yh)),
        })
        v["F"] = f
    return cells


def design(v: dict, feats: list[str]) -> np.ndarray:
    return np.stack([v["F"][f] for f in feats], 1)


def evaluate(cells: dict, feats: list[str], c: float = 0.05,
             keys: list[str] | None = None) -> dict:
    """LOSO confidences of the grid cells in ``keys``; in-sample and held-out ones from the fit
    on all of ``keys``."""
    from sklearn.linear_model import LogisticRegression

    keys = keys or [k for k in cells if not held_out(k)]

    def fit(ks):
        return LogisticRegression(C=c, max_iter=3000).fit(
            np.concatenate([design(cells[k], feats) for k in ks]),
            np.concatenate([cells[k]["ok"] for k in ks]))

    loso = {}
    for g in sorted({scenario(k) for k in keys}):
        m = fit([k for k in keys if scenario(k) != g])
        loso.update({k: m.predict_proba(design(cells[k], feats))[:, 1]
                     for k in keys if scenario(k) == g})
    m = fit(keys)
    ins = {k: m.predict_proba(design(cells[k], feats))[:, 1] for k in cells}
    err = np.array([loso[k].mean() - cells[k]["ok"].mean() for k in keys])
    return {"loso": loso, "ins": ins, "rms": float(np.sqrt(np.mean(err ** 2))),
            "max": float(np.abs(err).max())}


def forward(cells: dict, pool: list[str], keys: list[str] | None = None, steps: int = 7,
            verbose: bool = True) -> list[str]:
    cur: list[str] = []
    best = 1.0
    for _ in range(steps):
        rank = sorted((evaluate(cells, cur + [f], keys=keys)["rms"], f)
                      for f in pool if f not in cur)
        if verbose:
            print("  " + ", ".join(f"+{f} {100 * r:.1f}" for r, f in rank[:5]), flush=True)
        if rank[0][0] >= best - 0.001:
            break
        best = rank[0][0]
        cur.append(rank[0][1])
        if verbose:
            print(f"-> {cur}: LOSO RMS {100 * best:.1f}", flush=True)
    return cur


def table(cells: dict, models: dict[str, list[str]]) -> None:
    grid = [k for k in cells if not held_out(k)]
    scen = sorted({scenario(k) for k in grid})
    print("| model | constants | LOSO RMS | LOSO max | " + " | ".join(scen)
          + " | in-sample ECE mean (≤ 0.03) | T200 errors |")
    print("|---" * (len(scen) + 6) + "|")
    for name, feats in models.items():
        r = evaluate(cells, feats)
        per = [np.sqrt(np.mean([(r["loso"][k].mean() - cells[k]["ok"].mean()) ** 2
                                for k in grid if scenario(k) == s])) for s in scen]
        e = np.array([ece(r["ins"][k], cells[k]["ok"]) for k in grid])
        t200 = " ".join(f"{100 * (r['ins'][k].mean() - cells[k]['ok'].mean()):+.1f}"
                        for k in cells if held_out(k))
        print(f"| {name} | {len(feats) + 1} | {100 * r['rms']:.1f} | {100 * r['max']:.1f} | "
              + " | ".join(f"{100 * p:.1f}" for p in per)
              + f" | {e.mean():.3f} ({(e <= 0.03).sum()}) | {t200} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="runs/label_quality/received")
    ap.add_argument("--out", default="runs/calib")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--forward", action="store_true")
    ap.add_argument("--nested", action="store_true")
    args = ap.parse_args()
    cells = candidates(Path(args.out), args.grid)
    pool = sorted(next(iter(cells.values()))["F"])
    pool = [f for f in pool if f not in NEW or f in ("knn_pix", "c_label_spread")]
    if args.table:
        table(cells, {"old (12 signals)": OLD, "chosen (6)": NEW,
                      "old + label spread + knn_pix": OLD + ["c_label_spread", "knn_pix"],
                      "chosen without knn_pix": [f for f in NEW if f != "knn_pix"],
                      "label spread alone": ["c_label_spread"]})
    if args.forward:
        print("chosen:", forward(cells, pool))
    if args.nested:
        grid = [k for k in cells if not held_out(k)]
        errs = []
        for g in sorted({scenario(k) for k in grid}):
            keys = [k for k in grid if scenario(k) != g]
            feats = forward(cells, pool, keys, steps=6, verbose=False)
            r = evaluate(cells, feats, keys=keys)
            e = [r["ins"][k].mean() - cells[k]["ok"].mean() for k in grid if scenario(k) == g]
            errs += e
            print(g, feats, " ".join(f"{100 * x:+.1f}" for x in e), flush=True)
        errs = np.array(errs)
        print(f"nested LOSO RMS {100 * np.sqrt(np.mean(errs ** 2)):.1f}, "
              f"max {100 * np.abs(errs).max():.1f}")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
