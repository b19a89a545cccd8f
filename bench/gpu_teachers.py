"""Teacher inference on CUDA: the loop over models, the grouped LeNets (grouped.py, what
``teacher_logits`` runs there by default; and in bf16, what ``--precision bf16`` runs), the
stacked ``vmap`` pass and stacked.py, fp32, TF32 and bf16, against the GPU's measured rates.

K random-init zoo LeNets (seed 0) on N random 1×28×28 images already on the GPU (the transfer
is timed separately, pageable vs pinned). Every path is timed with CUDA events after warm-up,
median of ``--repeats``; agreement is against the fp32 loop on the CPU (the reference the CPU
fast paths are tested against) and against the GPU loop. cuDNN's TF32 (on by default for
convolutions in PyTorch) is switched off for the fp32 rows and reported as its own row.

    python bench/gpu_teachers.py --K 10 50 --n 65536 --out runs/gpu_teachers.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def _time(fn, repeats: int) -> float:
    """Median seconds of ``fn()`` over ``repeats`` CUDA-event-timed runs, after 3 warm-ups."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def peak_rates(repeats: int) -> dict:
    """fp32 (no TF32) and bf16 GFLOP/s of one big matrix product and one big convolution."""
    dev = torch.device("cuda")
    torch.backends.cudnn.allow_tf32 = False  # fp32 means fp32 (cuDNN's default is TF32)
    torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(8192, 8192, device=dev, dtype=dtype)
        b = torch.randn(8192, 8192, device=dev, dtype=dtype)
        out[f"mm_{dtype}"] = 2 * 8192**3 / _time(lambda a=a, b=b: a @ b, repeats) / 1e9
        x = torch.randn(256, 64, 56, 56, device=dev, dtype=dtype)
        w = torch.randn(64, 64, 3, 3, device=dev, dtype=dtype)
        flop = 2 * 256 * 64 * 56 * 56 * 64 * 9
        out[f"conv_{dtype}"] = flop / _time(
            lambda x=x, w=w: torch.nn.functional.conv2d(x, w, padding=1), repeats) / 1e9
    return out


def compare(k: int, n: int, repeats: int, chunk: int) -> dict:
    from mrtf.models import build_model
    from mrtf.refinery.teachers import _looped_forward, _stacked_forward

    sys.path.insert(0, str(Path(__file__).parent))
    from harness import flops_per_sample  # the same FLOP count as the CPU benchmark

    dev = torch.device("cuda")
    torch.manual_seed(0)
    cpu_models = [build_model("lenet", 10).eval() for _ in range(k)]
    x_cpu = torch.rand(n, 1, 28, 28)
    flop = flops_per_sample(cpu_models[0], x_cpu)
    with torch.inference_mode():
        ref_cpu = torch.cat([_looped_forward(cpu_models)(x_cpu[s:s + 4096])
                             for s in range(0, min(n, 8192), 4096)], 1)
    models = [m.to(dev) for m in cpu_models]
    x = x_cpu.to(dev)

    def chunked(fwd):
        return lambda: torch.cat([fwd(x[s:s + chunk]) for s in range(0, n, chunk)], 1)

    vmap = _stacked_forward(models)
    loop = _looped_forward(models)
    paths = {"loop fp32 (auto)": chunked(loop),
             "loop fp32 @1024": lambda: torch.cat([loop(x[s:s + 1024]) for s in range(0, n, 1024)],
                                                  1),
             "vmap fp32": chunked(vmap)}
    from mrtf.refinery.grouped import grouped_forward
    from mrtf.refinery.precision import in_bf16

    grouped = grouped_forward(models, x[:8])  # the CUDA default since cafa2c9
    if grouped is not None:
        paths["grouped fp32 (default)"] = chunked(grouped)
    try:  # the CPU's stacked path (one GEMM for all first convs, grouped conv2) on CUDA
        from mrtf.refinery.stacked import stacked_forward

        fwd = stacked_forward(models, x[:8])
        if fwd is not None:
            paths["stacked.py fp32"] = chunked(fwd)
    except Exception as exc:  # noqa: BLE001 - reported, not fatal
        print(f"stacked.py on CUDA: {exc!r}")

    def bf16(fn):
        def run():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return fn().float()
        return run

    rows, outs = {}, {}
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.inference_mode():
        for name, fn in paths.items():
            rows[name] = {"s": _time(fn, repeats)}
            outs[name] = fn()
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
        rows["loop tf32"] = {"s": _time(paths["loop fp32 (auto)"], repeats)}
        outs["loop tf32"] = paths["loop fp32 (auto)"]()
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        rows["loop bf16 autocast"] = {"s": _time(bf16(paths["loop fp32 (auto)"]), repeats)}
        outs["loop bf16 autocast"] = bf16(paths["loop fp32 (auto)"])()
        if grouped is not None:  # what `mrtf refine --precision bf16` runs on CUDA
            name, fn = "grouped bf16 (--precision bf16)", chunked(in_bf16(grouped, "cuda"))
            rows[name] = {"s": _time(fn, repeats)}
            outs[name] = fn()
        h2d = {}
        for kind, host in (("pageable", x_cpu), ("pinned", x_cpu.pin_memory())):
            h2d[kind] = _time(lambda host=host: host.to(dev, non_blocking=True), repeats)
    ref = outs["loop fp32 (auto)"]
    m_ref = ref_cpu.shape[1]
    for name, r in rows.items():
        o = outs[name]
        r["speedup_vs_gpu_loop"] = rows["loop fp32 (auto)"]["s"] / r["s"]
        r["model_samples_per_s"] = k * n / r["s"]
        r["gflops"] = k * n * flop / r["s"] / 1e9
        r["argmax_vs_gpu_loop"] = float((o.argmax(-1) == ref.argmax(-1)).float().mean())
        r["argmax_vs_cpu_loop"] = float(
            (o[:, :m_ref].cpu().argmax(-1) == ref_cpu.argmax(-1)).float().mean())
        r["max_abs_diff_vs_cpu"] = float((o[:, :m_ref].cpu() - ref_cpu).abs().max())
    return {"K": k, "N": n, "chunk": chunk, "repeats": repeats, "flop_per_sample": flop,
            "paths": rows, "h2d_s": h2d, "h2d_gb_per_s": {
                kk: x_cpu.numel() * 4 / v / 1e9 for kk, v in h2d.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--K", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--n", type=int, default=65_536)
    ap.add_argument("--chunk", type=int, default=8192, help="rows per forward")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", default="runs/gpu_teachers.json")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench/gpu_teachers.py needs CUDA")
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
           "peak_gflops": peak_rates(args.repeats),
           "cells": [compare(k, args.n, args.repeats, args.chunk) for k in args.K]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2))
    print(f"{res['device']}, torch {res['torch']}; peak GFLOP/s: "
          + ", ".join(f"{k} {v:,.0f}" for k, v in res["peak_gflops"].items()))
    for c in res["cells"]:
        print(f"K={c['K']} N={c['N']} chunk {c['chunk']}: H2D pageable "
              f"{c['h2d_gb_per_s']['pageable']:.1f} GB/s, pinned {c['h2d_gb_per_s']['pinned']:.1f}")
        for name, r in c["paths"].items():
            print(f"  {name:20s} {r['s'] * 1e3:8.2f} ms  x{r['speedup_vs_gpu_loop']:5.2f}  "
                  f"{r['model_samples_per_s']:12,.0f} model-samples/s  {r['gflops']:8.0f} "
                  f"GFLOP/s  argmax vs GPU loop {100 * r['argmax_vs_gpu_loop']:.2f}%, vs CPU "
                  f"{100 * r['argmax_vs_cpu_loop']:.2f}%  max|d| {r['max_abs_diff_vs_cpu']:.1e}")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
