"""Known class frequencies: what ``refine --class-frequencies`` does to the labels and the
estimate, on the sets of bench/standard_digits.py, with their own targets and with targets
made skewed.

Every cached received set (``--grid`` folders of ``<set>/received`` and ``<set>/target.h5``)
is refined by the default at its own seed twice per target: without frequencies (an even
spread assumed) and with the target's true class counts (what a user who knows them gives;
``y`` is read for that and to score, nothing else). Targets (``--targets``):

- ``full``: the set's own target (USPS test: mildly skewed, its largest class 1.79× an even
  share; MNIST test: nearly even);
- ``skew``: class c kept with probability 0.7^c (subsample seed 0): class 0 about 40 times
  as common as class 9;
- ``reversed``: class c kept with probability 0.7^(C−1−c) (subsample seed 1).

Results are cached per (set, target) in the JSON ``--out``: a stopped run loses nothing.
Two single-thread processes share the sets with ``--part 0/2`` and ``--part 1/2``::

    cd bench
    OMP_NUM_THREADS=1 python class_frequencies.py --grid STD/received --out OUT/cf.json.0 \\
        --part 0/2 --targets full,skew,reversed &
    OMP_NUM_THREADS=1 python class_frequencies.py --grid STD/received --out OUT/cf.json.1 \\
        --part 1/2 --targets full,skew,reversed
    python class_frequencies.py --report OUT/cf.json.*

``--only NAME-PART`` (repeatable) refines only the sets whose name contains one of them;
``--method NAME`` refines by another method than the default (``nrc``, ``decision``,
``shot``: the methods whose labels read the frequencies), its results cached under their own
keys (``SET|TARGET|METHOD``) and reported in their own rows.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from pathlib import Path

import numpy as np
from harness import cached_sets, estimate_scored, study_arguments, write_json

from mrtf.io import ArraySource, H5Dataset, load_received
from mrtf.refinery import RefineConfig, refine

#: how fast the kept share falls from one class to the next on the skewed targets
DECAY = 0.7
TARGETS = ("full", "skew", "reversed")


def target_of(path: Path, kind: str) -> tuple[ArraySource | H5Dataset, np.ndarray]:
    """The target ``kind`` (module docstring) made from the set's target file, and its y."""
    full = H5Dataset(path)
    y = full.labels()
    if kind == "full":
        return full, y
    x = full.read(0, len(full))
    c = int(y.max()) + 1
    power = y if kind == "skew" else c - 1 - y
    keep = np.random.default_rng(0 if kind == "skew" else 1).random(len(y)) < DECAY ** power
    return ArraySource(x[keep], y[keep]), y[keep]


def refined(received, target, y: np.ndarray, seed: int, counts: tuple | None,
            method: str = "adaptive") -> dict:
    """One refine by ``method`` (the default: adaptive), scored: accuracy, estimate ± and
    ECE, branch, prior."""
    t0 = time.perf_counter()
    res = refine(received, target, RefineConfig(method=method, seed=seed, progress=False,
                                                class_frequencies=counts))
    said = res.to_dict()
    return {"accuracy": float((res.probs.argmax(1) == y).mean()),
            **estimate_scored(res, y),
            "branch": None if res.branch is None else res.branch.line(),
            "class_prior": (said.get("class_prior") or {}).get("chosen"),
            "seconds": time.perf_counter() - t0}


def cache_key(key: str, kind: str, method: str) -> str:
    """A result's key: ``SET|TARGET`` for the default (the earlier runs' keys), else
    ``SET|TARGET|METHOD``."""
    return f"{key}|{kind}" if method == "adaptive" else f"{key}|{kind}|{method}"


def refine_all(grids: list[Path], out: Path, part: tuple[int, int], kinds: list[str],
               only: list[str], method: str = "adaptive") -> None:
    for key, d, seed, res in cached_sets(grids, out, part):
        if only and not any(s in d.name for s in only):
            continue
        received = load_received(d / "received")
        for kind in kinds:
            if cache_key(key, kind, method) in res:
                continue
            target, y = target_of(d / "target.h5", kind)
            counts = tuple(float(n) for n in np.bincount(y, minlength=int(y.max()) + 1))
            row = {"rows": len(y), "even": refined(received, target, y, seed, None, method),
                   "given": refined(received, target, y, seed, counts, method)}
            res[cache_key(key, kind, method)] = row
            write_json(out, res)
            e, g = row["even"], row["given"]
            print(f"{key} {kind} {method}: {e['accuracy']:.4f} -> {g['accuracy']:.4f} "
                  f"(estimate {e['estimate']:.3f} -> {g['estimate']:.3f})", flush=True)


def group_of(key: str) -> str:
    """``mnist-usps-k10-dir0.5-default-E2-s3|skew`` → ``mnist-usps k10 default | skew``;
    another method's key (``…|skew|nrc``) → ``mnist-usps k10 default, nrc | skew``."""
    name, kind, *method = key.split("/", 1)[1].split("|")
    m = re.match(r"(.+?)-(k\d+)(?:-[^-]+)?-(default|shot)-E\d+-s\d+$", name)
    sets = f"{m.group(1)} {m.group(2)} {m.group(3)}" if m else name
    return f"{sets}{''.join(', ' + x for x in method)} | {kind}"


def report(paths: list[Path]) -> None:
    rows: dict[str, dict] = {}
    for p in paths:
        rows.update({k: v for k, v in json.loads(p.read_text()).items() if "|" in k})
    groups: dict[str, list[dict]] = {}
    for key, row in sorted(rows.items()):
        groups.setdefault(group_of(key), []).append(row)
    print("| sets | target | n | accuracy: even → given | given better / worse (> 0.5 pt) "
          "| estimate error: even → given (points) | truth inside ± | median ECE "
          "| median ± (points) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in sorted(groups.items()):
        sets, kind = name.split(" | ")
        acc = [np.mean([r[v]["accuracy"] for r in rs]) for v in ("even", "given")]
        diff = [r["given"]["accuracy"] - r["even"]["accuracy"] for r in rs]
        err = [100 * np.mean([r[v]["estimate"] - r[v]["accuracy"] for r in rs])
               for v in ("even", "given")]
        inside = [sum(abs(r[v]["estimate"] - r[v]["accuracy"]) <= r[v]["plus_minus"]
                      for r in rs) for v in ("even", "given")]
        ece = [statistics.median(r[v]["ece"] for r in rs) for v in ("even", "given")]
        half = [100 * statistics.median(r[v]["plus_minus"] for r in rs)
                for v in ("even", "given")]
        print(f"| {sets} | {kind} | {len(rs)} | {acc[0]:.3f} → **{acc[1]:.3f}** | "
              f"{sum(d > 0.005 for d in diff)} / {sum(d < -0.005 for d in diff)} | "
              f"{err[0]:+.1f} → {err[1]:+.1f} | {inside[0]} → {inside[1]} | "
              f"{ece[0]:.3f} → {ece[1]:.3f} | {half[0]:.1f} → {half[1]:.1f} |")


def main() -> None:
    ap = study_arguments(__doc__)
    ap.add_argument("--targets", default="full", help=f"comma-separated of {TARGETS}")
    ap.add_argument("--only", action="append", default=[],
                    help="refine only the sets whose name contains this (repeatable)")
    ap.add_argument("--method", default="adaptive",
                    help="the refine method (default: adaptive)")
    a = ap.parse_args()
    if a.report is not None:
        report(a.report)
        return
    kinds = a.targets.split(",")
    if not set(kinds) <= set(TARGETS):
        ap.error(f"--targets: choose from {', '.join(TARGETS)}")
    refine_all(a.grid, a.out, a.part, kinds, a.only, a.method)


if __name__ == "__main__":
    main()
