"""How many rounds should settle an adapted model? (issue 32; mrtf/refinery/fit.py)

θ_{t+1} of a cached received set (bench/standard_digits.py or bench/label_quality.py) is
adapted with the default's SHOT (fit.adapt_settings, seed 0), then settled round by round
(the neighbour vote of the current model, distilled to with jitter, the distillation seed
offset 1000 · round as fit.settle does); the labels' accuracy after each round (the model's
own, and its neighbour vote = the default's labels). Round 1 is the default before
fit.settle_rounds; the adapted model is cached beside the output.

    OMP_NUM_THREADS=1 MRTF_DATA=../shared/data python bench/studies/settle_rounds.py \\
        runs/standard_digits/received/mnist-usps-k10-dir0.5-shot-E10-s0 --rounds 4 --out runs/settle
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from mrtf.io import H5Dataset, load_received
from mrtf.refinery import RefineConfig, distill, predict_probs, refine, shot_adapt
from mrtf.refinery.fit import adapt_settings
from mrtf.refinery.neighbour_vote import final_probs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cell", type=Path, help="a cached cell: <cell>/received, <cell>/target.h5")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("runs/settle"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dev = torch.device("cpu")
    cfg = RefineConfig(method="adaptive", seed=0, progress=False)
    with H5Dataset(args.cell / "target.h5") as src:
        y = src.labels()

        def acc(p: np.ndarray) -> float:
            return round(float((p.argmax(1) == y).mean()), 4)

        torch.manual_seed(0)
        model = refine(load_received(args.cell / "received"), src,
                       RefineConfig(method="fedavg", progress=False)).model
        cache = args.out / f"adapted-{args.cell.name}.pt"
        if cache.is_file():
            model.load_state_dict(torch.load(cache, weights_only=True))
        else:
            model = shot_adapt(model, src, adapt_settings(model, cfg), 0, dev)
            torch.save(model.state_dict(), cache)
        row: dict = {"cell": args.cell.name, "adapted": acc(predict_probs(model, src))}
        run = cfg.distill_run(seed_offset=1000)
        for i in range(args.rounds):
            t0 = time.perf_counter()
            voted, _ = final_probs(model, src, cfg.vote_k, cfg.inference_batch, dev, cfg.stack)
            model = distill(model, src, voted.astype(np.float32),
                            replace(run, seed=run.seed + 1000 * i), dev, False)
            after, _ = final_probs(model, src, cfg.vote_k, cfg.inference_batch, dev, cfg.stack)
            row[f"round {i + 1}"] = {"own": acc(predict_probs(model, src)), "voted": acc(after),
                                     "seconds": round(time.perf_counter() - t0, 1)}
            print(json.dumps(row), flush=True)
    (args.out / f"{args.cell.name}.json").write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
