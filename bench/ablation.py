"""MrTF ablation (paper Sect. 5.3, Fig. 11) on mnist5k: fedavg / feddf / st / st+rd / mrtf.

Simulates FedAvg (20 clients, ratio 0.2, 2 local epochs, LeNet, 1,000-image target), then
refines the last round's received models (θ_t + local models) with every method and variant
and scores the refined model on the target set (its `y` is used for scoring only).

    python bench/ablation.py                      # full: 2 splits × rounds {1, 10} × seeds {0,1,2}
    python bench/ablation.py --seeds 0 --steps 100  # quick
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from mrtf.federated import RunConfig, run_fedavg
from mrtf.io.bundles import ReceivedSet
from mrtf.io.hdf5 import ArraySource
from mrtf.refinery import METHODS, VARIANTS, RefineConfig, accuracy_of, refine


def received_from(sim) -> ReceivedSet:
    """The last round as a pilot party receives it (in memory, same metadata as export)."""
    return sim.received()


def run_setting(split: str, rounds: int, seed: int, steps: int, local: dict) -> dict:
    cfg = RunConfig(dataset="mnist5k", clients=20, ratio=0.2, split=split, rounds=rounds,
                    arch="lenet", target_size=1000, seeds=[seed], **local)
    t0 = time.perf_counter()
    sim = run_fedavg(cfg, device="cpu")
    received = received_from(sim)
    x, y = sim.federation.target_x.numpy(), sim.federation.target_y.numpy()
    src = ArraySource(x)  # no y: the refinery never sees labels
    acc = {}
    for variant in VARIANTS:
        for method in METHODS:
            if method == "fedavg" and variant == "reference":
                acc[f"{method}/{variant}"] = acc["fedavg/paper"]
                continue
            res = refine(received, src, RefineConfig(method=method, variant=variant,
                                                     steps=steps, seed=seed, progress=False,
                                                     device="cpu"))
            acc[f"{method}/{variant}"] = accuracy_of(res.probs, y)
    return {"split": split, "rounds": rounds, "seed": seed, "steps": steps, "acc": acc,
            "seconds": time.perf_counter() - t0}


def table(rows: list[dict]) -> str:
    lines = []
    keys = sorted({(r["split"], r["rounds"]) for r in rows})
    head = f"{'split':14s} {'R':>3s} {'variant':9s} " + " ".join(f"{m:>13s}" for m in METHODS)
    lines.append(head + "  ordered?")
    for split, rounds in keys:
        sel = [r for r in rows if (r["split"], r["rounds"]) == (split, rounds)]
        for variant in VARIANTS:
            means = []
            cells = []
            for m in METHODS:
                v = np.array([r["acc"][f"{m}/{variant}"] for r in sel]) * 100
                means.append(v.mean())
                cells.append(f"{v.mean():6.1f}±{v.std():4.1f}")
            ok = means[0] < means[1] < means[2] <= means[3] <= means[4]
            lines.append(f"{split:14s} {rounds:3d} {variant:9s} "
                         + " ".join(f"{c:>13s}" for c in cells) + f"  {ok} (n={len(sel)})")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--splits", nargs="+", default=["dirichlet:0.1", "label:3"])
    ap.add_argument("--rounds", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--local-batch", type=int, default=32,
                    help="client batch size (32: ~14 SGD steps a round on ~200 samples)")
    ap.add_argument("--local-lr", type=float, default=0.05)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/ablation.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for split in args.splits:
        for rounds in args.rounds:
            for seed in args.seeds:
                row = run_setting(split, rounds, seed, args.steps, dict(
                    epochs=2, batch_size=args.local_batch, lr=args.local_lr))
                rows.append(row)
                print(json.dumps(row), flush=True)
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows},
                                                     indent=2))
    print(table(rows))
    print("order tested: fedavg < feddf < st <= st+rd <= mrtf (means, accuracy % on target)")


if __name__ == "__main__":
    main()
