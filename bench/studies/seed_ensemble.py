"""The default refined with three seeds and its labels averaged, and with 1,000 distillation
steps instead of 500 (docs/benchmarks/label-quality.md, tried after the vote; not adopted).
Same sets as bench/studies/second_round.py; y only scores; one JSON per set under ``--out``::

    OMP_NUM_THREADS=1 python bench/studies/seed_ensemble.py --shard 0/2 &   # ~25 s a set
    OMP_NUM_THREADS=1 python bench/studies/seed_ensemble.py --shard 1/2
    python bench/studies/seed_ensemble.py --report
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

import numpy as np  # noqa: E402
from second_round import groups, run  # bench/ is on sys.path when run  # noqa: E402

from mrtf.io import H5Dataset, load_received  # noqa: E402
from mrtf.refinery import RefineConfig, refine  # noqa: E402


def one(where: Path) -> dict:
    """Accuracy of the default at seeds s, s + 100, s + 200 (``single``), of the summed
    voted probabilities of the first two and of all three, and of 1,000 steps at seed s."""
    seed = int(where.name.rsplit("-s", 1)[1])
    rs = load_received(where / "received")
    with H5Dataset(where / "target.h5") as src:
        y = src.labels()

        def acc(p: np.ndarray) -> float:
            return float((p.argmax(1) == y).mean())

        probs = [refine(rs, src, RefineConfig(seed=seed + 100 * k, progress=False)).probs
                 for k in range(3)]
        longer = refine(rs, src, RefineConfig(seed=seed, steps=1000, progress=False)).probs
    return {"single": [acc(p) for p in probs], "ens2": acc(probs[0] + probs[1]),
            "ens3": acc(sum(probs)), "steps1000": acc(longer)}


def report(out: Path) -> None:
    for group, r in groups(out):
        first = np.array([v["single"][0] for v in r])
        mean1 = np.array([np.mean(v["single"]) for v in r])
        ens3 = np.array([v["ens3"] for v in r])
        d = ens3 - mean1
        print(f"{group} ({len(r)} sets): seed s {first.mean():.4f}, the 3 seeds' mean "
              f"{mean1.mean():.4f}, 2 averaged {np.mean([v['ens2'] for v in r]):.4f}, "
              f"3 averaged {ens3.mean():.4f} ({100 * d.mean():+.2f} points on the seeds' "
              f"mean; better in {(d > 0).sum()}, worse in {(d < 0).sum()}), 1,000 steps "
              f"{np.mean([v['steps1000'] for v in r]):.4f}")


if __name__ == "__main__":
    run(__doc__, "runs/seed_ensemble", one, report)
