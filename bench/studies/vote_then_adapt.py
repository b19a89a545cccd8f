"""Should the vote's student be adapted too (session 32)? On parties of the project's recipe
(plain LeNets) the default distils the parties' vote and stops there wherever the target does
not read as new to them (novelty.py), and where it does, it adapts θ_{t+1} alone
(fit.adapts_from_both_starts: both starts only for networks with BatchNorm).

This study refines each set twice at its own seed, y only scoring:

- ``default``: the library as it is;
- ``forced``: the adapt branch taken on every set (the novelty reading is recorded, then
  ignored) and from both starts, θ_{t+1} and the vote's student, for plain networks too; the
  library's own choice between them (adapt_start.choose_start) and its collapse check
  (branch_choice.collapsed_adaptation) decide as usual.

Both starts' label accuracy is recorded, so the report can also read the rule "vote, then
adapt the vote's student" (the student start's labels) and "forced only where the default
votes" without refining again::

    cd bench/studies
    OMP_NUM_THREADS=1 python vote_then_adapt.py --out OUT/run.json.0 --part 0/2 \\
        --grid RECEIVED_DIR [--grid ...] &
    OMP_NUM_THREADS=1 python vote_then_adapt.py --out OUT/run.json.1 --part 1/2 --grid ...
    python vote_then_adapt.py --report OUT/run.json.*

A RECEIVED_DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/harness.py's
``received_set``, or bench/standard_digits.py's ``--out/received``); a set's seed is the
number its name ends with.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness

from harness import cached_sets, study_arguments  # noqa: E402

import mrtf.refinery.fit as fit  # noqa: E402
import mrtf.refinery.methods.adaptive as method  # noqa: E402

SEEN: dict = {}
_CHOOSE_BRANCH, _CHOOSE_START, _BOTH = (method.choose_branch, fit.choose_start,
                                        method.adapts_from_both_starts)


def _forced_branch(novelty, num_local, diversity=None):
    """choose_branch with the novelty reading recorded, then read as 'new' (no start guard:
    both starts are adapted)."""
    if novelty is None:
        return None
    SEEN["novelty"] = bool(novelty.adapt)
    return _CHOOSE_BRANCH(dataclasses.replace(novelty, adapt=True), num_local, None)


def _spying_start(labels, *args, **kwargs):
    """adapt_start.choose_start, each start's label accuracy recorded first (y only scores)."""
    for name, probs in labels.items():
        SEEN["starts"][name] = float((np.asarray(probs).argmax(1) == SEEN["y"]).mean())
    return _CHOOSE_START(labels, *args, **kwargs)


def install(forced: bool) -> None:
    """The library as it is, or the ``forced`` variant (module docstring)."""
    method.choose_branch = _forced_branch if forced else _CHOOSE_BRANCH
    method.adapts_from_both_starts = (lambda model, n: n > 1) if forced else _BOTH
    fit.choose_start = _spying_start


def refine_all(grids: list[Path], out: Path, part: tuple[int, int]) -> None:
    """Both variants on this process's share of the sets (cached in ``out``)."""
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    for key, d, seed, res in cached_sets(grids, out, part):
        row = {}
        with H5Dataset(d / "target.h5") as src:
            SEEN["y"] = src.labels()
            for variant in ("default", "forced"):
                install(variant == "forced")
                SEEN.update(starts={}, novelty=None)
                t0 = time.perf_counter()
                r = refine(load_received(d / "received"), src,
                           RefineConfig(seed=seed, progress=False))
                row[variant] = float((r.probs.argmax(1) == SEEN["y"]).mean())
                row[f"{variant}_s"] = time.perf_counter() - t0
                # what refine printed: "estimated accuracy X (±Y)"
                row[f"{variant}_printed"] = [r.accuracy.refined, r.accuracy.plus_minus]
            row |= {"novelty": SEEN["novelty"], "starts": SEEN["starts"]}
        res[key] = row
        out.write_text(json.dumps(res, indent=0))
        print(key, json.dumps(row), flush=True)


def report(paths: list[Path]) -> None:
    """Per group of sets: the default against each rule, in mean accuracy and sets better /
    worse by more than a point; the rules: forced; forced only where the novelty reading said
    vote; the vote's student adapted where it said vote. Then the refine's wall time, default
    and forced (rows that recorded it)."""
    rows = {k: v for p in paths for k, v in json.loads(p.read_text()).items()}
    groups = defaultdict(list)
    for key, row in sorted(rows.items()):
        groups[key.split("/")[0]].append(row)
    rules = {
        "forced": lambda r: r["forced"],
        "forced where it votes": lambda r: r["default"] if r["novelty"] else r["forced"],
        "student adapted where it votes": lambda r: r["default"] if r["novelty"]
        else r["starts"].get(fit.VOTE_STUDENT, r["default"]),
    }
    print("| sets | n | default | " + " | ".join(rules) + " |")
    print("|---|---|---|" + "---|" * len(rules))
    for group, rs in [*groups.items(), ("all", [r for g in groups.values() for r in g])]:
        base = np.array([r["default"] for r in rs])
        cells = []
        for rule in rules.values():
            d = 100 * (np.array([rule(r) for r in rs]) - base)
            cells.append(f"{base.mean() + d.mean() / 100:.3f} ({d.mean():+.1f}; "
                         f"{int((d > 1).sum())} / {int((d < -1).sum())})")
        print(f"| {group} | {len(rs)} | {base.mean():.3f} | " + " | ".join(cells) + " |")
    timed = [r for r in rows.values() if "forced_s" in r]
    if timed:
        a, b = (float(np.median([r[f"{v}_s"] for r in timed])) for v in ("default", "forced"))
        print(f"median wall per refine over {len(timed)} sets: default {a:.1f} s, forced {b:.1f} s")
    for v in ("default", "forced"):
        read = [(r[f"{v}_printed"], r[v]) for r in timed]
        if read:
            inside = sum(abs(e - acc) <= pm for (e, pm), acc in read)
            print(f"{v}: the truth inside the printed ± in {inside} / {len(read)}, median ± "
                  f"{np.median([pm for (_, pm), _ in read]):.3f}")


def main() -> None:
    a = study_arguments(__doc__).parse_args()
    if a.report is not None:
        report(a.report)
        return
    refine_all(a.grid, a.out, a.part)


if __name__ == "__main__":
    main()
