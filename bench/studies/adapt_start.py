"""Where should the adapt branch start? (issue 32; mrtf/refinery/adapt_start.py)

The default on cached received sets (bench/standard_digits.py's ``<out>/received/<cell>``),
forced onto the adapt branch, adapting both starts (θ_{t+1} as it is, and the vote's student:
θ_{t+1} distilled to the consensus first), each settled. For each start the labels' accuracy
(read here, with y), their information I = H(mean p) - mean H(p) and their diversity
H(mean p) (what the default chooses by, no y); "kept" is the start the default keeps. One
JSON line per cell in ``--out``; cells already there are skipped, so a stopped run loses
nothing.

    OMP_NUM_THREADS=1 MRTF_DATA=../shared/data python bench/studies/adapt_start.py \\
        runs/standard_digits/received/mnist-usps-k10-dir0.1-shot-E10-s2 --out runs/adapt_start.jsonl
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

import mrtf.refinery.fit as fit
from mrtf.io import H5Dataset, load_received
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.branch_choice import BranchChoice
from mrtf.refinery.methods.adaptive import Adaptive


def seed_of(cell: Path) -> int:
    """The cell's seed, from its name (``...-s<seed>``)."""
    return int(cell.name.rsplit("-s", 1)[1])


def run_cell(cell: Path) -> dict:
    """Both starts' accuracy and information on one cached received set."""
    seen: dict[str, np.ndarray] = {}
    real_choose, real_evidence = fit.choose_start, Adaptive.evidence

    def choose(labels):  # the default's own choice, with what it chose from kept for scoring
        seen.update(labels)
        return real_choose(labels)

    def evidence(self, state):  # the novelty reading as it is, then the adapt branch forced
        real_evidence(self, state)
        state.branch = replace(state.branch or BranchChoice("adapt", "novelty"),
                               chosen="adapt")

    fit.choose_start, Adaptive.evidence = choose, evidence
    try:
        seed = seed_of(cell)
        torch.manual_seed(seed)
        t0 = time.perf_counter()
        with H5Dataset(cell / "target.h5") as target:
            res = refine(load_received(cell / "received"), target,
                         RefineConfig(method="adaptive", seed=seed, progress=False))
            y = target.labels()
    finally:
        fit.choose_start, Adaptive.evidence = real_choose, real_evidence
    start = res.branch.start
    if start is None:
        raise SystemExit(f"{cell}: the default adapts from θ_{{t+1}} only here (one party, or "
                         "a network without BatchNorm: fit.adapts_from_both_starts)")
    return {"cell": cell.name, "seed": seed, "kept": start.kept,
            "accuracy": {k: float((p.argmax(1) == y).mean()) for k, p in seen.items()},
            "information": start.information, "diversity": start.diversity,
            "default_novelty_adapts": res.novelty.adapt,
            "labels_accuracy": float((res.probs.argmax(1) == y).mean()),
            "seconds": time.perf_counter() - t0, "threads": torch.get_num_threads()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cells", type=Path, nargs="+", help="cached cells: <cell>/received, "
                    "<cell>/target.h5")
    ap.add_argument("--out", type=Path, default=Path("runs/adapt_start.jsonl"))
    args = ap.parse_args()
    done = set()
    if args.out.is_file():
        done = {json.loads(line)["cell"] for line in args.out.read_text().splitlines() if line}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for cell in args.cells:
        if cell.name in done:
            continue
        row = run_cell(cell)
        with args.out.open("a") as f:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
        print(json.dumps(row, ensure_ascii=False), flush=True)


if __name__ == "__main__":
    main()
