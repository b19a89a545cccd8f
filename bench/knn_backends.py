"""CLR (Eq. 11-12) and the k-means view on each k-NN / k-means backend (mrtf.compute.backend):
time per call and agreement with the CPU path, on mnist5k-like LeNet features.

The features are a seeded random LeNet's 256-d penultimate layer on mnist5k tiled to M rows
(the cost depends on M and D only); the targets that LeNet's softmax (nearly flat: the argmax
of a row can flip with float rounding, so the CPU path's top-2 margin at a flip is recorded).
Backends: faiss-cpu (the CPU path), torch on the CPU, and torch (or faiss-gpu) on CUDA when
present. Each time is the best of ``--repeats`` calls.

    python bench/knn_backends.py --M 100000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from mrtf.compute.backend import Backend, choose_backend
from mrtf.refinery.cluster import kmeans_assign, prototype_targets


def features(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(M, 256) float32 features and (M, 10) float32 softmax targets of a seeded LeNet."""
    from mrtf.data import load_builtin
    from mrtf.models import build_model

    torch.manual_seed(0)
    net = build_model("lenet", 10).eval()
    x = torch.from_numpy(load_builtin("mnist5k").x)
    with torch.inference_mode():
        h, lg = net.forward_features(x)
    h, p = h.flatten(1).numpy(), torch.softmax(lg, 1).numpy()
    return np.resize(h, (m, h.shape[1])), np.resize(p, (m, p.shape[1]))


def timed(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--M", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    feats, targets = features(args.M)
    backends = [Backend("faiss-cpu", torch.device("cpu")), Backend("torch", torch.device("cpu"))]
    if torch.cuda.is_available():
        backends.append(choose_backend("cuda"))
    rows, ref = [], {}
    for b in backends:
        t_clr, q = timed(lambda b=b: prototype_targets(targets, feats, backend=b), args.repeats)
        t_km, (a, _) = timed(lambda b=b: kmeans_assign(feats, 20, seed=0, backend=b),
                             args.repeats)
        ref = ref or {"q": q, "a": a}
        differ = q.argmax(1) != ref["q"].argmax(1)
        top2 = np.sort(ref["q"], 1)[:, -2:]
        row = {"backend": b.name, "device": str(b.device), "M": args.M, "clr_s": t_clr,
               "kmeans_s": t_km, "clr_max_abs_diff": float(np.abs(q - ref["q"]).max()),
               "clr_argmax_differ": int(differ.sum()),  # near-ties: the CPU's top-2 margin
               "clr_margin_at_differ": float((top2[:, 1] - top2[:, 0])[differ].max(initial=0)),
               "kmeans_assign_differ": int((a != ref["a"]).sum())}
        rows.append(row)
        print(json.dumps(row), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
