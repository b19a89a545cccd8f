"""The label-free estimate on the adapt branch (issue 35): is the midpoint of the two
readings better than the calibrator's reading widened to the labels' own confidence?

On labels from θ_{t+1} adapted to the target, the calibrator (fitted on labels the parties
mostly give) reads low and the labels' own mean max probability reads high
(the rule shipped until session 26 widened the ± to reach the second reading and kept
the calibrator's estimate: :func:`widened`). This study refines received sets with the default,
dumps per sample the labels' probabilities, the calibrated confidence and y (y only scores),
and compares the earlier rule with the midpoint rule (``midpoint_estimate.midpoint_for_adapted``)
on coverage, half-width and ECE.

    cd bench/studies
    OMP_NUM_THREADS=1 python estimate_adapted.py --grid DIR [--grid DIR2 ...] --out OUT [--seed 0]
    python estimate_adapted.py --out OUT --report [--baselines RESULTS.json]
    python estimate_adapted.py --out OUT --standard-cells runs/standard_digits/cells

A DIR holds ``<cell>/received`` and ``<cell>/target.h5`` (bench/label_quality.py's and
calibration_fresh.py's received sets).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mrtf.trust.calibration import Calibration, band_error, plus_minus  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402
from mrtf.trust.midpoint_estimate import midpoint_for_adapted  # noqa: E402


def set_seed(cell: str) -> int:
    """The seed a set's name ends with (``…-s2`` → 2; 0 without one): the benchmarks refine
    each set with its own seed."""
    tail = cell.rsplit("-s", 1)[-1]
    return int(tail) if "-s" in cell and tail.isdigit() else 0


def dump(grid: Path, out: Path, seed: int | None = None) -> None:
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    out.mkdir(parents=True, exist_ok=True)
    for d in sorted(grid.glob("*/received")):
        cell = d.parent.name
        path = out / f"{cell}.npz"
        if path.is_file():
            continue
        config = RefineConfig(seed=set_seed(cell) if seed is None else seed, progress=False)
        with H5Dataset(d.parent / "target.h5") as src:
            r = refine(load_received(d), src, config)
            y = src.labels()
        cal = r.calibration
        adapted = bool(r.branch is not None and r.branch.adapts)
        np.savez(path, probs=r.probs, conf=cal.confidence, y=y, adapted=adapted,
                 estimate=cal.estimated_accuracy, plus_minus=cal.plus_minus)
        print(cell, "adapted" if adapted else "voted",
              f"{float((r.probs.argmax(1) == y).mean()):.3f}", flush=True)


def widened(cal: Calibration, probs: np.ndarray) -> Calibration:
    """The earlier rule: the calibrator's estimate, its ± widened to reach the labels' own
    mean confidence when the two readings differ by more than the ±."""
    gap = abs(float(np.asarray(probs, np.float64).max(1).mean()) - cal.estimated_accuracy)
    return cal if gap <= cal.plus_minus else replace(cal, plus_minus=gap)


def raw(d) -> Calibration:
    """The calibrator's reading before any adapt-branch rule: the dump holds the printed
    estimate and ±, and the band ± of that estimate is what calibrate gave."""
    est = float(d["conf"].mean())
    pm = plus_minus(est, len(d["conf"]), band_error(est, d["probs"].shape[1]))
    return Calibration(d["conf"], est, pm, 1.0, "dump")


def report(out: Path) -> None:
    """Per adapted set: both rules; then, for the adapted sets and for all sets (a voted set
    keeps the calibrator's reading under both rules): coverage, median half-width, median
    ECE, and the estimate's error."""
    rows = []
    for f in sorted(out.glob("*.npz")):
        d = np.load(f)
        ok = d["probs"].argmax(1) == d["y"]
        base = raw(d)
        adapted = bool(d["adapted"])
        wide = widened(base, d["probs"]) if adapted else base
        mid = midpoint_for_adapted(base, d["probs"]) if adapted else base
        own = float(d["probs"].max(1).mean())
        rows.append((f.stem, float(ok.mean()), base.estimated_accuracy, own, wide, mid,
                     ece(wide.confidence, ok), ece(mid.confidence, ok), adapted))
    print("| adapted set | accuracy | calibrator | own | earlier: est ± (in) "
          "| midpoint: est ± (in) | ECE earlier | ECE midpoint |")
    print("|---|---|---|---|---|---|---|---|")
    for name, acc, cal, own, w, m, ew, em, adapted in rows:
        if not adapted:
            continue

        def cell(c: Calibration, acc: float = acc) -> str:
            inside = abs(c.estimated_accuracy - acc) <= c.plus_minus
            return f"{c.estimated_accuracy:.3f} ± {c.plus_minus:.3f} ({'in' if inside else 'OUT'})"
        print(f"| {name} | {acc:.3f} | {cal:.3f} | {own:.3f} | {cell(w)} | {cell(m)} "
              f"| {ew:.3f} | {em:.3f} |")
    for which, subset in (("adapted", [r for r in rows if r[8]]), ("all", rows)):
        if not subset:
            continue
        for label, i, e in (("earlier", 4, 6), ("midpoint", 5, 7)):
            inside = sum(abs(r[i].estimated_accuracy - r[1]) <= r[i].plus_minus for r in subset)
            hw = statistics.median(r[i].plus_minus for r in subset)
            err = [100 * (r[i].estimated_accuracy - r[1]) for r in subset]
            print(f"{which} sets, {label}: inside {inside}/{len(subset)}, median half-width "
                  f"{100 * hw:.1f} pts, median ECE {statistics.median(r[e] for r in subset):.3f}"
                  f", error RMS {np.sqrt(np.mean(np.square(err))):.1f} "
                  f"max {max(err, key=abs):+.1f}")


def from_cells(cells: Path) -> None:
    """The midpoint rule on bench/standard_digits.py's adapted cells as recorded under the
    earlier rule, without refining again: where that rule widened the ±, the labels' own
    confidence is the estimate + the ± (it is above the calibrator's reading on every cell
    dumped so far); m is the target's size (2,007 USPS, 9,001 MNIST-M test images)."""
    rows = []
    for f in sorted(cells.glob("*-adaptive.json")):
        c = json.loads(f.read_text())
        if "estimate" not in c or "adapt" not in c.get("branch", ""):
            continue
        m = 9001 if "mnistm" in c["pair"] else 2007 if "usps" in c["pair"].split("-")[1] \
            else 10000
        cal, old_pm = c["estimate"], c["plus_minus"]
        if old_pm <= band_error(cal) + 1e-9:
            continue  # not widened: the own confidence is not recorded
        own = cal + old_pm
        est = (cal + own) / 2
        # the rule of midpoint_estimate.midpoint_for_adapted, on the recorded readings
        pm = max(old_pm / 2 + plus_minus(est, m, 0.0), plus_minus(cal, m, band_error(cal)))
        rows.append((f.stem, c["accuracy"], cal, old_pm, est, pm))
    print("| cell | accuracy | earlier est ± | midpoint est ± |\n|---|---|---|---|")
    for name, acc, cal, opm, est, pm in rows:
        print(f"| {name} | {acc:.3f} | {cal:.3f} ± {opm:.3f} | {est:.3f} ± {pm:.3f} |")
    for label, e, p in (("earlier", 2, 3), ("midpoint", 4, 5)):
        inside = sum(abs(r[e] - r[1]) <= r[p] for r in rows)
        print(f"{label}: inside {inside}/{len(rows)}, median half-width "
              f"{100 * statistics.median(r[p] for r in rows):.1f} pts")


def against(out: Path, baselines: Path,
            simple: tuple[str, ...] = ("fedavg", "ensemble", "feddf", "st", "shot")) -> None:
    """The default's accuracy in each dumped set against the best simple method's, from a
    bench/label_quality.py results JSON of the same sets (rows: cell, seed, method)."""
    best: dict[str, tuple[float, str]] = {}
    for row in json.loads(baselines.read_text())["rows"]:
        if row["method"] in simple:
            key = f"{row['cell']}-s{row['seed']}"
            best[key] = max(best.get(key, (-1.0, "")), (row["accuracy"], row["method"]))
    print("| set | default | best simple | default − best (points) |\n|---|---|---|---|")
    margins = []
    for f in sorted(out.glob("*.npz")):
        if f.stem not in best:
            continue
        d = np.load(f)
        acc = float((d["probs"].argmax(1) == d["y"]).mean())
        b, m = best[f.stem]
        margins.append(100 * (acc - b))
        print(f"| {f.stem} | {acc:.3f} | {b:.3f} ({m}) | {margins[-1]:+.1f} |")
    if margins:
        print(f"within 1 point or above in {sum(x >= -1 for x in margins)}/{len(margins)}; "
              f"smallest margin {min(margins):+.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", action="append", type=Path, default=[])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--seed", type=int, default=None,
                    help="refine seed (default: each set's own, as the benchmarks; session "
                         "26's dumps used 0)")
    ap.add_argument("--standard-cells", type=Path, default=None,
                    help="bench/standard_digits.py's cells dir: the rule from the recorded ±")
    ap.add_argument("--baselines", type=Path, default=None,
                    help="a label_quality.py results JSON: the default against its methods")
    a = ap.parse_args()
    if a.standard_cells is not None:
        from_cells(a.standard_cells)
        return
    if not a.report:
        for g in a.grid:
            dump(g, a.out, a.seed)
    report(a.out)
    if a.baselines is not None:
        against(a.out, a.baselines)


if __name__ == "__main__":
    main()
