"""Labels the calibrator reads as mostly right (issue 35): is the midpoint of its reading and the
labels' own mean confidence a better estimate than its reading with a ± reaching the other?

Each set is refined by the default at its own seed and at that seed + 100 (a "twin"). What the
calibrator read is kept (``mrtf.refinery.trusted.calibrate`` is wrapped: its first call is the
labels'), with the labels' own mean max probability, whether they were adapted, and which are
right (y only scores). The report applies three rules to the same readings:

- ``reach``: session 28's rule (from 0.85 the calibrator's reading stays and its ± reaches the
  labels' own confidence);
- ``mid85`` / ``mid80``: from 0.85 / 0.80, labels that are not adapted are read as adapted ones
  are (midway, a ± spanning both, the calibrator's band as floor). ``mid80`` was session 29's
  rule (``midpoint_estimate.MIDPOINT_FROM``);
- ``both``: session 30's rule, the one in the library: as ``mid80``, but the midpoint's ± is
  ``midpoint_estimate.midpoint_plus_minus`` (half the gap, the sampling error and
  ``SHARED_ERROR``, no floor above the lowest band), and in the calibrator's middle band below
  0.80 its ± reaches the labels' own confidence (``reach_plus_minus``).

Adapted labels keep their rule in all three. Per benchmark: how often the truth lay inside the
printed ±, the median ±, the median ECE (15 bins) and the mean error; then, for the voted
refines the calibrator read at 0.85 / 0.80 or above, how far each reading was from the truth::

    cd bench/studies
    OMP_NUM_THREADS=1 python sure_labels_midpoint.py --grid DIR --out OUT/NAME [--part 0/2]
    python sure_labels_midpoint.py --report OUT/grid OUT/fresh ...

A DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/harness.py's ``received_set``, or
bench/standard_digits.py's ``--out/received``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mrtf.trust.calibration import band_error, in_lowest_band, plus_minus  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402
from mrtf.trust.midpoint_estimate import (  # noqa: E402
    midpoint_plus_minus,
    reach_plus_minus,
    shifted_to_mean,
)

TWIN = 100
RULES = {"reach": None, "mid85": 0.85, "mid80": 0.80, "both": 0.80}


def dump(grid: Path, out: Path, part: tuple[int, int]) -> None:
    """Refine this process's share of ``grid``'s sets at their seed and the twin's."""
    import mrtf.refinery.trusted as trusted
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    first: dict = {}
    calibrate = trusted.calibrate

    def keep_first(probs, signals, *args, **kwargs):
        cal = calibrate(probs, signals, *args, **kwargs)
        first.setdefault("cal", cal)  # later calls read θ_{t+1}'s labels
        return cal

    trusted.calibrate = keep_first
    out.mkdir(parents=True, exist_ok=True)
    for j, d in enumerate(sorted(grid.glob("*/received"))):
        name, path = d.parent.name, out / f"{d.parent.name}.npz"
        if j % part[1] != part[0] or path.is_file():
            continue
        seed, got = int(name.rsplit("-s", 1)[-1]), {}
        with H5Dataset(d.parent / "target.h5") as src:
            y = src.labels()
            for tw in (0, 1):
                t0 = time.perf_counter()
                first.clear()
                r = refine(load_received(d), src, RefineConfig(seed=seed + tw * TWIN,
                                                                progress=False))
                got |= {f"conf{tw}": first["cal"].confidence, f"ok{tw}": r.probs.argmax(1) == y,
                        f"own{tw}": float(r.probs.max(1).astype(np.float64).mean()),
                        f"adapted{tw}": bool(r.branch is not None and r.branch.adapts),
                        f"printed{tw}": r.calibration.estimated_accuracy,
                        f"seconds{tw}": time.perf_counter() - t0}
        np.savez(path, classes=r.probs.shape[1], **got)
        print(name, f"{got['ok0'].mean():.3f} printed {got['printed0']:.3f}", flush=True)


def reading(z, tw: int, rule: str) -> tuple[float, float, np.ndarray]:
    """(estimate, ±, per-sample confidence) of one refine under ``rule``."""
    conf = z[f"conf{tw}"]
    cal, own, m = float(conf.mean()), float(z[f"own{tw}"]), len(conf)
    pm = plus_minus(cal, m, band_error(cal, int(z["classes"])))
    start = RULES[rule]
    if bool(z[f"adapted{tw}"]) or (start is not None and cal >= start):
        est = (cal + own) / 2
        mid = midpoint_plus_minus(cal, own, m, pm) if rule == "both" else \
            max(abs(own - cal) / 2 + plus_minus(est, m, 0.0), pm)
        return est, mid, shifted_to_mean(conf, est)
    if rule == "reach" and cal >= 0.85:
        pm = max(pm, abs(own - cal))
    if rule == "both" and not in_lowest_band(cal):
        pm = reach_plus_minus(cal, own, pm)
    return cal, pm, conf


def report(dirs: list[Path]) -> None:
    print("| benchmark | label sets | rule | truth inside | median ± | median ECE | mean error |")
    print("|---|---|---|---|---|---|---|")
    for d in dirs:
        sets = [np.load(f) for f in sorted(d.glob("*.npz"))]
        for rule in RULES:
            rows = []
            for z in sets:
                for tw in (0, 1):
                    est, pm, conf = reading(z, tw, rule)
                    acc = float(z[f"ok{tw}"].mean())
                    rows.append((est - acc, pm, ece(conf, z[f"ok{tw}"])))
            inside = sum(abs(e) <= p for e, p, _ in rows)
            print(f"| {d.name} | {len(rows)} | {rule} | {inside} / {len(rows)} | "
                  f"{statistics.median(p for _, p, _ in rows):.3f} | "
                  f"{statistics.median(c for _, _, c in rows):.3f} | "
                  f"{100 * np.mean([e for e, _, _ in rows]):+.1f} points |")


def readings(dirs: list[Path], start: float = 0.80) -> None:
    """Voted refines the calibrator read at ``start`` or above: how far each reading was from
    the truth (mean error, and the 90th percentile and max of its size, in points)."""
    print(f"| benchmark | voted refines read ≥ {start:.2f} | calibrator | own confidence | "
          "midpoint |\n|---|---|---|---|---|")
    for d in dirs:
        errs: dict[str, list[float]] = {"cal": [], "own": [], "mid": []}
        for f in sorted(d.glob("*.npz")):
            z = np.load(f)
            for tw in (0, 1):
                cal, own = float(z[f"conf{tw}"].mean()), float(z[f"own{tw}"])
                if bool(z[f"adapted{tw}"]) or cal < start:
                    continue
                acc = float(z[f"ok{tw}"].mean())
                for k, v in (("cal", cal), ("own", own), ("mid", (cal + own) / 2)):
                    errs[k].append(100 * (v - acc))
        if not errs["cal"]:
            continue
        cells = [f"{np.mean(e):+.1f} (p90 {np.quantile(np.abs(e), 0.9):.1f}, max "
                 f"{np.abs(e).max():.1f})" for e in errs.values()]
        print(f"| {d.name} | {len(errs['cal'])} | " + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, help="a folder of <set>/received + target.h5")
    ap.add_argument("--out", type=Path, help="where the per-set readings go")
    ap.add_argument("--part", default="0/1", help="i/n: this process takes every n-th set")
    ap.add_argument("--report", type=Path, nargs="*", help="--out folders to tabulate")
    args = ap.parse_args()
    if args.report:
        report(args.report)
        for start in (0.85, 0.80):
            readings(args.report, start)
    else:
        i, n = map(int, args.part.split("/"))
        dump(args.grid, args.out, (i, n))


if __name__ == "__main__":
    main()
