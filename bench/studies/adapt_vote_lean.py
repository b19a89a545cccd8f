"""Can the option ``adapt_vote`` be had for less time (session 34)? Its extra work per refine is
one SHOT run (500 steps on a plain network, its pseudo-labels refreshed once per pass over the
target: 32 times on 1,000 rows) and two settling rounds (each a neighbour vote and a 500-step
distillation). Each set is refined at its own seed, y only scoring, four ways:

- ``default``: the default, for the time the others are compared with;
- ``option``: ``--option adapt_vote=true`` as first built (session 33: two settling rounds
  of the full steps, SHOT's pseudo-labels refreshed every pass);
- ``half_settle``: the same, each settling round distilling for half the steps (250);
- ``lean``: ``half_settle``, and SHOT's pseudo-labels refreshed at most four times per run
  (every max(one pass, steps / 4) steps): the library's ``fit.VOTE_SCHEDULE`` since.

Only the vote's student is changed: where step 5 adapts θ_{t+1} the default's own adaptation
runs as it does. Recorded per refine: accuracy, wall time, the printed estimate and ±, the
branch's reason::

    cd bench/studies
    OMP_NUM_THREADS=1 python adapt_vote_lean.py --out OUT/lean.json.0 --part 0/2 \\
        --grid RECEIVED_DIR [--grid ...] &
    OMP_NUM_THREADS=1 python adapt_vote_lean.py --out OUT/lean.json.1 --part 1/2 --grid ...
    python adapt_vote_lean.py --report OUT/lean.json.*

``--variants default,option`` refines only those (the report merges a set's rows from several
files).
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness

from harness import cached_sets, study_arguments  # noqa: E402

import mrtf.refinery.methods.adaptive as adaptive  # noqa: E402
from mrtf.refinery.fit import AdaptSchedule  # noqa: E402

VARIANTS = ("default", "option", "half_settle", "lean")
#: the vote's student's schedule per variant (fit.AdaptSchedule); "lean" is the library's
#: fit.VOTE_SCHEDULE since this study, "option" the schedule the option was first built with
SCHEDULES = {"option": AdaptSchedule(min_rounds=2),
             "half_settle": AdaptSchedule(min_rounds=2, settle_share=0.5),
             "lean": AdaptSchedule(min_rounds=2, settle_share=0.5, max_refreshes=4)}


@contextmanager
def _variant(name: str):
    """methods/adaptive.py's VOTE_SCHEDULE as the variant ``name`` has it."""
    saved = adaptive.VOTE_SCHEDULE
    adaptive.VOTE_SCHEDULE = SCHEDULES.get(name, saved)
    try:
        yield
    finally:
        adaptive.VOTE_SCHEDULE = saved


def refine_all(grids: list[Path], out: Path, part: tuple[int, int],
               variants: tuple[str, ...] = VARIANTS) -> None:
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine
    from mrtf.refinery.methods.adaptive import AdaptiveSettings

    for key, d, seed, res in cached_sets(grids, out, part):
        row = {}
        with H5Dataset(d / "target.h5") as src:
            y = src.labels()
            for name in variants:
                options = None if name == "default" else AdaptiveSettings(True)
                with _variant(name):
                    t0 = time.perf_counter()
                    r = refine(load_received(d / "received"), src,
                               RefineConfig(seed=seed, progress=False, method_options=options))
                row[name] = float((r.probs.argmax(1) == y).mean())
                row[f"{name}_printed"] = [r.accuracy.refined, r.accuracy.plus_minus]
                row[f"{name}_s"] = time.perf_counter() - t0
                row[f"{name}_by"] = None if r.branch is None else r.branch.by
        res[key] = row
        out.write_text(json.dumps(res, indent=0))
        print(key, json.dumps(row), flush=True)


def report(paths: list[Path]) -> None:
    """Per group, over the sets where the option adapted the vote's student: mean accuracy of
    each variant (Δ points against the option; sets better / worse by more than a point), and
    the median seconds."""
    rows: dict[str, dict] = defaultdict(dict)
    for p in paths:
        for k, v in json.loads(p.read_text()).items():
            rows[k].update(v)
    groups = defaultdict(list)
    for key, row in sorted(rows.items()):
        if row["option_by"] == "vote, then adapted":
            groups[key.split("/")[0]].append((key, row))
    shown = [v for v in VARIANTS if all(v in r for g in groups.values() for _, r in g)]
    print("| sets | adapted | " + " | ".join(shown) + " | median s (" + " / ".join(shown)
          + ") | lean: truth inside the printed ± (median ±) |")
    print("|---|---|" + "---|" * len(shown) + "---|---|")
    for group, rs in [*groups.items(), ("all", [r for g in groups.values() for r in g])]:
        acc = {v: np.array([r[v] for _, r in rs]) for v in shown}
        cells = [f"{acc[v].mean():.3f}" for v in shown if v in ("default", "option")]
        for v in (v for v in shown if v not in ("default", "option")):
            d = 100 * (acc[v] - acc["option"])
            cells.append(f"{acc[v].mean():.3f} ({d.mean():+.1f}; {int((d > 1).sum())} / "
                         f"{int((d < -1).sum())})")
        secs = " / ".join(f"{np.median([r[f'{v}_s'] for _, r in rs]):.1f}" for v in shown)
        inside = "–"
        if all("lean_printed" in r for _, r in rs):
            held = [abs(r["lean_printed"][0] - r["lean"]) <= r["lean_printed"][1] for _, r in rs]
            pm = np.median([r["lean_printed"][1] for _, r in rs])
            inside = f"{sum(held)} / {len(held)} ({pm:.3f})"
        print(f"| {group} | {len(rs)} | " + " | ".join(cells) + f" | {secs} | {inside} |")


def main() -> None:
    ap = study_arguments(__doc__)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    if a.report is not None:
        report(a.report)
        return
    variants = tuple(a.variants.split(","))
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    refine_all(a.grid, a.out, a.part, variants)


if __name__ == "__main__":
    main()
