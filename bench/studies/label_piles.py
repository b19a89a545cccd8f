"""How wrong are the labels in a class they pile onto (session 35)? Each cached set is
refined by the default at its own seed, y only scoring; recorded per set: the accuracy and,
for each class the labels pile onto (mrtf.trust.label_piles: ≥ 2× an even share and ≥ 20
labels), its share, its precision and the share of the set's errors it holds::

    cd bench/studies
    OMP_NUM_THREADS=1 python label_piles.py --out OUT/lp.json.0 --part 0/2 --grid DIR ... &
    OMP_NUM_THREADS=1 python label_piles.py --out OUT/lp.json.1 --part 1/2 --grid DIR ...
    python label_piles.py --report OUT/lp.json.* --pool grid=lq27 std=std,stdh

A DIR holds ``<set>/received`` and ``<set>/target.h5``; ``--pool NAME=A,B`` reports the sets
whose key starts with A/ or B/ as one group (spread_prior.py's keys and pools).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: the harness

from harness import cached_sets, pooled, pooled_study_main  # noqa: E402

from mrtf.trust.label_piles import label_piles  # noqa: E402


def refine_all(grids: list[Path], out: Path, part: tuple[int, int]) -> None:
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    for key, d, seed, res in cached_sets(grids, out, part):
        with H5Dataset(d / "target.h5") as src:
            y = src.labels()
            t0 = time.perf_counter()
            r = refine(load_received(d / "received"), src, RefineConfig(seed=seed, progress=False))
        labels = r.probs.argmax(1)
        wrong = labels != y
        piles = [{"label": p.label, "share": p.share,
                  "precision": float((y[labels == p.label] == p.label).mean()),
                  "errors": float((wrong & (labels == p.label)).sum() / max(1, wrong.sum()))}
                 for p in label_piles(labels, r.probs.shape[1])]
        named = [n for n in r.calibration.notes if "pile onto" in n]
        assert len(named) == len(piles), (named, piles)  # refine names each one
        res[key] = {"m": len(y), "acc": float((~wrong).mean()), "piles": piles,
                    "s": time.perf_counter() - t0}
        out.write_text(json.dumps(res, indent=0))
        print(key, json.dumps(res[key]), flush=True)


def report(paths: list[Path], pools: list[str]) -> None:
    """Per group: sets, sets with a pile, piles, their precision (median, max) and the share
    of their set's errors the piles hold (median)."""
    rows = {k: v for p in paths for k, v in json.loads(p.read_text()).items()}
    print("| group | sets | sets with a pile | piles | precision in the pile: median (max) | "
          "the set's errors inside its piles: median |")
    print("|---|---|---|---|---|---|")
    every = []
    for name, keys in pooled(pools, sorted(rows)).items():
        piles = [p for k in keys for p in rows[k]["piles"]]
        every += piles
        held = [sum(p["errors"] for p in rows[k]["piles"]) for k in keys if rows[k]["piles"]]
        prec = [p["precision"] for p in piles]
        print(f"| {name} | {len(keys)} | {len(held)} | {len(piles)} | "
              + (f"{np.median(prec):.2f} ({max(prec):.2f}) | {np.median(held):.2f} |"
                 if piles else "– | – |"))
    prec = [p["precision"] for p in every]
    if prec:
        print(f"\nall {len(prec)} piles: precision median {np.median(prec):.2f}, 90th "
              f"percentile {np.percentile(prec, 90):.2f}, max {max(prec):.2f}")


def main() -> None:
    pooled_study_main(__doc__, refine_all, report)


if __name__ == "__main__":
    main()
