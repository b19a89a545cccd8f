"""``mrtf simulate --export-received/--export-target`` with evaluation-run options (DP,
FedProx/SCAFFOLD, a cross-domain --target, ...): one FedAvg federation run by the evaluation
engine, whose last round is exported for ``mrtf refine`` exactly as the plain export is."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from mrtf.cli.common import Out
from mrtf.federated.simulate import (
    LastRound,
    RoundRecord,
    SimulationResult,
    check_received_dir,
    export_received,
    export_target,
)
from mrtf.io.atomic import check_output


def export_run(out: Out, opts: dict[str, Any], run_opts: dict[str, Any],
               shared: dict[str, str], run_only: tuple[str, ...]) -> None:
    """Run FedAvg with every run option given and export its last round."""
    from mrtf.federated.local import LocalResult
    from mrtf.federated.runner import RunConfig, run

    received_dir, target_file = opts["export_received"], opts["export_target"]
    data: dict[str, Any] = {key: opts[name] for name, key in shared.items()}
    data["channels"] = int(opts["channels"]) if opts["channels"] else None
    data.update(seeds=[opts["seed"]], methods=["fedavg"])
    data.update({k: run_opts[k] for k in run_only if run_opts[k] is not None})
    cfg = RunConfig.from_dict(data, "command line")
    cfg.validate()
    if received_dir is not None:  # every output is checked before any work
        check_received_dir(received_dir, opts["force"])
    if target_file is not None:
        check_output(target_file, opts["force"])
    out.say(f"simulating {cfg.dataset}{' → ' + cfg.target if cfg.cross_domain else ''}: "
            f"K={cfg.clients} split={cfg.split} R={cfg.ratio} T={cfg.rounds} arch={cfg.arch} "
            f"local={cfg.local_algorithm} dp_sigma={cfg.dp_sigma} dp_clip={cfg.dp_clip} "
            f"seed={opts['seed']}")
    seen: dict[str, Any] = {"latest": {}}

    def keep(seed: int, method: str, rnd: int, start: dict, updates: list, fed: Any) -> None:
        results = [LocalResult(u.state, u.train_loss, u.label_counts, u.n_samples)
                   for u in updates]
        seen["last"] = LastRound(rnd, start, [u.client for u in updates], results, {})
        seen["latest"].update({u.client: (rnd, r) for u, r in zip(updates, results)})
        seen["fed"] = fed

    def show(rec: dict) -> None:
        out.say(f"round {rec['round']:>3}/{cfg.rounds}  accuracy {rec['accuracy']:.4f}  "
                f"local loss {rec['local_loss']:.4f}  {rec['seconds']:.1f}s")

    with tempfile.TemporaryDirectory(prefix="mrtf-export-run-") as tmp:
        done = run(cfg, Path(tmp) / "run", progress=out.progress, device=opts["device"],
                   on_record=show, on_warning=out.warn, on_updates=keep)
    records = [RoundRecord(r["round"] - 1, r["accuracy"], r["local_loss"] or 0.0, r["seconds"])
               for r in done.records]
    result = SimulationResult(cfg.simulation(opts["seed"]), records, seen["last"], seen["fed"],
                              seen["latest"])
    written = write_exports(result, received_dir, target_file, opts["force"],
                            opts["export_history"], out)
    out.summary({"command": "simulate", "config": cfg.to_dict(), "rounds": done.records,
                 "final_accuracy": done.records[-1]["accuracy"], "outputs": written})


def write_exports(result: SimulationResult, received_dir: Path | None,
                  target_file: Path | None, force: bool, history: bool,
                  out: Out) -> dict[str, Any]:
    """Write what a pilot party receives (and its target set); say so; return the paths."""
    written: dict[str, Any] = {}
    if received_dir is not None:
        paths = export_received(result, received_dir, force=force, history=history)
        written["received"] = [str(p) for p in paths]
        out.say(f"wrote {len(paths)} received models to {received_dir}")
    if target_file is not None:
        export_target(result, target_file)
        written["target"] = str(target_file)
        out.say(f"wrote target set ({len(result.federation.target_y)} samples) to "
                f"{target_file}")
    return written
