"""Is the printed ± honest? Coverage of the label-free accuracy estimate (issue 35).

Reads the default's cached cells of the maintained benchmarks and, per benchmark, counts the
sets whose true accuracy lies inside the interval ``refine`` printed (estimate ± half-width),
the median half-width, the median ECE of the calibrated confidence where the cell recorded it
(both benchmarks record it since session 36; older label-quality cells do not), and the
estimate's mean signed error: an ECE above 0.05 that comes from the whole set read too high
or too low shows there, not in the per-sample shape.
The goals of issue 35: truth inside in ≥ 90 % of sets, median half-width ≤ 5 points, median
ECE ≤ 0.05.

    python bench/estimate_coverage.py --standard runs/standard_digits \\
        --grid runs/label_quality [--fresh runs/fresh] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Reading:
    """One set: the labels' true accuracy, the printed estimate and its ± (half-width), and
    the calibrated confidence's ECE (None when the cell did not record it)."""

    name: str
    accuracy: float
    estimate: float
    half_width: float
    ece: float | None

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
                       row.get("ece"))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--standard", type=Path, help="bench/standard_digits.py --out folder")
    ap.add_argument("--grid", type=Path, help="bench/label_quality.py --out folder")
    ap.add_argument("--fresh", type=Path, help="bench/label_quality.py --fresh --out folder")
    ap.add_argument("--sets", action="store_true", help="also list every set")
    args = ap.parse_args()
    print("| benchmark | sets | truth inside the ± | median half-width (points) | "
          "median ECE | mean error (points) | largest error (points) |")
    print("|---|---|---|---|---|---|---|")
    listed: list[Reading] = []
    for label, root in (("standard digits", args.standard), ("label-quality grid", args.grid),
                        ("fresh sets", args.fresh)):
        if root is not None:
            rows = readings(root / "cells")
            listed += rows
            print(summary_row(label, rows))
    if args.sets:
        print("\n| set | accuracy | estimate ± | inside | ECE |\n|---|---|---|---|---|")
        for r in listed:
            ece = "–" if r.ece is None else f"{r.ece:.3f}"
            print(f"| {r.name} | {r.accuracy:.3f} | {r.estimate:.3f} ± {r.half_width:.3f} | "
                  f"{'yes' if r.inside else 'no'} | {ece} |")


if __name__ == "__main__":
    main()
