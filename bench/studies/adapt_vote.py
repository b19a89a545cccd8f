"""The adaptive default's option ``adapt_vote`` (session 33): where step 5 votes, the vote's
student is then adapted with SHOT and settled (methods/adaptive.py, AdaptiveSettings).

Each set is refined twice at its own seed, y only scoring: by the default, and with
``--option adapt_vote=true``. Recorded per refine: the accuracy, the wall time, the printed
estimate and ±, the branch's reason, the share of labels the option changed, and the
estimate and ± with the labels read as adapted labels (midway, mrtf.trust.midpoint_estimate)
and as voted labels (by the calibrator's band). The library prints, for the option's labels,
the voted reading with its ± reaching down to the vote's own interval; the report reads all
three from the same refines::

    cd bench/studies
    OMP_NUM_THREADS=1 python adapt_vote.py --out OUT/run.json.0 --part 0/2 \\
        --grid RECEIVED_DIR [--grid ...] &
    OMP_NUM_THREADS=1 python adapt_vote.py --out OUT/run.json.1 --part 1/2 --grid ...
    python adapt_vote.py --report OUT/run.json.*

A RECEIVED_DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/harness.py's
``received_set``, or bench/standard_digits.py's ``--out/received``); a set's seed is the
number its name ends with.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness

from harness import cached_sets, study_arguments  # noqa: E402

import mrtf.refinery.report as report_stage  # noqa: E402

READINGS: dict = {}
_CALIBRATED = report_stage.calibrated


def _both_readings(probs, before, signals, view, dev, adapted=False, vote_probs=None):
    """trusted.calibrated as the library calls it, the labels read as adapted and as voted
    labels recorded beside it."""
    for name, reading in (("adapted", True), ("vote", False)):
        est = _CALIBRATED(probs, before, signals, view, dev, reading)[1]
        READINGS[name] = [est.refined, est.plus_minus]
    return _CALIBRATED(probs, before, signals, view, dev, adapted, vote_probs)


def refine_all(grids: list[Path], out: Path, part: tuple[int, int]) -> None:
    """Both variants on this process's share of the sets (cached in ``out``)."""
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine
    from mrtf.refinery.methods.adaptive import AdaptiveSettings

    report_stage.calibrated = _both_readings
    for key, d, seed, res in cached_sets(grids, out, part):
        row, labels = {}, {}
        with H5Dataset(d / "target.h5") as src:
            y = src.labels()
            for variant, options in (("default", None), ("adapt_vote", AdaptiveSettings(True))):
                t0 = time.perf_counter()
                r = refine(load_received(d / "received"), src,
                           RefineConfig(seed=seed, progress=False, method_options=options))
                labels[variant] = r.probs.argmax(1)
                row[variant] = float((labels[variant] == y).mean())
                row[f"{variant}_s"] = time.perf_counter() - t0
                row[f"{variant}_printed"] = [r.accuracy.refined, r.accuracy.plus_minus]
                row[f"{variant}_as_adapted"] = READINGS["adapted"]
                row[f"{variant}_as_voted"] = READINGS["vote"]
                row[f"{variant}_by"] = None if r.branch is None else r.branch.by
        row["changed"] = float((labels["default"] != labels["adapt_vote"]).mean())
        res[key] = row
        out.write_text(json.dumps(res, indent=0))
        print(key, json.dumps(row), flush=True)


def _readings(r: dict) -> dict[str, tuple[float, float] | None]:
    """The option's labels read as adapted labels, as voted labels, and as the library
    prints them: read as voted, the ± reaching down to the vote's own interval before SHOT
    (the default's printed one: the same vote at the same seed;
    midpoint_estimate.down_to_the_vote). Rows from before that was the library's reading
    hold the adapted reading as ``printed`` and the voted one as ``other``; rows of the
    library's print alone (the two-round runs) hold ``printed`` only."""
    if "adapt_vote_as_voted" not in r and "adapt_vote_other" not in r:
        return {"adapted": None, "voted": None, "printed": tuple(r["adapt_vote_printed"])}
    adapted = r.get("adapt_vote_as_adapted", r["adapt_vote_printed"])
    voted = r.get("adapt_vote_as_voted", r.get("adapt_vote_other"))
    vote = r["default_printed"]
    lo, hi = min(voted[0] - voted[1], vote[0] - vote[1]), voted[0] + voted[1]
    return {"adapted": tuple(adapted), "voted": tuple(voted),
            "printed": ((lo + hi) / 2, (hi - lo) / 2)}


def _inside(rows: list[dict], reading: str) -> str:
    read = [(_readings(r)[reading], r["adapt_vote"]) for r in rows]
    if any(est is None for est, _ in read):
        return "–"
    inside = sum(abs(e - acc) <= pm for (e, pm), acc in read)
    return f"{inside} / {len(read)} ({float(np.median([pm for (_, pm), _ in read])):.3f})"


def report(paths: list[Path]) -> None:
    """Per group of sets: mean accuracy, default and with the option (Δ points; sets better /
    worse by more than a point), the median wall times, and where the option adapted, how
    often each reading held the truth inside its ± and the median ±."""
    rows = {k: v for p in paths for k, v in json.loads(p.read_text()).items()}
    groups = defaultdict(list)
    for key, row in sorted(rows.items()):
        groups[key.split("/")[0]].append(row)
    readings = ("adapted", "voted", "printed")
    print("| sets | n | default | adapt_vote | median s (default / adapt_vote) | adapted | "
          + " | ".join(f"inside ±, {r} (median ±)" for r in readings) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(readings))
    for group, rs in [*groups.items(), ("all", [r for g in groups.values() for r in g])]:
        base = np.array([r["default"] for r in rs])
        d = 100 * (np.array([r["adapt_vote"] for r in rs]) - base)
        times = [float(np.median([r[f"{v}_s"] for r in rs])) for v in ("default", "adapt_vote")]
        ad = [r for r in rs if r["adapt_vote_by"] == "vote, then adapted"]
        cells = [_inside(ad, reading) if ad else "–" for reading in readings]
        print(f"| {group} | {len(rs)} | {base.mean():.3f} | {base.mean() + d.mean() / 100:.3f} "
              f"({d.mean():+.1f}; {int((d > 1).sum())} / {int((d < -1).sum())}) | "
              f"{times[0]:.0f} / {times[1]:.0f} | {len(ad)} | " + " | ".join(cells) + " |")


def main() -> None:
    a = study_arguments(__doc__).parse_args()
    if a.report is not None:
        report(a.report)
        return
    refine_all(a.grid, a.out, a.part)


if __name__ == "__main__":
    main()
