"""Refinery stage timings: teacher inference (stacked vs a straightforward loop), CLR, distillation.

K random-init LeNet teachers (1×28×28) on M synthetic uint8 images in an HDF5 file, streamed.
Each (K, M, implementation) runs in its own subprocess so peak RSS (ru_maxrss) is clean.

    python bench/refine_speed.py --K 10 50 --M 10000 100000 --steps 50
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def naive_logits(models, source, batch: int = 256):
    """The straightforward version: one model at a time, re-streaming the whole file per model,
    no_grad, lists concatenated at the end."""
    import torch

    out = []
    for m in models:
        parts = []
        with torch.no_grad():
            for _, chunk in source.chunks(batch):
                parts.append(m(torch.from_numpy(chunk)).numpy())
        out.append(np.concatenate(parts))
    return np.stack(out)


def worker(args) -> dict:
    import torch

    from mrtf.io.hdf5 import H5Dataset
    from mrtf.models import build_model
    from mrtf.refinery import RefineConfig, distill, ensemble_targets, prototype_targets
    from mrtf.refinery import teacher_logits as fast_logits

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    models = [build_model("lenet", 10).eval() for _ in range(args.k)]
    src = H5Dataset(args.h5)
    m = len(src)
    base = _rss_mb()
    res = {"K": args.k, "M": m, "impl": args.impl, "threads": args.threads}
    tracemalloc.start()  # numpy allocations (torch's own are not traced: see RSS)
    t0 = time.perf_counter()
    if args.impl == "naive":
        logits = naive_logits(models, src)
        feats = None
    else:
        out = fast_logits(models, src, args.batch, "cpu", features_of=models[0],
                          stack=args.impl)
        logits, feats = out.logits, out.features
    res["teachers_s"] = time.perf_counter() - t0
    res["teacher_samples_per_s"] = args.k * m / res["teachers_s"]
    res["teachers_numpy_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.reset_peak()
    if feats is not None:
        t0 = time.perf_counter()
        # what refine() does: Eq. 6 + 10 block by block, then Eq. 11-12
        targets = ensemble_targets(logits, args.k - 2, RefineConfig(method="st+rd"), 0.6)
        targets = prototype_targets(targets, feats)
        res["clr_s"] = time.perf_counter() - t0  # Eq. 6 + 10 + 11-12
        res["clr_numpy_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        t0 = time.perf_counter()
        distill(models[0], src, targets, steps=args.steps, batch_size=64)
        res["distill_s"] = time.perf_counter() - t0
        res["distill_steps"] = args.steps
    res["rss_base_mb"] = base
    res["rss_peak_mb"] = _rss_mb()
    res["kmc_mb"] = args.k * m * 10 * 4 / 2**20
    res["md_mb"] = m * 256 * 4 / 2**20  # LeNet features of θ_{t+1}, (M, 256) float32
    return res


def make_h5(path: Path, m: int) -> None:
    from mrtf.io.hdf5 import write_dataset

    rng = np.random.default_rng(0)
    write_dataset(path, rng.integers(0, 256, (m, 1, 28, 28), dtype=np.uint8))



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--K", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--M", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--impls", nargs="+", default=["auto", "vmap", "naive"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--out", default="runs/refine_speed.json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--k", type=int)
    ap.add_argument("--impl")
    ap.add_argument("--h5")
    ap.add_argument("--make-h5")
    ap.add_argument("--m", type=int)
    args = ap.parse_args()
    if args.make_h5:
        make_h5(Path(args.make_h5), args.m)
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in args.M:
            h5 = Path(tmp) / f"target-{m}.h5"
            # in a child, so this process stays small (ru_maxrss is inherited across exec)
            subprocess.check_call([sys.executable, __file__, "--make-h5", str(h5), "--m", str(m)])
            for k in args.K:
                for impl in args.impls:
                    cmd = [sys.executable, __file__, "--worker", "--k", str(k), "--impl", impl,
                           "--h5", str(h5), "--steps", str(args.steps),
                           "--threads", str(args.threads), "--batch", str(args.batch)]
                    row = json.loads(subprocess.check_output(cmd).decode().splitlines()[-1])
                    rows.append(row)
                    print(_fmt(row), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=2))
    print(f"saved {args.out}")


def _fmt(r: dict) -> str:
    extra = (f" clr {r['clr_s']:6.2f}s distill({r['distill_steps']}) {r['distill_s']:6.2f}s"
             f" | numpy peak: teachers {r['teachers_numpy_peak_mb']:.0f} MB, clr "
             f"{r['clr_numpy_peak_mb']:.0f} MB (M·D·4 = {r['md_mb']:.0f} MB)"
             if "clr_s" in r else f" | numpy peak {r['teachers_numpy_peak_mb']:.0f} MB")
    return (f"K={r['K']:3d} M={r['M']:7d} {r['impl']:6s} teachers {r['teachers_s']:7.2f}s "
            f"({r['teacher_samples_per_s']:8.0f} model-samples/s){extra} "
            f"RSS base {r['rss_base_mb']:6.0f} MB peak {r['rss_peak_mb']:6.0f} MB "
            f"(K·M·C·4 = {r['kmc_mb']:.0f} MB)")


if __name__ == "__main__":
    main()
