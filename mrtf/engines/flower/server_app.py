"""The ServerApp: holds the unlabeled target set, runs the federation with one of mrtf's
strategies (``mode = "train"``), or, as a pilot party, collects every party's model once and
refines them with ``mrtf refine``'s job (``mode = "pilot"``, :mod:`.pilot`).

Outputs go to the run config's ``out`` folder on the server's machine: ``metrics.jsonl`` (one
row per evaluated round), ``model.safetensors`` (the final global model, a bundle that mrtf
reads back), ``summary.json``. A run that cannot go on (bad config, fewer usable parties than
``min-parties``) logs one line ``mrtf: error: ...``, writes ``summary.json`` with that error,
and fails the Flower run with the same line; ``python -m mrtf.engines.flower.launch`` turns it
into exit code 2.
"""

from __future__ import annotations

import json
from logging import ERROR, INFO
from pathlib import Path
from typing import Any

import numpy as np
import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.supercore import log

from mrtf.device import pick_device
from mrtf.engines.flower.checks import enough_parties
from mrtf.engines.flower.config import FlowerConfig
from mrtf.engines.flower.pilot import PilotRun, run_pilot
from mrtf.engines.flower.polling import PollingGrid
from mrtf.engines.flower.records import to_record
from mrtf.engines.flower.roster import gather
from mrtf.engines.flower.strategy import MrtfFlowerStrategy
from mrtf.engines.flower.summary import write_json
from mrtf.errors import InputError, first_line
from mrtf.federated.methods import ServerContext, make_strategy
from mrtf.io.atomic import atomic_path
from mrtf.io.bundles import BundleMeta, save_bundle
from mrtf.io.hdf5 import ArraySource, H5Dataset
from mrtf.models import build_model, image_kwargs

app = ServerApp()


def say(line: str) -> None:
    log(INFO, "mrtf: %s", line)


@app.main()
def main(grid: Grid, context: Context) -> None:
    out: Path | None = None
    try:
        cfg = FlowerConfig.from_run_config(dict(context.run_config))
        out = prepare_out(cfg)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        run(PollingGrid(grid, cfg.poll_interval), cfg, out)
    except InputError as exc:
        line = f"mrtf: error: {exc}"
        log(ERROR, "%s", line)
        if out is not None:
            write_json(out / "summary.json", {"ok": False, "error": str(exc)})
        # raised again so that Flower marks the run failed, with this line as its details
        raise InputError(line) from None


def run(grid: Any, cfg: FlowerConfig, out: Path) -> None:
    """One run, train or pilot mode, with a prepared ``out`` folder."""
    target_x, target_y = load_target(cfg.target)
    image_shape = tuple(int(s) for s in target_x.shape[1:])
    if len(image_shape) != 3:
        raise InputError(f"{cfg.target}: samples of shape {image_shape}; the Flower engine "
                         "takes images (C, H, W)")
    kwargs = image_kwargs(cfg.arch, image_shape[0], image_shape[-1], cfg.norm or None)
    roster = gather(grid, cfg.clients, image_shape, cfg.wait_nodes, cfg.round_timeout, say)
    enough_parties(len(roster.node_of), cfg.min_parties, "at the start")
    method = "fedavg" if cfg.mode == "pilot" else cfg.method
    ctx = ServerContext(arch=cfg.arch, num_classes=cfg.num_classes, arch_kwargs=kwargs,
                        image_shape=image_shape, target=ArraySource(target_x),
                        client_sizes=roster.client_sizes(cfg.clients), seed=cfg.seed,
                        device=pick_device(None), settings=cfg.settings())
    strategy = make_strategy(method, ctx)
    torch.manual_seed(cfg.seed)  # θ_0 as the in-process engine draws it for this seed
    model = build_model(cfg.arch, cfg.num_classes, **kwargs)
    check_target_fits(model, target_x, cfg)
    init = {k: v.detach().clone() for k, v in model.state_dict().items()}
    strategy.initialize(init)
    if cfg.mode == "pilot":
        return run_pilot(grid, PilotRun(cfg, ctx, strategy, roster, init, target_y), out, say)
    fl = MrtfFlowerStrategy(cfg, strategy, ctx, roster, init, target_y, say)
    fl.start(grid, to_record(init), num_rounds=cfg.num_rounds, timeout=cfg.round_timeout)
    finish_train(fl, cfg, ctx, out)


def finish_train(fl: MrtfFlowerStrategy, cfg: FlowerConfig, ctx: ServerContext,
                 out: Path) -> None:
    """metrics.jsonl, the final global model, summary.json."""
    with atomic_path(out / "metrics.jsonl") as tmp:
        tmp.write_text("".join(json.dumps({"seed": cfg.seed, "method": cfg.method, **r},
                                          sort_keys=True) + "\n" for r in fl.records))
    meta = BundleMeta(arch=cfg.arch, num_classes=cfg.num_classes, arch_kwargs=ctx.arch_kwargs,
                      party="server", role="global", round=cfg.num_rounds - 1)
    save_bundle(out / "model.safetensors", fl.state, meta, require_finite=True)
    last = fl.records[-1] if fl.records else {}
    write_json(out / "summary.json", {"ok": True, "mode": "train", "method": cfg.method,
                                      "seed": cfg.seed, "rounds": cfg.num_rounds,
                                      "accuracy": last.get("accuracy"), "final": last})
    say(f"done: {cfg.method}, {cfg.num_rounds} round(s), accuracy "
        f"{last.get('accuracy')}; outputs in {out}")


def load_target(path: str) -> tuple[np.ndarray, np.ndarray | None]:
    """The server's target set: x, and y when the file has it (scoring only)."""
    with H5Dataset(path) as ds:
        return np.ascontiguousarray(ds.read(0, len(ds)), dtype=np.float32), ds.labels()


def check_target_fits(model: torch.nn.Module, x: np.ndarray, cfg: FlowerConfig) -> None:
    try:
        with torch.inference_mode():
            logits = model.eval()(torch.from_numpy(x[:1]))
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise InputError(f"{cfg.target}: samples of shape {tuple(x.shape[1:])} do not fit "
                         f"the {cfg.arch} model ({first_line(exc)})") from None
    if logits.shape[-1] != cfg.num_classes:
        raise InputError(f"the {cfg.arch} model gives {logits.shape[-1]} outputs, not "
                         f"num-classes {cfg.num_classes}")


def prepare_out(cfg: FlowerConfig) -> Path:
    """The outputs' folder: created, or refused when it holds files (unless ``force``)."""
    out = cfg.out_dir()
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a folder")
    if out.exists() and any(out.iterdir()) and not cfg.force:
        raise InputError(f"{out} is not empty; choose a new out folder or set force = true")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{out}: cannot create the out folder ({exc.strerror})") from None
    (out / "summary.json").unlink(missing_ok=True)
    return out


__all__ = ["app"]
