"""Pilot-party mode: collect each party's trained model once, then refine them with the job
``mrtf refine`` runs on a directory.

One round goes to every party in the roster (a party trains from θ_0 on its shard, or sends
the model it trained already: ``--node-config 'model="..."'``); the replies are checked like any
round's. The models are written as received-model bundles into ``OUT/received/`` (with their
label counts, sample counts and losses), then :func:`mrtf.jobs.refine_files` runs on them in
this process, as ``mrtf refine OUT/received --data TARGET --labels OUT/labels.h5 --model
OUT/refined.safetensors`` would (that command line is kept in ``summary.json``): the same
checks, the same outputs, the same bits as a pilot party running the command by hand with the
run's thread count. What the job says (the plan before the long steps) goes to the server log.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from mrtf.engines.flower.config import FlowerConfig
from mrtf.engines.flower.records import to_record
from mrtf.engines.flower.roster import Roster
from mrtf.engines.flower.strategy import MrtfFlowerStrategy
from mrtf.engines.flower.summary import write_json
from mrtf.federated.methods import ServerContext
from mrtf.io.bundles import BundleMeta, save_bundle
from mrtf.jobs import RefineJob, Reporter, refine_files
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.preview import RefinePreview


@dataclass(frozen=True)
class PilotRun:
    """What the ServerApp prepared before the pilot's one round: the checked config, mrtf's
    server context and strategy (FedAvg), the connected parties, θ_0 and the target's y
    (scoring only; None when the file has none)."""

    cfg: FlowerConfig
    ctx: ServerContext
    strategy: Any
    roster: Roster
    init: dict
    target_y: np.ndarray | None


def run_pilot(grid: Any, run: PilotRun, out: Path, say: Callable[[str], None]) -> None:
    cfg, ctx = run.cfg, run.ctx
    every = replace(cfg, fraction=1.0)  # every party, once
    fl = MrtfFlowerStrategy(every, run.strategy, ctx, run.roster, run.init, run.target_y, say,
                            rounds=1)
    fl.start(grid, to_record(run.init), num_rounds=1, timeout=cfg.round_timeout)
    received = out / "received"
    received.mkdir(exist_ok=True)
    for u in fl.last_updates:
        meta = BundleMeta(arch=cfg.arch, num_classes=cfg.num_classes,
                          arch_kwargs=ctx.arch_kwargs, party=f"party-{u.client:03d}",
                          label_counts=list(u.label_counts), n_samples=u.n_samples,
                          train_loss=u.train_loss if np.isfinite(u.train_loss) else None,
                          round=0, role="local")
        save_bundle(received / f"party-{u.client:03d}.safetensors", u.state, meta,
                    require_finite=True)
    say(f"collected {len(fl.last_updates)} models into {received}; refining "
        f"({cfg.pilot_method})")
    job = refine_job(cfg, received, out)
    refine_files(job, LogReporter(say))  # an InputError fails the run with its one line
    write_json(out / "summary.json", {"ok": True, "mode": "pilot", "method": cfg.pilot_method,
                                      "parties": [u.client for u in fl.last_updates],
                                      "command": refine_args(cfg, received, out),
                                      "averaged_accuracy": (fl.records[-1].get("accuracy")
                                                            if fl.records else None)})
    say(f"done: labels {out / 'labels.h5'}, refined model {out / 'refined.safetensors'}")


def refine_job(cfg: FlowerConfig, received: Path, out: Path) -> RefineJob:
    """The job the pilot party runs: :func:`refine_args`'s command as a RefineJob."""
    config = RefineConfig(method=cfg.pilot_method, steps=cfg.refine_steps,
                          clr_min_round=cfg.clr_min_round, variant=cfg.variant, seed=cfg.seed,
                          progress=False, method_options=cfg.method_options())
    return RefineJob(received, cfg.target, labels=out / "labels.h5",
                     model=out / "refined.safetensors", config=config, force=True)


def refine_args(cfg: FlowerConfig, received: Path, out: Path) -> list[str]:
    """The ``mrtf refine`` arguments that run :func:`refine_job` by hand (``mrtf ARGS``, or
    ``python -m mrtf.cli.main ARGS`` with ``OMP_NUM_THREADS`` the run's ``threads``)."""
    return ["refine", str(received),
            "--data", str(cfg.target), "--labels", str(out / "labels.h5"),
            "--model", str(out / "refined.safetensors"), "--method", cfg.pilot_method,
            "--steps", str(cfg.refine_steps), "--clr-min-round", str(cfg.clr_min_round),
            "--variant", cfg.variant, "--seed", str(cfg.seed), "--quiet", "--force",
            *[arg for kv in cfg.pilot_options.split() for arg in ("--option", kv)]]


class LogReporter(Reporter):
    """The job's words in the server log, each line ``refine: ...``; the plan before the
    long steps."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say

    def say(self, line: str) -> None:
        self._say(f"refine: {line}")

    def warn(self, line: str) -> None:
        self._say(f"refine: warning: {line}")

    def planned(self, preview: RefinePreview) -> None:
        for line in preview.lines():
            self.say(line)

    def chosen(self, line: str) -> None:
        self.say(f"plan: {line}")
