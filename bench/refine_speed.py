"""Refinery stage timings: teacher inference (stacked vs a straightforward loop), CLR, distillation.

K random-init LeNet teachers (1×28×28) on M synthetic uint8 images in an HDF5 file, streamed.
Each (K, M, implementation) runs in its own subprocess so peak RSS (ru_maxrss) is clean.

    python bench/refine_speed.py --K 10 50 --M 10000 100000 --steps 50
    python bench/refine_speed.py --compare --K 50 --threads 1   # in-process ratios + % of peak

``--compare`` times the teacher paths interleaved in one process (best of N, so a loaded
machine hurts all of them alike), counts the conv/linear FLOPs per sample, measures this
machine's fp32 rate with one big ``torch.mm`` and one big conv, and reports the fraction of it
that each path reaches, plus bf16's argmax agreement with the fp32 loop.
"""

from __future__ import annotations

import argparse
import json
import os
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


def _peak_kernels():
    """name → (callable, FLOP): one big GEMM (2,048² × 2,048) and one big conv (32×64×56×56,
    3×3, 64 channels, channels-last), the machine's practical fp32 peak at this thread count."""
    import torch
    import torch.nn.functional as F

    a, b = torch.rand(2048, 2048), torch.rand(2048, 2048)
    x = torch.rand(32, 64, 56, 56).contiguous(memory_format=torch.channels_last)
    w = torch.rand(64, 64, 3, 3).contiguous(memory_format=torch.channels_last)
    return {"mm": (lambda: torch.mm(a, b), 2 * 2048**3),
            "conv": (lambda: F.conv2d(x, w, padding=1), 2 * 32 * 64 * 56 * 56 * 64 * 9)}


def _paths(models, x):
    """name → callable(x) giving (K, B, C) logits, for the in-process comparison."""
    import torch

    from mrtf.refinery.fastpath import fast_forward
    from mrtf.refinery.stacked import stacked_forward
    from mrtf.refinery.teachers import _looped_forward

    def chunked(fwd, rows):
        return lambda: torch.cat([fwd(x[s:s + rows]) for s in range(0, len(x), rows)], 1)

    return {"loop@1024": chunked(_looped_forward(models), 1024),
            "nhwc@1024 (older auto)": chunked(_looped_forward(models, True), 1024),
            "fast per-teacher (old auto)": chunked(fast_forward(models, x[:8]), 1024),
            "stacked oneDNN": chunked(stacked_forward(models, x[:8], engine="onednn"), 1024),
            "stacked native (auto)": chunked(stacked_forward(models, x[:8], engine="native"),
                                             1024),
            "fast bf16": chunked(fast_forward(models, x[:8], "bf16"), 1024)}


def compare(k: int, n: int, threads: int, repeats: int) -> dict:
    """Interleaved best-of-``repeats`` timings of the teacher paths in this process."""
    import torch
    from harness import flops_per_sample  # (imports here keep the workers' RSS clean)

    from mrtf.models import build_model

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    models = [build_model("lenet", 10).eval() for _ in range(k)]
    x = torch.rand(n, 1, 28, 28)
    flop = flops_per_sample(models[0], x)
    load0 = os.getloadavg()
    paths, peak, best, out = _paths(models, x), _peak_kernels(), {}, {}
    timed = {**paths, **{k: f for k, (f, _) in peak.items()}}
    with torch.inference_mode():
        for _ in range(repeats):  # interleaved: the load hits every path alike
            for name, fn in timed.items():
                t0 = time.perf_counter()
                out[name] = fn()
                best[name] = min(best.get(name, float("inf")), time.perf_counter() - t0)
    rates = {f"{k}_gflops": f / best[k] / 1e9 for k, (_, f) in peak.items()}
    top, ref = max(rates.values()), out["loop@1024"]
    rows = {}
    for name in paths:
        t, gflops = best[name], k * n * flop / best[name] / 1e9
        agree = (out[name].argmax(-1) == ref.argmax(-1)).float().mean()
        rows[name] = {"s": t, "speedup_vs_loop": best["loop@1024"] / t, "gflops": gflops,
                      "fraction_of_peak": gflops / top,
                      "max_abs_diff": float((out[name] - ref).abs().max()),
                      "argmax_agreement": float(agree)}
    return {"K": k, "N": n, "threads": threads, "repeats": repeats, "flop_per_sample": flop,
            "peak": rates, "load_before": load0, "load": os.getloadavg(),
            "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "paths": rows}


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
    ap.add_argument("--compare", action="store_true",
                    help="in-process interleaved teacher-path ratios and fraction of peak")
    ap.add_argument("--n", type=int, default=2048, help="images for --compare")
    ap.add_argument("--repeats", type=int, default=3, help="best of N for --compare")
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
    if args.compare:
        _compare_main(args)
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


def _compare_main(args) -> None:
    res = [compare(k, args.n, args.threads, args.repeats) for k in args.K]
    for r in res:
        print(f"K={r['K']} N={r['N']} threads={r['threads']} best of {r['repeats']}, "
              f"load {r['load'][0]:.1f}; {r['flop_per_sample']:,} FLOP/sample; peak mm "
              f"{r['peak']['mm_gflops']:.0f} / conv {r['peak']['conv_gflops']:.0f} GFLOP/s")
        for name, p in r["paths"].items():
            print(f"  {name:27s} {p['s']:7.3f}s  x{p['speedup_vs_loop']:5.2f} vs loop  "
                  f"{p['gflops']:6.1f} GFLOP/s = {100 * p['fraction_of_peak']:4.1f}% of peak  "
                  f"max|d| {p['max_abs_diff']:.1e}  argmax {100 * p['argmax_agreement']:.2f}%")
    out = Path(args.out).with_name("teacher_compare.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"saved {out}")


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
