"""CLR (Eq. 11-12) and the k-means view on 1M × 256 features spilled to disk, as the
streaming refinery runs them: wall, CPU, peak RSS.

    OMP_NUM_THREADS=1 python bench/studies/clr_spill.py   # writes a 1 GB scratch under runs/
"""

import argparse
import os
import resource
import time

import numpy as np
import torch

from mrtf.refinery.cluster import kmeans_assign, prototype_targets
from mrtf.refinery.spill import Scratch


def main(m: int = 1_000_000, d: int = 256, c: int = 10) -> None:
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    with Scratch("runs") as sc:
        f = sc.array("f", (m, d))
        y = rng.integers(0, c, m)
        centers = rng.normal(size=(c, d)).astype(np.float32)
        for s in range(0, m, 50_000):
            noise = rng.normal(size=(len(y[s:s + 50_000]), d)).astype(np.float32)
            f.write(s, np.maximum(centers[y[s:s + 50_000]] + noise, 0))
        targets = np.eye(c, dtype=np.float32)[y] * 0.6 + 0.04

        def cpu() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        c0, w0 = cpu(), time.perf_counter()
        q = prototype_targets(targets, f)
        c1, w1 = cpu(), time.perf_counter()
        kmeans_assign(f, 2 * c, 0)
        c2, w2 = cpu(), time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"CLR {m:,}x{d} spilled: wall {w1 - w0:.1f}s cpu {c1 - c0:.1f}s "
          f"(accuracy vs blobs {(q.argmax(1) == y).mean():.3f}); k-means {2 * c}: wall "
          f"{w2 - w1:.1f}s cpu {c2 - c1:.1f}s; peak RSS {peak:.0f} MB; load "
          f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=256)
    args = ap.parse_args()
    main(args.rows, args.dim)
