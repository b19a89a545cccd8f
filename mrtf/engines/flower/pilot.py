"""Pilot-party mode: collect each party's trained model once, then refine them exactly as
``mrtf refine`` does on a directory.

One round goes to every party in the roster (a party trains from θ_0 on its shard, or sends
the model it trained already: ``--node-config 'model="..."'``); the replies are checked like any
round's. The models are written as received-model bundles into ``OUT/received/`` (with their
label counts, sample counts and losses), then ``mrtf refine OUT/received --data TARGET --labels
OUT/labels.h5 --model OUT/refined.safetensors`` runs on them as its own process: the same
checks, the same outputs, the same bits as a pilot party running the command by hand.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mrtf.engines.flower.config import FlowerConfig
from mrtf.engines.flower.records import to_record
from mrtf.engines.flower.roster import Roster
from mrtf.engines.flower.strategy import MrtfFlowerStrategy
from mrtf.errors import InputError
from mrtf.federated.methods import ServerContext
from mrtf.io.bundles import BundleMeta, save_bundle

#: the refine process's stderr lines kept for the error message
STDERR_LINES = 5


def run_pilot(grid: Any, cfg: FlowerConfig, ctx: ServerContext, strategy: Any, roster: Roster,
              init: dict, target_y: np.ndarray | None, out: Path,
              say: Callable[[str], None]) -> None:
    from mrtf.engines.flower.server_app import write_json

    every = FlowerConfig(**{**cfg.__dict__, "fraction": 1.0})  # every party, once
    fl = MrtfFlowerStrategy(every, strategy, ctx, roster, init, target_y, say, rounds=1)
    fl.start(grid, to_record(init), num_rounds=1, timeout=cfg.round_timeout)
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
    args = refine_args(cfg, received, out)
    result = subprocess.run(args, capture_output=True, text=True, env=_env(cfg), check=False)
    for line in result.stdout.splitlines():
        say(f"refine: {line}")
    if result.returncode != 0:
        err = [ln for ln in result.stderr.splitlines() if ln.strip()][-STDERR_LINES:]
        raise InputError(f"mrtf refine failed (exit {result.returncode}): "
                         f"{' '.join(err) or 'no message'}")
    write_json(out / "summary.json", {"ok": True, "mode": "pilot", "method": cfg.pilot_method,
                                      "parties": [u.client for u in fl.last_updates],
                                      "command": args[3:],
                                      "averaged_accuracy": (fl.records[-1].get("accuracy")
                                                            if fl.records else None)})
    say(f"done: labels {out / 'labels.h5'}, refined model {out / 'refined.safetensors'}")


def refine_args(cfg: FlowerConfig, received: Path, out: Path) -> list[str]:
    """The ``mrtf refine`` command line the pilot party runs (``python -m mrtf.cli.main``)."""
    return [sys.executable, "-m", "mrtf.cli.main", "refine", str(received),
            "--data", str(cfg.target), "--labels", str(out / "labels.h5"),
            "--model", str(out / "refined.safetensors"), "--method", cfg.pilot_method,
            "--steps", str(cfg.refine_steps), "--clr-min-round", str(cfg.clr_min_round),
            "--variant", cfg.variant, "--seed", str(cfg.seed), "--quiet", "--force"]


def _env(cfg: FlowerConfig) -> dict[str, str]:
    env = dict(os.environ)
    if cfg.threads:  # the refinery's floats depend on the thread count: the run's, not the default
        env["OMP_NUM_THREADS"] = str(cfg.threads)
    return env
