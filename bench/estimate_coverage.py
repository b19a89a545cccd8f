"""Is the printed ± honest? Coverage of the label-free accuracy estimate (issue 35).

Reads the default's cached cells of the maintained benchmarks and, per benchmark, counts the
sets whose true accuracy lies inside the interval ``refine`` printed (estimate ± half-width),
the median half-width, the median ECE of the calibrated confidence where the cell recorded it
(both benchmarks record it since session 36; older label-quality cells do not), and the
estimate's mean signed error: an ECE above 0.05 that comes from the whole set read too high
or too low shows there, not in the per-sample shape.
The goals of issue 35: truth inside in ≥ 90 % of sets, median half-width ≤ 5 points, median
ECE ≤ 0.05.

``--by-reading`` adds, per benchmark, one row per rule that printed the estimate (the cells
record it since session 37: ``Calibration.reading``): how many sets each rule read, how far
off it was (median and 90th percentile of |error|) and its median ±. A median ± of 5 points
needs more than half the sets read by rules whose error stays within 5 points 9 times in 10.

    python bench/estimate_coverage.py --standard runs/standard_digits \\
        --grid runs/label_quality [--fresh runs/fresh] [--sets] [--by-reading]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Reading:
    """One set: the labels' true accuracy, the printed estimate and its ± (half-width), the
    calibrated confidence's ECE and the rule that printed the estimate (None when the cell
    did not record them)."""

    name: str
    accuracy: float
    estimate: float
    half_width: float
    ece: float | None
    rule: str | None = None

    @property
    def inside(self) -> bool:
        return abs(self.accuracy - self.estimate) <= self.half_width

    @property
    def error(self) -> float:
        """The estimate minus the truth (positive: read too high)."""
        return self.estimate - self.accuracy


def reading(path: Path) -> Reading | None:
    """A cell of bench/standard_digits.py (top-level estimate fields) or of
    bench/label_quality.py (its ``info.estimated_accuracy``); None without an estimate."""
    row = json.loads(path.read_text())
    if "estimate" in row:
        return Reading(path.stem, row["accuracy"], row["estimate"], row["plus_minus"],
                       row.get("ece"), row.get("reading"))
    est = (row.get("info") or {}).get("estimated_accuracy")
    if est is None:
        return None
    return Reading(path.stem, row["accuracy"], est["refined"], est["plus_minus"], None)


def readings(cells: Path, method: str = "adaptive") -> list[Reading]:
    found = (reading(p) for p in sorted(cells.glob(f"*-{method}.json")))
    return [r for r in found if r is not None]


def summary_row(label: str, rows: list[Reading]) -> str:
    if not rows:
        return f"| {label} | 0 | – | – | – | – | – |"
    inside = sum(r.inside for r in rows)
    eces = [r.ece for r in rows if r.ece is not None]
    ece = f"{statistics.median(eces):.3f} ({len(eces)} sets)" if eces else "not recorded"
    worst = max(rows, key=lambda r: abs(r.error))
    return (f"| {label} | {len(rows)} | {inside} / {len(rows)} ({100 * inside / len(rows):.0f} %)"
            f" | {100 * statistics.median(r.half_width for r in rows):.1f} | {ece} | "
            f"{100 * statistics.mean(r.error for r in rows):+.1f} | "
            f"{100 * worst.error:+.1f} ({worst.name}) |")


def by_reading_rows(label: str, rows: list[Reading]) -> list[str]:
    """One row per rule that printed the estimate (``unrecorded`` for older cells): sets,
    truth inside, median and 90th-percentile |error| and median ± (points)."""
    rules: dict[str, list[Reading]] = {}
    for r in rows:
        rules.setdefault(r.rule or "unrecorded", []).append(r)
    out = []
    for rule, rs in sorted(rules.items(), key=lambda kv: -len(kv[1])):
        errs = sorted(100 * abs(r.error) for r in rs)
        p90 = errs[min(len(errs) - 1, math.ceil(0.9 * len(errs)) - 1)]
        out.append(f"| {label} | {rule} | {len(rs)} | {sum(r.inside for r in rs)} | "
                   f"{statistics.median(errs):.1f} | {p90:.1f} | "
                   f"{100 * statistics.median(r.half_width for r in rs):.1f} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--standard", type=Path, help="bench/standard_digits.py --out folder")
    ap.add_argument("--grid", type=Path, help="bench/label_quality.py --out folder")
    ap.add_argument("--fresh", type=Path, help="bench/label_quality.py --fresh --out folder")
    ap.add_argument("--sets", action="store_true", help="also list every set")
    ap.add_argument("--by-reading", action="store_true",
                    help="also one row per rule that printed the estimate")
    args = ap.parse_args()
    print("| benchmark | sets | truth inside the ± | median half-width (points) | "
          "median ECE | mean error (points) | largest error (points) |")
    print("|---|---|---|---|---|---|---|")
    listed: list[Reading] = []
    per_rule: list[str] = []
    for label, root in (("standard digits", args.standard), ("label-quality grid", args.grid),
                        ("fresh sets", args.fresh)):
        if root is not None:
            rows = readings(root / "cells")
            listed += rows
            per_rule += by_reading_rows(label, rows)
            print(summary_row(label, rows))
    if args.by_reading:
        print("\n| benchmark | read by | sets | inside | median \\|error\\| (points) | 90th "
              "percentile | median ± (points) |\n|---|---|---|---|---|---|---|")
        print("\n".join(per_rule))
    if args.sets:
        print("\n| set | accuracy | estimate ± | inside | ECE |\n|---|---|---|---|---|")
        for r in listed:
            ece = "–" if r.ece is None else f"{r.ece:.3f}"
            print(f"| {r.name} | {r.accuracy:.3f} | {r.estimate:.3f} ± {r.half_width:.3f} | "
                  f"{'yes' if r.inside else 'no'} | {ece} |")


if __name__ == "__main__":
    main()
