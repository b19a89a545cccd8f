"""Why the label-free estimate reads the standard digits low (session 34): is it the target's
size? Each cached set is refined by the default at its own seed on a random subset of its
target (``--size`` rows, subset seed 0; 0: the whole target), y only scoring. Recorded per
refine: the accuracy, the printed estimate and ±, the calibrator's own reading, the labels'
own mean confidence, the branch, and the mean of each of the calibrator's six signals
(mrtf.trust.calibration.FEATURES) on the labels::

    cd bench/studies
    OMP_NUM_THREADS=1 python target_size.py --size 1000 --out OUT/m1000.json.0 --part 0/2 \\
        --grid RECEIVED_DIR &
    OMP_NUM_THREADS=1 python target_size.py --size 1000 --out OUT/m1000.json.1 --part 1/2 \\
        --grid RECEIVED_DIR
    python target_size.py --report OUT/m1000.json.* OUT/m0.json.*

A RECEIVED_DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/standard_digits.py's
``--out/received``); a set's seed is the number its name ends with. The subsets are written
to a temporary folder and removed.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness

from harness import cached_sets, study_arguments  # noqa: E402

import mrtf.trust.calibration as calibration  # noqa: E402

#: (calibrator's estimate, mean of each signal) of each call, the labels' first
CALLS: list[tuple[float, list[float]]] = []
_CALIBRATE = calibration.calibrate


def _recording(probs, signals, *args, **kwargs):
    cal = _CALIBRATE(probs, signals, *args, **kwargs)
    means = calibration.features(probs, signals).mean(0).tolist() \
        if signals.neighbours is not None else []
    CALLS.append((cal.estimated_accuracy, means))
    return cal


def subset(target: Path, size: int, where: Path) -> Path:
    """``size`` random rows of ``target`` (seed 0, in file order) as a new file; the whole
    file when ``size`` is 0 or not smaller."""
    with h5py.File(target) as f:
        n = len(f["x"])
        if size == 0 or size >= n:
            return target
        rows = np.sort(np.random.default_rng(0).choice(n, size, replace=False))
        out = where / "target.h5"
        with h5py.File(out, "w") as g:
            g["x"] = f["x"][:][rows]
            g["y"] = f["y"][:][rows]
    return out


def refine_all(grids: list[Path], out: Path, part: tuple[int, int], size: int) -> None:
    import mrtf.refinery.trusted as trusted
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    trusted.calibrate = _recording
    for key, d, seed, res in cached_sets(grids, out, part):
        with tempfile.TemporaryDirectory() as tmp, \
                H5Dataset(subset(d / "target.h5", size, Path(tmp))) as src:
            y = src.labels()
            CALLS.clear()
            t0 = time.perf_counter()
            r = refine(load_received(d / "received"), src, RefineConfig(seed=seed, progress=False))
            res[key] = {"m": len(y), "acc": float((r.probs.argmax(1) == y).mean()),
                        "est": r.accuracy.refined, "pm": r.accuracy.plus_minus,
                        "calibrator": CALLS[0][0], "signals": CALLS[0][1],
                        "own": float(r.probs.max(1).mean()),
                        "by": None if r.branch is None else r.branch.by,
                        "s": time.perf_counter() - t0}
        out.write_text(json.dumps(res, indent=0))
        print(key, json.dumps(res[key]), flush=True)


def _pair(key: str) -> str:
    """MNIST → USPS, ... from a set's name (``mnist-usps-k10-...``)."""
    name = key.split("/")[-1].split("-k")[0].replace("-framed", "(framed)")
    return " → ".join(name.split("-"))


def report(paths: list[Path]) -> None:
    """Per domain pair and target size: sets, mean accuracy, mean printed estimate, the mean
    signed error (estimate − accuracy) and how many were read low, the truth inside the ±,
    the mean calibrator reading and own confidence, and the mean of each signal."""
    groups = defaultdict(list)
    for p in paths:
        for key, row in json.loads(p.read_text()).items():
            groups[(_pair(key), row["m"] if row["m"] in (1000, 3000) else "whole")].append(row)
    print("| pair | rows | sets | accuracy | estimate | error (points; read low) | inside ± | "
          "calibrator | own confidence | " + " | ".join(calibration.FEATURES) + " |")
    print("|---|---|---|---|---|---|---|---|---|" + "---|" * len(calibration.FEATURES))
    for (pair, m), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        acc, est = (np.array([r[k] for r in rows]) for k in ("acc", "est"))
        err = 100 * (est - acc)
        inside = sum(abs(r["est"] - r["acc"]) <= r["pm"] for r in rows)
        sig = np.mean([r["signals"] for r in rows], 0)
        print(f"| {pair} | {m} | {len(rows)} | {acc.mean():.3f} | {est.mean():.3f} | "
              f"{err.mean():+.1f} ({int((err < 0).sum())} / {len(rows)}) | {inside} | "
              f"{np.mean([r['calibrator'] for r in rows]):.3f} | "
              f"{np.mean([r['own'] for r in rows]):.3f} | "
              + " | ".join(f"{v:.3f}" for v in sig) + " |")


def main() -> None:
    ap = study_arguments(__doc__)
    ap.add_argument("--size", type=int, default=0, help="rows of the target (0: all)")
    a = ap.parse_args()
    if a.report is not None:
        report(a.report)
        return
    refine_all(a.grid, a.out, a.part, a.size)


if __name__ == "__main__":
    main()
