"""What CUDA adds to a process's resident memory, step by step (issue 36: the 1M refine's peak
RSS on a GPU, 2.5 GB against the CPU path's 1.0 GB).

Each variant runs in a fresh process and reads ``/proc/self/status`` after each step: the
imports a refine makes, the CUDA context, a matrix product (cuBLAS), a LeNet-sized convolution
(cuDNN unless disabled), the same under bf16 autocast, and a grouped convolution (the K
teachers as one). Variants: as a refine runs; cuDNN disabled (convolutions on PyTorch's own
kernels); ``CUDA_MODULE_LOADING=EAGER`` (to see what lazy loading already saves).

    python bench/gpu_memory.py --out runs/gpu/gpu_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

STEPS = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[2])  # bench/: rss_timeline
from rss_timeline import read_status
def status():
    return {k: round(v) for k, v in read_status(os.getpid()).items()}
rows = []
def mark(step, t0):
    rows.append({"step": step, "s": round(time.perf_counter() - t0, 2), **status()})
t = time.perf_counter(); mark("python", t)
t = time.perf_counter()
import numpy, torch, mrtf.cli.main, mrtf.refinery.pipeline  # what a refine imports
mark("imports", t)
if sys.argv[1] == "nocudnn":
    torch.backends.cudnn.enabled = False
t = time.perf_counter(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
mark("cuda context", t)
t = time.perf_counter(); a = torch.randn(256, 256, device="cuda"); (a @ a).sum().item()
mark("matmul (cuBLAS)", t)
x = torch.randn(512, 1, 28, 28, device="cuda"); w = torch.randn(16, 1, 5, 5, device="cuda")
t = time.perf_counter(); torch.nn.functional.conv2d(x, w).sum().item()
mark("conv fp32", t)
t = time.perf_counter()
with torch.autocast("cuda", dtype=torch.bfloat16):
    torch.nn.functional.conv2d(x, w).sum().item()
mark("conv bf16", t)
xg = torch.randn(512, 10, 28, 28, device="cuda"); wg = torch.randn(160, 1, 5, 5, device="cuda")
t = time.perf_counter(); torch.nn.functional.conv2d(xg, wg, groups=10).sum().item()
mark("grouped conv", t)
t = time.perf_counter()
from mrtf.models.registry import build_model
m = build_model("lenet", 10).cuda().eval()
with torch.no_grad():
    for _ in range(8):
        m.forward_features(torch.randn(8192, 1, 28, 28, device="cuda"))[1].sum().item()
mark("lenet inference", t)
t = time.perf_counter()
pinned = torch.empty(64 << 20, dtype=torch.uint8).pin_memory(); pinned.cuda().sum().item()
mark("64 MB pinned", t)
print(json.dumps(rows))
"""

BENCH = str(Path(__file__).resolve().parent)
VARIANTS = {"default": ({}, "cudnn"), "cudnn disabled": ({}, "nocudnn"),
            "eager module loading": ({"CUDA_MODULE_LOADING": "EAGER"}, "cudnn")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="runs/gpu/gpu_memory.json")
    args = ap.parse_args()
    results = {}
    for name, (env, mode) in VARIANTS.items():
        proc = subprocess.run([sys.executable, "-c", STEPS, mode, BENCH], capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=300)
        if proc.returncode:
            results[name] = {"error": proc.stderr[-2000:]}
            print(f"{name}: failed\n{proc.stderr[-2000:]}")
            continue
        results[name] = rows = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"--- {name} (MB)")
        for r in rows:
            print(f"{r['step']:>18}  {r['s']:6.2f}s  " + " ".join(
                f"{k} {v}" for k, v in r.items() if k not in ("step", "s")))
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
