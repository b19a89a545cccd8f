"""The label-free estimate on sets refined twice (issue 35): how far the refine seed alone moves
the labels' accuracy and the estimate, and whether the printed ± holds the truth, with the
lowest band's ± reaching down to chance (``calibration.band_error``) and without, and with the
top band's ± reaching the labels' own confidence (session 28's rule; session 29 replaced it
by the midpoint, ``midpoint_estimate.midpoint_for_sure_labels``: sure_labels_midpoint.py).

Each set is refined by the default at its own seed (as the benchmarks do) and again at that
seed + 100 (the "twin"). The two refines share everything a set-level signal can read (the
received models, the target, the parties' confidence and agreement); only the refined model
and its labels differ. y only scores.

    cd bench/studies
    OMP_NUM_THREADS=1 python estimate_twins.py --grid DIR --out OUT [--part 0/2]
    python estimate_twins.py --out OUT --report [--out OUT2 ...]

A DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/harness.py's ``received_set``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mrtf.trust.calibration import ERROR_BANDS, band_error, own_confidence, plus_minus  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402

TWIN = 100  # the twin's refine seed is the set's seed + TWIN


def set_seed(name: str) -> int:
    """The seed a set's name ends with (``…-s2`` → 2)."""
    return int(name.rsplit("-s", 1)[-1])


def dump(grid: Path, out: Path, part: tuple[int, int] = (0, 1)) -> None:
    """Refine every set of ``grid`` (this process's ``part`` of them) at its seed and its
    twin's; one ``<set>.npz`` each, skipped when present."""
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    out.mkdir(parents=True, exist_ok=True)
    for j, d in enumerate(sorted(grid.glob("*/received"))):
        name = d.parent.name
        path = out / f"{name}.npz"
        if j % part[1] != part[0] or path.is_file():
            continue
        t0 = time.perf_counter()
        rs = load_received(d)
        got = {}
        with H5Dataset(d.parent / "target.h5") as src:
            for tag, seed in (("", set_seed(name)), ("2", set_seed(name) + TWIN)):
                r = refine(rs, src, RefineConfig(seed=seed, progress=False))
                got |= {f"probs{tag}": r.probs, f"conf{tag}": r.calibration.confidence,
                        f"estimate{tag}": r.calibration.estimated_accuracy,
                        f"plus_minus{tag}": r.calibration.plus_minus,
                        f"adapted{tag}": bool(r.branch is not None and r.branch.adapts)}
            y = src.labels()
        np.savez(path, y=y, **got)
        print(name, f"{time.perf_counter() - t0:.0f} s", flush=True)


def readings(path: Path, tag: str) -> dict:
    """One refine of one set: its accuracy, the printed estimate and ±, the ± the voted
    branch would print with the band alone and with the band reaching chance, and the ECE."""
    z = np.load(path)
    probs, est = z[f"probs{tag}"], float(z[f"estimate{tag}"])
    ok = probs.argmax(1) == z["y"]
    m, c = probs.shape
    adapted = bool(z[f"adapted{tag}"])
    printed = float(z[f"plus_minus{tag}"])
    # the adapt branch's ± (midpoint_estimate.midpoint_for_adapted) is kept as printed
    band = printed if adapted else plus_minus(est, m, band_error(est))
    chance = printed if adapted else plus_minus(est, m, band_error(est, c))
    # and in the top band, the ± reaching the labels' own confidence (session 28's rule)
    own = own_confidence(probs)
    reach = chance if adapted or est < ERROR_BANDS[0][0] else max(chance, abs(own - est))
    return {"set": path.stem, "accuracy": float(ok.mean()), "estimate": est,
            "adapted": adapted, "band": band, "chance": chance, "reach": reach,
            "ece": ece(z[f"conf{tag}"], ok)}


def summary(rows: list[dict], rule: str) -> str:
    inside = [r for r in rows if abs(r["estimate"] - r["accuracy"]) <= r[rule]]
    misses = sorted(r["set"] for r in rows if r not in inside)
    return (f"inside {len(inside)}/{len(rows)} ({len(inside) / len(rows):.0%}), median ± "
            f"{100 * statistics.median(r[rule] for r in rows):.1f} points, median ECE "
            f"{statistics.median(r['ece'] for r in rows):.3f}; outside: {', '.join(misses) or '-'}")


def report(outs: list[Path]) -> None:
    """Per set both refines; per dump directory and refine the two rules; then how much of
    the seed's move the estimate followed."""
    print("| set | branch | accuracy (twin) | estimate (twin) | error (twin), points |")
    print("|---|---|---|---|---|")
    moves = []
    for out in outs:
        for f in sorted(out.glob("*.npz")):
            a, b = readings(f, ""), readings(f, "2")
            err = (100 * (a["estimate"] - a["accuracy"]), 100 * (b["estimate"] - b["accuracy"]))
            print(f"| {a['set']} | {'adapt' if a['adapted'] else 'vote'} | {a['accuracy']:.3f} "
                  f"({b['accuracy']:.3f}) | {a['estimate']:.3f} ({b['estimate']:.3f}) | "
                  f"{err[0]:+.1f} ({err[1]:+.1f}) |")
            moves.append((b["accuracy"] - a["accuracy"], b["estimate"] - a["estimate"]))
    for out in outs:
        for tag, who in (("", "own seed"), ("2", "twin seed")):
            rows = [readings(f, tag) for f in sorted(out.glob("*.npz"))]
            for rule in ("band", "chance", "reach"):
                print(f"{out.name}, {who}, {rule}: {summary(rows, rule)}")
    da, de = np.array(moves).T
    big = np.abs(da) > 0.03
    slope = float(np.polyfit(da[big], de[big], 1)[0]) if big.sum() > 1 else float("nan")
    print(f"seed moves: |Δ accuracy| > 5 points in {int((np.abs(da) > 0.05).sum())} of "
          f"{len(da)} sets (largest {100 * np.abs(da).max():.1f}); where > 3 points "
          f"({int(big.sum())} sets) the estimate followed {slope:.2f} of the move; "
          f"correlation over all {np.corrcoef(da, de)[0, 1]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", type=Path, default=None)
    ap.add_argument("--out", type=Path, action="append", required=True)
    ap.add_argument("--part", default="0/1", help="i/n: this process refines every n-th set")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    if a.grid is not None:
        i, n = map(int, a.part.split("/"))
        dump(a.grid, a.out[0], (i, n))
    if a.report:
        report(a.out)


if __name__ == "__main__":
    main()
