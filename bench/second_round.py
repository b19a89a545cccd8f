"""A second refinement round on the default's voted labels (README, "Label quality", tried
after the vote; not adopted): each received set of the label-quality grid and the fresh
scenarios refined by the default, then a model distilled again (500 steps, input jitter,
seed + 1000) to the voted probabilities and voted again; ``cont`` starts from the refined
model, ``restart`` from θ_{t+1}. y only scores. One JSON per set under ``--out``, so a
stopped run loses nothing::

    OMP_NUM_THREADS=1 python bench/second_round.py --shard 0/2 &   # ~18 s a set
    OMP_NUM_THREADS=1 python bench/second_round.py --shard 1/2
    python bench/second_round.py --report
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

from mrtf.io import H5Dataset, load_received
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.distill import distill
from mrtf.refinery.neighbour_vote import final_probs

SETS = ("runs/label_quality/received", "runs/fresh/received")


def all_sets() -> list[Path]:
    """The cached received sets of the grid and the fresh scenarios (bench/label_quality.py)."""
    return [d for root in SETS for d in sorted(Path(root).glob("*-s[0-9]"))]


def one(where: Path) -> dict:
    """The set's labels after the default (r1) and after each second round."""
    seed = int(where.name.rsplit("-s", 1)[1])
    cfg = RefineConfig(seed=seed, progress=False)
    with H5Dataset(where / "target.h5") as src:
        y = src.labels()
        rs = load_received(where / "received")
        first = refine(rs, src, cfg)
        novelty = first.info.get("novelty")
        row = {"r1": float((first.probs.argmax(1) == y).mean()),
               "adapted": bool(isinstance(novelty, dict) and novelty.get("adapt"))}
        theta = refine(rs, src, RefineConfig(method="fedavg", progress=False)).model
        for name, start in (("cont", first.model), ("restart", theta)):
            model = distill(copy.deepcopy(start), src, first.probs.astype(np.float32),
                            cfg.steps, cfg.batch_size, cfg.lr, seed + 1000,
                            torch.device("cpu"), cfg.variant, False, cfg.jitter)
            probs, _ = final_probs(model, src, cfg.vote_k)
            row[name] = float((probs.argmax(1) == y).mean())
    return row


def groups(out: Path) -> Iterator[tuple[str, list[dict]]]:
    """The rows under ``out``, the grid's and the fresh sets' apart (those with any)."""
    rows = {f.stem: json.loads(f.read_text()) for f in sorted(out.glob("*.json"))}
    for group in ("label_quality", "fresh"):
        r = [v for k, v in rows.items() if k.startswith(group)]
        if r:
            yield group, r


def report(out: Path) -> None:
    for group, r in groups(out):
        a = np.array([[v["r1"], v["cont"], v["restart"]] for v in r])
        for j, name in ((1, "cont"), (2, "restart")):
            d = a[:, j] - a[:, 0]
            print(f"{group} ({len(r)} sets) {name}: {a[:, 0].mean():.4f} → {a[:, j].mean():.4f} "
                  f"({100 * d.mean():+.2f} points; better in {(d > 0).sum()}, worse in "
                  f"{(d < 0).sum()}, {100 * d.min():+.1f} to {100 * d.max():+.1f})")


def run(doc: str, default_out: str, one: Callable[[Path], dict],
        report: Callable[[Path], None]) -> None:
    """The command line both studies share: ``one(set)`` per set, a JSON each under --out
    (a stopped run loses nothing), --shard i/n, --report."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(default_out))
    ap.add_argument("--shard", default="0/1", help="i/n: this process takes every n-th set")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    if a.report:
        return report(a.out)
    i, n = map(int, a.shard.split("/"))
    a.out.mkdir(parents=True, exist_ok=True)
    for j, where in enumerate(all_sets()):
        f = a.out / f"{where.parent.parent.name}-{where.name}.json"
        if j % n != i or f.is_file():
            continue
        t0 = time.perf_counter()
        row = one(where)
        f.write_text(json.dumps(row))
        print(f"{f.stem} {row} ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    run(__doc__, "runs/second_round", one, report)
