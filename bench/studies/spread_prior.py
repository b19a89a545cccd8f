"""Can a class prior read from the target stand in for the calibrator's "balanced classes"
assumption (session 35)? The calibrator's label-spread signal (mrtf.trust.calibration,
FEATURES[5]) is the entropy of the labels' histogram over ln C: the KL divergence of that
histogram from the uniform prior, turned around (spread = 1 − KL(h ‖ u) / ln C). A skewed
target (USPS: its true histogram spreads 0.982) is read as doubt. Each cached set is refined
by the default at its own seed, y only scoring; its estimate is then read again with the
spread measured against other priors as ``refine --class-frequencies`` measures it
(1 − KL(h ‖ prior) / ln C, mrtf.trust.class_frequencies; the library's constants):

- ``uniform``: the library (checked: it reproduces the printed estimate);
- ``kept``: the learned consensus' label histogram where refine's class-prior choice
  (mrtf.refinery.prior_choice, from the target's own neighbourhoods) kept the learned prior,
  else uniform; ``halfway``: half that histogram, half uniform;
- ``true``: the target's true class histogram (an oracle: it reads y; what a user who knows
  the frequencies gets from ``--class-frequencies``).

Recorded per set and prior: the estimate, its ±, the confidence's ECE; and per set the
accuracy, the prior choice and its margin (excess agreement learned − uniform)::

    cd bench/studies
    OMP_NUM_THREADS=1 python spread_prior.py --out OUT/sp.json.0 --part 0/2 --grid DIR ... &
    OMP_NUM_THREADS=1 python spread_prior.py --out OUT/sp.json.1 --part 1/2 --grid DIR ...
    python spread_prior.py --report OUT/sp.json.* --pool grid=lq27 std=std,stdh

A DIR holds ``<set>/received`` and ``<set>/target.h5`` (bench/harness.received_set's
layout); a set's key is ``<DIR's parent's name>/<set>``; ``--pool NAME=A,B`` reports the
sets whose key starts with A/ or B/ as one group.
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

from harness import cached_sets, pooled, pooled_study_main  # noqa: E402

import mrtf.refinery.adaptive as adaptive  # noqa: E402
import mrtf.refinery.report as report_stage  # noqa: E402
import mrtf.refinery.trusted as trusted  # noqa: E402
from mrtf.trust.class_frequencies import normalised  # noqa: E402
from mrtf.trust.metrics import ece  # noqa: E402

PRIORS = ("uniform", "kept", "halfway", "true")
#: what one refine handed the estimate (its arguments) and the class-prior choices it made
SEEN: dict = {}
_CALIBRATED, _CHOOSE = report_stage.calibrated, adaptive.choose_prior


def _seeing_calibrated(*args, **kwargs):
    SEEN["args"], SEEN["kwargs"] = args, kwargs
    return _CALIBRATED(*args, **kwargs)


def _seeing_choice(learned, uniform, neighbours):
    choice = _CHOOSE(learned, uniform, neighbours)
    SEEN.setdefault("choices", []).append((choice, np.bincount(learned, minlength=1)))
    return choice


def prior_for(kind: str, c: int, y: np.ndarray) -> np.ndarray:
    """The prior ``kind`` (:data:`PRIORS`) of this refine, over c classes."""
    u = np.full(c, 1.0 / c)
    choices = SEEN.get("choices") or []
    if kind == "true":
        return np.bincount(y, minlength=c)[:c] / len(y)
    if kind == "uniform" or not choices or choices[-1][0].chosen != "learned":
        return u
    counts = np.zeros(c)
    counts[:len(choices[-1][1])] = choices[-1][1][:c]
    learned = counts / counts.sum()
    return learned if kind == "kept" else 0.5 * learned + 0.5 * u


def read_under(kind: str, y: np.ndarray) -> dict:
    """The estimate, ± and ECE of the refine just run, its spread read against ``kind`` (as
    ``refine --class-frequencies`` would read it: Signals.class_prior; uniform: None)."""
    probs, signals = SEEN["args"][0], SEEN["args"][2]
    prior = prior_for(kind, probs.shape[1], y)
    signals.class_prior = None if kind == "uniform" else normalised(prior)
    try:
        cal, est = trusted.calibrated(*SEEN["args"], **SEEN["kwargs"])
    finally:
        signals.class_prior = None
    ok = probs.argmax(1) == y
    return {"est": est.refined, "pm": est.plus_minus, "ece": ece(cal.confidence, ok)}


def refine_all(grids: list[Path], out: Path, part: tuple[int, int]) -> None:
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    report_stage.calibrated, adaptive.choose_prior = _seeing_calibrated, _seeing_choice
    for key, d, seed, res in cached_sets(grids, out, part):
        with H5Dataset(d / "target.h5") as src:
            y = src.labels()
            SEEN.clear()
            t0 = time.perf_counter()
            r = refine(load_received(d / "received"), src, RefineConfig(seed=seed, progress=False))
            s = time.perf_counter() - t0
        reads = {kind: read_under(kind, y) for kind in PRIORS}
        if abs(reads["uniform"]["est"] - r.accuracy.refined) > 1e-6:
            raise SystemExit(f"{key}: the uniform reading {reads['uniform']['est']} is not the "
                             f"printed estimate {r.accuracy.refined}")
        choice = (SEEN.get("choices") or [(None, None)])[-1][0]
        res[key] = {"m": len(y), "acc": float((r.probs.argmax(1) == y).mean()),
                    "reads": reads, "s": s,
                    "chosen": None if choice is None else choice.chosen,
                    "margin": None if choice is None else
                    choice.excess["learned"] - choice.excess["uniform"]}
        out.write_text(json.dumps(res, indent=0))
        print(key, json.dumps(res[key]), flush=True)


def report(paths: list[Path], pools: list[str]) -> None:
    """Per group and prior: sets, the truth inside the ±, median ±, median ECE, mean |error|
    and mean error (points); then how the prior choice fell per group."""
    rows = {k: v for p in paths for k, v in json.loads(p.read_text()).items()}
    groups = pooled(pools, sorted(rows))
    print("| group | prior | sets | inside ± | median ± | median ECE | mean abs. error | "
          "mean error |")
    print("|---|---|---|---|---|---|---|---|")
    for name, keys in groups.items():
        for kind in PRIORS:
            r = [rows[k]["reads"][kind] for k in keys]
            err = 100 * np.array([x["est"] - rows[k]["acc"] for x, k in zip(r, keys)])
            inside = sum(abs(e) <= 100 * x["pm"] for e, x in zip(err, r))
            print(f"| {name} | {kind} | {len(r)} | {inside} ({inside / len(r):.2f}) | "
                  f"{np.median([x['pm'] for x in r]):.3f} | "
                  f"{np.median([x['ece'] for x in r]):.3f} | {np.abs(err).mean():.1f} | "
                  f"{err.mean():+.1f} |")
    print("\n| group | learned kept | margin: median (min, max) |")
    print("|---|---|---|")
    for name, keys in groups.items():
        margins = [rows[k]["margin"] for k in keys if rows[k]["margin"] is not None]
        kept = defaultdict(int)
        for k in keys:
            kept[rows[k]["chosen"]] += 1
        print(f"| {name} | {kept['learned']} / {len(keys)} | {np.median(margins):+.3f} "
              f"({min(margins):+.3f}, {max(margins):+.3f}) |")


def main() -> None:
    pooled_study_main(__doc__, refine_all, report)


if __name__ == "__main__":
    main()
