"""Issue 13, second pass: label-free signals from the *final* labels and the refined model
itself (not only the parties'), branch-aware ones, per-cell models and ATC, judged only by
nested leave-one-scenario-out (LOSO) error of the accuracy estimate.

    python bench/studies/calibration_estimate.py --out runs/calib-v2 --grid GRID --table
    python bench/studies/calibration_estimate.py --out runs/calib-v2 --grid GRID --nested [--pool P]

Reads the dumps of ``bench/calibration.py --dump`` (y only scores). "Nested" means the
forward selection of bench/studies/calibration_select.py is redone without each held-out scenario,
so the held-out scenario's error is out of sample for the whole procedure. The adaptive
branch (θ_{t+1} adapted with SHOT, mrtf/refinery/novelty.py) is re-derived from the dumped
local logits and the parties' reported losses, as refine derives it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks
import numpy as np  # noqa: E402
from calibration import held_out, load, scenario  # noqa: E402
from calibration_select import _unit_knn, design, evaluate, forward  # noqa: E402
from harness import logit  # noqa: E402

from mrtf.trust.calibration import features  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402
from mrtf.trust.neighbours import label_consistency  # noqa: E402

BASE = ["refined_p", "parties_p", "knn_pix", "c_parties_conf", "c_pair", "c_label_spread"]


def _branch(grid: str, name: str, logits: np.ndarray) -> tuple[float, bool]:
    """The refinery's novelty gap and whether it adapted (as refine decides it, no y)."""
    from mrtf.io import load_received
    from mrtf.refinery.novelty import target_novelty
    from mrtf.refinery.pipeline import newest_locals

    rs = load_received(Path(grid) / name / "received")
    nv = target_novelty(logits, [m.meta.train_loss for m in newest_locals(rs)])
    return float(nv.gap if nv.gap is not None else 0.0), bool(nv.adapt)


def _soft_nbr(p: np.ndarray, nbr: np.ndarray, yh: np.ndarray) -> np.ndarray:
    """Mean over a sample's neighbours of the refined model's probability of its label: the
    refined model's self-consistency on the target's neighbour graph."""
    return p[nbr, yh[:, None]].mean(1)


def _entropy(p: np.ndarray) -> np.ndarray:
    p = np.clip(p.astype(np.float64), 1e-12, 1.0)
    return -(p * np.log(p)).sum(1) / np.log(p.shape[1])


def signals(v: dict, name: str, root: Path, grid: str, seed1: Path | None = None
            ) -> dict[str, np.ndarray]:
    """Every candidate signal of one cell, per sample (cell-level ones broadcast)."""
    s, p = v["signals"], v["probs"].astype(np.float64)
    m, idx, yh = len(p), np.arange(len(p)), p.argmax(1)
    d = np.load(root / f"{name}.npz")
    gap, adapt = _branch(grid, name, d["logits"][:int(d["k"])])
    fnbr = _unit_knn(d["feats"].astype(np.float64))
    srt = np.sort(p, 1)
    theta, cons, ens = s.averaged.argmax(1), s.consensus.argmax(1), s.mean_prob.argmax(1)
    pix_major = np.array([np.bincount(r, minlength=p.shape[1]).argmax()
                          for r in yh[s.neighbours]])
    f = dict(zip(BASE, features(p, s).T))
    hist = np.bincount(yh, minlength=p.shape[1]) / m
    per = {
        "r_entropy": _entropy(p), "r_margin": srt[:, -1] - srt[:, -2],
        "theta_names": (theta == yh) * 1.0, "cons_names": (cons == yh) * 1.0,
        "vote_names": (ens == yh) * 1.0, "logit_theta_p": logit(s.averaged[idx, yh]),
        "logit_cons_p": logit(s.consensus[idx, yh]), "knn_feat": label_consistency(yh, fnbr),
        "soft_pix": _soft_nbr(p, s.neighbours, yh), "soft_feat": _soft_nbr(p, fnbr, yh),
        "pix_major": (pix_major == yh) * 1.0,
        # chance-corrected: a label shared by many samples is shared by many neighbours
        "knn_pix_excess": f["knn_pix"] - hist[yh],
        "knn_feat_excess": label_consistency(yh, fnbr) - hist[yh],
    }
    twin = root.parent / "seed1" / f"{name}.npz" if seed1 is None else seed1 / f"{name}.npz"
    if twin.is_file():  # a second refinement, seeded 1: do two students agree?
        q = np.load(twin)["probs"].astype(np.float64)
        per["twin_names"] = (q.argmax(1) == yh) * 1.0
        per["logit_twin_p"] = logit(q[idx, yh])
    other = twin.parent.parent / "other" / f"{name}.npz"
    if other.is_file():  # the same cell refined down the other branch (adapt <-> vote):
        q = np.load(other)["probs"].astype(np.float64)  # the same for either branch taken
        per["other_names"] = (q.argmax(1) == yh) * 1.0
        per["logit_other_p"] = logit(q[idx, yh])
    # the labels' own source: the vote's targets, or θ_{t+1} that SHOT adapted
    src = s.averaged if adapt else s.consensus
    per["src_names"] = (src.argmax(1) == yh) * 1.0
    per["logit_src_p"] = logit(src[idx, yh])
    f.update(per)
    for k in list(per) + ["refined_p", "parties_p", "knn_pix"]:
        f["c_" + k] = np.full(m, f[k].mean())
    f["c_gap"] = np.full(m, gap)
    f["adapt"] = np.full(m, float(adapt))
    # branch-aware: the parties' probability only speaks for labels that came from their vote
    f["parties_p_voted"] = f["parties_p"] * (1 - adapt)
    f["c_parties_conf_voted"] = f["c_parties_conf"] * (1 - adapt)
    f["refined_p_adapted"] = f["refined_p"] * adapt
    return f


def cells_with_signals(root: Path, grid: str, seed1: Path | None = None) -> dict[str, dict]:
    cells = load(root, grid)
    for name, v in cells.items():
        v["F"] = signals(v, name, root, grid, seed1)
    return cells


def per_scenario(cells: dict, est: dict[str, float]) -> dict[str, float]:
    grid = [k for k in cells if not held_out(k)]
    return {s: float(np.sqrt(np.mean([(est[k] - cells[k]["ok"].mean()) ** 2
                                      for k in grid if scenario(k) == s])))
            for s in sorted({scenario(k) for k in grid})}


def nested(cells: dict, pool: list[str], steps: int = 6, c: float = 0.05,
           verbose: bool = True) -> dict[str, float]:
    """Held-out estimate of each grid cell from a selection + fit without its scenario."""
    grid = [k for k in cells if not held_out(k)]
    est = {}
    for g in sorted({scenario(k) for k in grid}):
        keys = [k for k in grid if scenario(k) != g]
        feats = forward(cells, pool, keys, steps=steps, verbose=False)
        r = evaluate(cells, feats, c=c, keys=keys)
        for k in grid:
            if scenario(k) == g:
                est[k] = float(r["ins"][k].mean())
        if verbose:
            print(f"  {g}: {feats}", flush=True)
    return est


def family() -> dict[str, list[str]]:
    """The small family the nested choice is made in: today's six with the neighbour signal
    measured in the pixel PCA space, the refined model's own feature space (plain, chance-
    corrected, soft), each with at most one extra signal."""
    swaps = {"pix": "knn_pix", "feat": "knn_feat", "feat_excess": "knn_feat_excess",
             "soft_feat": "soft_feat"}
    extras = [None, "twin_names", "src_names", "c_gap", "knn_pix"]
    out = {}
    for tag, nb in swaps.items():
        for ex in extras:
            feats = [nb if f == "knn_pix" else f for f in BASE] + ([ex] if ex else [])
            if len(set(feats)) == len(feats):
                out[f"{tag}+{ex}" if ex else tag] = feats
    return out


def nested_family(cells: dict, fam: dict[str, list[str]], c: float = 0.05,
                  verbose: bool = True) -> dict[str, float]:
    """Held-out estimate of each grid cell when the member of ``fam`` is chosen by the LOSO
    error on the other scenarios only."""
    grid = [k for k in cells if not held_out(k)]
    est = {}
    for g in sorted({scenario(k) for k in grid}):
        keys = [k for k in grid if scenario(k) != g]
        best = min(fam, key=lambda n: evaluate(cells, fam[n], c=c, keys=keys)["rms"])
        r = evaluate(cells, fam[best], c=c, keys=keys)
        est.update({k: float(r["ins"][k].mean()) for k in grid if scenario(k) == g})
        if verbose:
            print(f"  {g}: {best}", flush=True)
    return est


def fixed(cells: dict, feats: list[str], c: float = 0.05) -> tuple[dict, dict]:
    """LOSO estimates of a fixed feature set, and its in-sample confidences."""
    r = evaluate(cells, feats, c=c)
    return {k: float(v.mean()) for k, v in r["loso"].items()}, r["ins"]


def report(cells: dict, name: str, est: dict[str, float], ins: dict | None = None) -> None:
    grid = [k for k in cells if not held_out(k)]
    err = np.array([est[k] - cells[k]["ok"].mean() for k in grid])
    per = per_scenario(cells, est)
    line = (f"| {name} | {100 * np.sqrt(np.mean(err ** 2)):.1f} | {100 * np.abs(err).max():.1f}"
            " | " + " | ".join(f"{100 * x:.1f}" for x in per.values()))
    if ins is not None:
        e = np.array([ece(ins[k], cells[k]["ok"]) for k in grid])
        w = np.array([abs(ins[k].mean() - cells[k]["ok"].mean()) <= 0.03 for k in grid])
        t200 = " ".join(f"{100 * (ins[k].mean() - cells[k]['ok'].mean()):+.1f}"
                        for k in cells if held_out(k))
        line += f" | {(e <= 0.03).sum()} ({e.mean():.3f}) | {w.sum()} | {t200}"
    print(line + " |", flush=True)


def header(cells: dict) -> None:
    scen = sorted({scenario(k) for k in cells if not held_out(k)})
    print("| model | RMS | max | " + " | ".join(scen)
          + " | in-sample ECE ≤ 0.03 (mean) | in-sample ±3 | T200 in-sample |")
    print("|---" * (len(scen) + 6) + "|")


#: the models compared on fresh cells, fixed before those cells were simulated
PREREGISTERED = {"today (6)": BASE,
                 "knn_feat for knn_pix": [("knn_feat" if f == "knn_pix" else f) for f in BASE],
                 "today + twin_names": BASE + ["twin_names"],
                 "knn_feat for knn_pix + src_names":
                     [("knn_feat" if f == "knn_pix" else f) for f in BASE] + ["src_names"]}


def fresh_test(cells: dict, fresh: dict, c: float = 0.05) -> None:
    """Each pre-registered model fitted on the 24 grid cells, scored on the fresh cells."""
    from sklearn.linear_model import LogisticRegression

    grid = [k for k in cells if not held_out(k)]
    scen = sorted({scenario(k) for k in fresh})
    print("| model | fresh RMS | fresh max | " + " | ".join(scen) + " | ECE ≤ 0.03 | ±3 |")
    print("|---" * (len(scen) + 5) + "|")
    for name, feats in PREREGISTERED.items():
        m = LogisticRegression(C=c, max_iter=3000).fit(
            np.concatenate([design(cells[k], feats) for k in grid]),
            np.concatenate([cells[k]["ok"] for k in grid]))
        conf = {k: m.predict_proba(design(v, feats))[:, 1] for k, v in fresh.items()}
        err = {k: conf[k].mean() - v["ok"].mean() for k, v in fresh.items()}
        e = np.array(list(err.values()))
        per = [" ".join(f"{100 * err[k]:+.1f}" for k in fresh if scenario(k) == g)
               for g in scen]
        n_ece = sum(ece(conf[k], v["ok"]) <= 0.03 for k, v in fresh.items())
        print(f"| {name} | {100 * np.sqrt(np.mean(e ** 2)):.1f} | {100 * np.abs(e).max():.1f} | "
              + " | ".join(per) + f" | {n_ece}/{len(fresh)} | {(np.abs(e) <= 0.03).sum()} |")


#: the forward-selection pool on the extended grid (the full one is too slow there)
EXTENDED_POOL = BASE + ["r_entropy", "r_margin", "theta_names", "cons_names", "vote_names",
                        "knn_feat", "soft_feat", "twin_names", "other_names", "src_names",
                        "c_gap", "knn_pix_excess", "knn_feat_excess", "c_knn_feat",
                        "c_other_names", "c_twin_names", "logit_theta_p"]


def subsample(cells: dict, rows: int = 250, seed: int = 0) -> dict:
    """``rows`` random rows of every cell: the inner selection fits 4x faster, and a cell's
    mean confidence (all the LOSO error reads) barely moves."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, v in cells.items():
        i = rng.choice(len(v["ok"]), min(rows, len(v["ok"])), replace=False)
        out[k] = {"F": {f: a[i] for f, a in v["F"].items()}, "ok": v["ok"][i]}
    return out


def nested_sub(cells: dict, pool: list[str], steps: int = 6) -> dict[str, float]:
    """:func:`nested` with the inner selection on :func:`subsample`'d cells and the final fit
    of each fold on all rows."""
    sub = subsample(cells)
    grid = [k for k in cells if not held_out(k)]
    est = {}
    for g in sorted({scenario(k) for k in grid}):
        keys = [k for k in grid if scenario(k) != g]
        feats = forward(sub, pool, keys, steps=steps, verbose=False)
        r = evaluate(cells, feats, keys=keys)
        est.update({k: float(r["ins"][k].mean()) for k in grid if scenario(k) == g})
        print(f"  {g}: {feats}", flush=True)
    return est


def extended(cells: dict, fresh: dict) -> None:
    """The grid and the fresh cells as one grid of 17 scenarios: LOSO of the pre-registered
    models, nested LOSO of the family choice and of forward selection (with and without
    the signals that need extra refinements: twin_*, other_*)."""
    both = {**cells, **fresh}
    header(both)
    for title, feats in PREREGISTERED.items():
        report(both, title + ", LOSO", *fixed(both, feats))
    report(both, "nested: family choice", nested_family(both, family(), verbose=False))
    cheap = [f for f in EXTENDED_POOL if "twin" not in f and "other" not in f]
    for title, pool in (("nested forward, pool 23", EXTENDED_POOL),
                        ("nested forward, pool 19 (no twin/other)", cheap)):
        report(both, title, nested_sub(both, pool))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", default="runs/label_quality/received")
    ap.add_argument("--out", default="runs/calib")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--nested", action="store_true")
    ap.add_argument("--seed1", default="runs/seed1",
                    help="a second refinement of each cell, seeded 1 (for twin_*)")
    ap.add_argument("--pool", nargs="*", default=None)
    ap.add_argument("--fresh", default=None,
                    help="folder of bench/studies/calibration_fresh.py (calib/, seed1/, other/, "
                         "received/): score the pre-registered models there")
    ap.add_argument("--extend", action="store_true",
                    help="with --fresh: LOSO and nested LOSO on the grid and the fresh cells")
    args = ap.parse_args()
    cells = cells_with_signals(Path(args.out), args.grid, Path(args.seed1))
    names = sorted(next(iter(cells.values()))["F"])
    if args.table:
        header(cells)
        for title, feats in PREREGISTERED.items():  # fixed sets: in-selection for all but today
            report(cells, title + ", LOSO", *fixed(cells, feats))
        fam = family()
        report(cells, f"nested: choice among {len(fam)}", nested_family(cells, fam, verbose=False))
        report(cells, "nested: pixel or feature neighbours",
               nested_family(cells, {k: fam[k] for k in ("pix", "feat")}, verbose=False))
    if args.nested:
        pool = args.pool or names
        est = nested(cells, pool)
        header(cells)
        report(cells, "nested selection", est)
    if args.fresh:
        fr = Path(args.fresh)
        fresh = cells_with_signals(fr / "calib", str(fr / "received"), fr / "seed1")
        fresh_test(cells, fresh)
        if args.extend:
            extended(cells, fresh)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
