"""Both branches of the adaptive method's vote-or-adapt step, every round of an evaluation run.

In ``mrtf simulate`` the adaptive method's clients train on the plain average, so its
refinement never changes the federation: this script runs one evaluation run and, in every
round, refines both ways (distil the vote; adapt θ_{t+1} with SHOT) and records the novelty
gap, label-free statistics a gate could use, and both branches' labels. y only scores, after
the run. One JSON line per round::

    OMP_NUM_THREADS=1 python bench/studies/inloop_branches.py runs/branches/label-s1.jsonl \\
        --config bench/configs/mnist5k-label.toml --seed 1
    python bench/studies/inloop_branches.py runs/branches/label-s1.jsonl --config ... --seed 1 \\
        --report

(docs/benchmarks/demo-and-runs.md, "In the loop", quotes label:3 seed 1: ~35 minutes on one
loaded core.)
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: harness and the benchmarks
import numpy as np  # noqa: E402
from harness import softmax  # noqa: E402

from mrtf.federated.run_config import load_toml  # noqa: E402
from mrtf.federated.runner import RunConfig, prepare_run  # noqa: E402
from mrtf.refinery import pipeline as pl  # noqa: E402
from mrtf.refinery.adaptive import label_diversity  # noqa: E402
from mrtf.refinery.distill import distill  # noqa: E402
from mrtf.refinery.shot import ShotSettings, shot_adapt  # noqa: E402


def _stats(plan, logits: np.ndarray, nv) -> dict:
    k = len(plan.locals_)
    lab = logits.argmax(2)
    return {"gap": None if nv is None else nv.gap,
            "agree_theta_t_next": float((lab[-2] == lab[-1]).mean()),
            "diversity_next": label_diversity(softmax(logits[-1])),
            "diversity_parties": float(np.median([label_diversity(softmax(logits[i]))
                                                  for i in range(k)])),
            "next_labels": lab[-1]}


def instrument(path: Path) -> None:
    """Patch the pipeline so every adaptive refine runs both branches and logs one line."""
    stash: dict = {}
    novelty = pl._novelty

    def _novelty(plan, logits, used, config, student_given):
        nv = novelty(plan, logits, used, config, student_given)
        stash.update(_stats(plan, logits, nv))
        return nv

    def _fit(student, source, targets, config, dev, nv):
        def labels(m):
            return pl.predict_probs(m, source, 1024, dev).argmax(1)
        vote = distill(copy.deepcopy(student), source, targets, config.steps,
                       config.batch_size, config.lr, config.seed, dev, config.variant, False)
        shot = shot_adapt(copy.deepcopy(student), source,
                          ShotSettings(steps=config.steps, batch_size=config.batch_size),
                          config.seed, dev)
        row = {k: v for k, v in stash.items() if k != "next_labels"}
        row["agree_next_vote"] = float((stash["next_labels"] == targets.argmax(1)).mean())
        row.update({"labels_next": labels(student).tolist(), "labels_vote": labels(vote).tolist(),
                    "labels_shot": labels(shot).tolist(),
                    "labels_consensus": targets.argmax(1).tolist()})
        with path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        return vote  # what the vote branch would send: the run's own labels are the vote's

    pl._novelty, pl.fit_student = _novelty, _fit


def report(path: Path, cfg: RunConfig, seed: int) -> None:
    y = prepare_run(cfg, seed).target_y.numpy()
    print("round  gap     θt~θt+1  div θt+1  θt+1~vote | θt+1   vote   SHOT")
    for i, line in enumerate(path.read_text().splitlines(), 1):
        r = json.loads(line)
        acc = {k: float((np.array(r[f"labels_{k}"]) == y).mean()) for k in ("next", "vote", "shot")}
        gap = "   -  " if r["gap"] is None else f"{r['gap']:+.3f}"
        print(f"{i:5d}  {gap}  {r['agree_theta_t_next']:.2f}     {r['diversity_next']:.2f}      "
              f"{r['agree_next_vote']:.2f}      | {acc['next']:.3f}  {acc['vote']:.3f}  "
              f"{acc['shot']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--config", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    table = load_toml(args.config)
    cfg = RunConfig(**{k: v for k, v in table.items() if k in RunConfig.__dataclass_fields__})
    if args.report:
        report(args.out, cfg, args.seed)
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    instrument(args.out)
    from mrtf.cli.main import cli

    cli(["simulate", "--config", args.config, "--methods", "adaptive", "--seeds",
         str(args.seed), "--out", str(args.out.with_suffix(""))], prog_name="mrtf")


if __name__ == "__main__":
    main()
