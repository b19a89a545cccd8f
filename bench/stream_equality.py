"""In-memory vs streaming refine (``--stream off`` / ``on``) on one target set: wall per stage
and whether labels, targets and probabilities are identical.

    OMP_NUM_THREADS=1 python bench/stream_equality.py adaptive \
        runs/scale/received-K10 runs/scale/mnist5k-tiled-100000.h5

(the received set and the tiled file are the ones ``bench/scale.py --e2e`` makes).
"""

import argparse
import os
import time

import numpy as np
import torch

from mrtf.io.bundles import load_received
from mrtf.io.hdf5 import H5Dataset
from mrtf.refinery import RefineConfig, refine


def main() -> None:
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("method", help="a refinery method, e.g. adaptive")
    ap.add_argument("received", help="the received directory")
    ap.add_argument("data", help="the target set (.h5)")
    args = ap.parse_args()
    method, received, data = args.method, args.received, args.data
    rs = load_received(received)
    res = {}
    with H5Dataset(data) as src:
        for mode in ("off", "on"):
            t = time.perf_counter()
            res[mode] = refine(rs, src, RefineConfig(method=method, stream=mode,
                                                     scratch_dir="runs", progress=False,
                                                     clr_min_round=0))
            print(mode, f"{time.perf_counter() - t:.0f}s",
                  {k: round(v, 1) for k, v in res[mode].timings.items()},
                  "load", os.getloadavg()[0], flush=True)
    a, b = res["off"], res["on"]
    print(method, "labels identical:", bool((a.probs.argmax(1) == b.probs.argmax(1)).all()),
          "targets argmax identical:",
          bool((a.target_probs.argmax(1) == b.target_probs.argmax(1)).all()),
          "max |Δ target|", float(np.abs(a.target_probs - b.target_probs).max()),
          "max |Δ probs|", float(np.abs(a.probs - b.probs).max()))


if __name__ == "__main__":
    main()
