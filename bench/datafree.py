"""Benchmark: data-free fusion (FedFTG, FedKF) against the plain parameter average.

mnist5k, RunConfig(clients=20, ratio=0.2, split='dirichlet:0.1', epochs=2, arch='lenet',
target_size=1000); the models received after R FedAvg rounds (R = 1 and 10) are fused without
data, and each result is scored on the held-out labeled target set (labels used for scoring
only). Run by hand:

    python bench/datafree.py                      # seeds 0 1 2, R = 1 10
    python bench/datafree.py --seeds 0 --ftg-rounds 5 --kf-steps 100

Prints a table and writes runs/datafree-<time>.json (runs/ is git-ignored).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from mrtf.datafree import FusionConfig, aca_average, fuse
from mrtf.federated import RunConfig, accuracy, export_received, run_fedavg
from mrtf.io.bundles import load_received


def one_case(seed: int, rounds: int, args: argparse.Namespace) -> dict:
    """Simulate, export, fuse three ways, score on the target set."""
    cfg = RunConfig(dataset="mnist5k", clients=20, ratio=0.2, split="dirichlet:0.1",
                    rounds=rounds, arch="lenet", target_size=1000, seeds=[seed], epochs=2,
                    batch_size=args.local_batch, lr=args.local_lr)
    t0 = time.perf_counter()
    sim = run_fedavg(cfg)
    row: dict = {"seed": seed, "fedavg_rounds": rounds, "sim_s": time.perf_counter() - t0}
    x, y = sim.federation.target_x, sim.federation.target_y
    with tempfile.TemporaryDirectory() as tmp:
        export_received(sim, Path(tmp) / "received", history=True)
        received = load_received(Path(tmp) / "received")
    t0 = time.perf_counter()
    avg, _ = aca_average(received.by_role("local"))  # θ_{t+1}: the newest round's average
    row["average"] = {"acc": accuracy(avg, x, y), "s": time.perf_counter() - t0}
    runs = {"fedftg": FusionConfig(method="fedftg", rounds=args.ftg_rounds, seed=seed,
                                   progress=args.progress),
            "fedkf": FusionConfig(method="fedkf", steps=args.kf_steps, seed=seed,
                                  progress=args.progress)}
    for name, fcfg in runs.items():
        res = fuse(received, fcfg)
        row[name] = {"acc": accuracy(res.model, x, y), "s": res.seconds,
                     "warnings": res.warnings, "last": res.history[-1]}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--local-batch", type=int, default=32,
                    help="client batch size (32: ~14 SGD steps a round on ~200 samples)")
    ap.add_argument("--local-lr", type=float, default=0.05)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--fedavg-rounds", type=int, nargs="+", default=[1, 10])
    ap.add_argument("--ftg-rounds", type=int, default=10,
                    help="FedFTG server rounds (each I=10 iterations, I_g=1, I_d=5)")
    ap.add_argument("--kf-steps", type=int, default=200, help="FedKF generator/student steps")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = []
    print(f"{'seed':>4} {'R':>3} {'average':>8} {'fedftg':>8} {'fedkf':>8} "
          f"{'ftg_s':>7} {'kf_s':>7}", flush=True)
    for rounds in args.fedavg_rounds:
        for seed in args.seeds:
            r = one_case(seed, rounds, args)
            rows.append(r)
            print(f"{seed:>4} {rounds:>3} {r['average']['acc']:>8.3f} {r['fedftg']['acc']:>8.3f} "
                  f"{r['fedkf']['acc']:>8.3f} {r['fedftg']['s']:>7.1f} {r['fedkf']['s']:>7.1f}",
                  flush=True)
    for rounds in args.fedavg_rounds:
        sel = [r for r in rows if r["fedavg_rounds"] == rounds]
        mean = {k: sum(r[k]["acc"] for r in sel) / len(sel) for k in ("average", "fedftg",
                                                                       "fedkf")}
        print(f"mean R={rounds}: " + "  ".join(f"{k} {v:.3f}" for k, v in mean.items()))
    out = Path("runs") / f"datafree-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1, default=str))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
