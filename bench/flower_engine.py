"""Flower engine against the in-process engine: the same federation, seed and method in both,
per-round wall time and final accuracy (run by hand; numbers in docs/benchmarks/flower.md).

    python bench/flower_engine.py --methods fedavg,adaptive --rounds 2 --threads 1

The Flower side is a real loopback deployment (tests/flower_deploy.py: a SuperLink and one
SuperNode per party as separate processes); a round's time there is from sending θ_t to having
aggregated and scored, so it includes each ClientApp's process start (Flower starts one per
message) and the polling of SuperNodes (every 3 s when idle) and SuperExec.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from flower_deploy import Deployment, write_federation  # noqa: E402

from mrtf.federated.run_config import RunConfig  # noqa: E402
from mrtf.federated.runner import run  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default="fedavg,adaptive")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--local-steps", type=int, default=15)
    p.add_argument("--refine-steps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    base = dict(dataset="mnist5k", clients=args.clients, split="dirichlet:1.0", ratio=1.0,
                rounds=args.rounds, epochs=1, local_steps=args.local_steps, arch="lenet",
                target_size=300, seeds=[args.seed], refine_steps=args.refine_steps)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shards, target = write_federation(RunConfig(**base), args.seed, root / "data")
        nodes = [{"partition-id": k, "data": str(s)} for k, s in enumerate(shards)]
        rows = []
        with Deployment(root / "deploy", nodes, threads=args.threads) as d:
            for method in args.methods.split(","):
                t0 = time.perf_counter()
                ref = run(RunConfig(**base, methods=[method]), root / f"in-{method}").records
                t_in = time.perf_counter() - t0
                cfg = {"method": method, "num-rounds": args.rounds, "seed": args.seed,
                       "clients": args.clients, "target": str(target),
                       "out": str(root / f"fl-{method}"), "epochs": 1,
                       "local-steps": args.local_steps, "refine-steps": args.refine_steps,
                       "threads": args.threads}
                rc, log, t_fl = d.run(cfg, timeout=1800)
                if rc != 0:
                    print(log[-3000:])
                    raise SystemExit(f"flower run of {method} failed ({rc})")
                got = [json.loads(x) for x in (root / f"fl-{method}" / "metrics.jsonl")
                       .read_text().splitlines()]
                rows.append({"method": method, "in_process_s": [r["seconds"] for r in ref],
                             "flower_s": [r["seconds"] for r in got],
                             "in_process_total_s": round(t_in, 1),
                             "flower_total_s": round(t_fl, 1),
                             "accuracy_in_process": ref[-1]["accuracy"],
                             "accuracy_flower": got[-1]["accuracy"],
                             "local_loss_equal": ref[-1]["local_loss"] == got[-1]["local_loss"]})
                print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
