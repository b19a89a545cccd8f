"""Fresh label-quality cells for issue 13's estimate: scenarios the calibrator's features and
constants were never chosen or fitted on, simulated like bench/label_quality.py's and dumped
like ``bench/calibration.py --dump`` (plus the same cell refined with seed 1 and down the other
branch, for bench/studies/calibration_estimate.py), so they test it out of sample.

    cd bench
    OMP_NUM_THREADS=1 python calibration_fresh.py --out ../runs/fresh          # simulate (~8 min)
    OMP_NUM_THREADS=1 python calibration_fresh.py --out ../runs/fresh --dump   # refine (~10 min)
    # the same seed-1 and other-branch refinements of the grid (runs/seed1, runs/other):
    OMP_NUM_THREADS=1 python calibration_fresh.py --out ../runs --variants GRID
    python calibration_estimate.py --out CALIB_V2 --grid GRID --seed1 ../runs/seed1 \
        --fresh ../runs/fresh [--extend]
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks

import label_quality as lq  # noqa: E402
import numpy as np  # noqa: E402
from calibration import dump, penultimate  # noqa: E402
from harness import FRESH  # noqa: E402


def variants(grid: Path, root: Path) -> None:
    """Each cell refined again with seed 1 (``root/seed1``) and down the other branch, seed 0
    (``root/other``: adapt where the default votes, vote where it adapts)."""
    from mrtf.io import H5Dataset, load_received
    from mrtf.refinery import RefineConfig, refine

    for d in sorted(grid.glob("*/received")):
        cell = d.parent.name
        for kind, seed in (("seed1", 1), ("other", 0)):
            out = root / kind / f"{cell}.npz"
            if out.is_file():
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            branch = lq.other_branch() if kind == "other" else nullcontext()
            with branch, H5Dataset(d.parent / "target.h5") as src:
                r = refine(load_received(d), src, RefineConfig(seed=seed, progress=False))
                feats = penultimate(r.model, src)
            np.savez(out, probs=r.probs, feats=feats,
                     adapt=bool(r.novelty is not None and r.novelty.adapt))
            print(kind, cell, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/fresh")
    ap.add_argument("--cells", default=",".join(FRESH))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--variants", default=None, metavar="GRID",
                    help="only refine GRID's cells with seed 1 and down the other branch")
    ap.add_argument("--dump", action="store_true",
                    help="refine the simulated cells: calib/, seed1/, other/")
    args = ap.parse_args()
    if args.variants:
        variants(Path(args.variants), Path(args.out))
        return
    if args.dump:
        root = Path(args.out)
        (root / "calib").mkdir(parents=True, exist_ok=True)
        dump(str(root / "received"), root / "calib")
        variants(root / "received", root)
        return
    root = Path(args.out)
    for cell in args.cells.split(","):
        for seed in map(int, args.seeds.split(",")):
            t0 = time.perf_counter()
            lq.received_set(cell, seed, root)
            print(f"{cell} seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main()
