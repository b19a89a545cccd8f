"""``mrtf simulate``: run a FedAvg federation and export what a pilot party receives, or (with
``--config``, ``--methods`` or ``--out``) a federated evaluation run comparing server methods
over seeds (mrtf.federated.runner). Both are the same round engine; this module only parses."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options
from mrtf.errors import InputError
from mrtf.federated.export import Exports
from mrtf.federated.recipes import PARTY_RECIPES, party_recipe
from mrtf.federated.run_config import RunConfig, load_toml
from mrtf.federated.simulate import simulate as run_simulation
from mrtf.models import available_archs
from mrtf.refinery.variants import VARIANTS

#: the run's defaults, from their one definition (RunConfig and its MethodSettings)
_RUN = RunConfig()


@click.command()
@click.option("--dataset", default=_RUN.dataset, show_default=True,
              help="Built-in dataset (digits, mnist5k, mnistm5k), a standard one (mnist, usps, "
                   "mnistm; NAME[:SPLIT][:framed], e.g. mnist:train; bare NAME = its test "
                   "split; usps:train:framed = USPS in MNIST's 20×20-in-28×28 frame; read "
                   "from $MRTF_DATA, see `mrtf data`) or an .h5 file with x and y.")
@click.option("--clients", "-K", default=_RUN.clients, show_default=True,
              help="Number of clients K.")
@click.option("--split", default=_RUN.split, show_default=True,
              help="iid, label:C (C classes per client) or dirichlet:ALPHA.")
@click.option("--ratio", "-R", default=_RUN.ratio, show_default=True,
              help="Fraction of clients selected each round.")
@click.option("--rounds", "-T", default=_RUN.rounds, show_default=True,
              help="Communication rounds.")
@click.option("--epochs", "-E", default=_RUN.epochs, show_default=True,
              help="Local epochs per round.")
@click.option("--local-steps", type=int, default=None,
              help="Local SGD steps per round (overrides --epochs).")
@click.option("--lr", default=_RUN.lr, show_default=True, help="Local SGD learning rate.")
@click.option("--batch-size", default=_RUN.batch_size, show_default=True,
              help="Local batch size (16: clients hold ~200 samples; measured in "
                   "docs/benchmarks/demo-and-runs.md, 64 left a 10-round federation near chance).")
@click.option("--recipe", type=click.Choice(sorted(PARTY_RECIPES)), default=None,
              help="Party recipe: named local-training settings (docs/party-recipe.md); "
                   "'shot' = SHOT's source recipe (lenet_shot, label smoothing 0.1, SGD "
                   "0.01 Nesterov with decay, batch 64, E 30). Flags given override it.")
@click.option("--label-smoothing", type=float, default=None,
              help="Label smoothing ε of the local cross-entropy (0 = none; SHOT 0.1).")
@click.option("--local-augment", is_flag=True, default=None,
              help="Shift (≤ 4/28) and rotate (≤ 10°) every local training image (SHOT's "
                   "USPS source augmentation).")
@click.option("--mu", default=_RUN.mu, show_default=True,
              help="FedProx proximal coefficient μ (0 = FedAvg; evaluation runs: with "
                   "--local-algorithm fedprox, e.g. 0.01).")
@click.option("--arch", default=_RUN.arch, show_default=True,
              help=f"Model architecture: {', '.join(available_archs())}.")
@click.option("--norm", type=click.Choice(["batch", "group", "none"]), default=None,
              help="Normalisation layers, for nets that have them.")
@click.option("--target-size", default=_RUN.target_size, show_default=True,
              help="Samples held out as the server's unlabeled target set.")
@click.option("--image-size", type=int, default=None, help="Resize images to this size.")
@click.option("--channels", type=click.Choice(["1", "3"]), default=None,
              help="Convert images to 1 or 3 channels.")
@click.option("--seed", default=_RUN.seeds[0], show_default=True,
              help="Seed for splits, init, training.")
@click.option("--export-received", type=click.Path(path_type=Path), default=None,
              help="Write the last round's received models (bundles) into this directory.")
@click.option("--export-history", is_flag=True,
              help="Also export the latest model of every client of earlier rounds (FedKF's "
                   "OCA teacher uses them; MrTF uses only the newest round).")
@click.option("--export-target", type=click.Path(path_type=Path), default=None,
              help="Write the server's target set (x, and y for scoring) to this .h5 file.")
@click.option("--force", is_flag=True, help="Replace existing outputs.")
@click.option("--device", default=None, help="cpu, cuda, ... (default: CUDA when present).")
@click.option("--config", "config_file", type=click.Path(path_type=Path), default=None,
              help="Run config (TOML) for an evaluation run; command-line flags override it.")
@click.option("--methods", default=None,
              help="Server methods to compare: fedavg, feddf, st, st+rd, mrtf, fedftg, fedkf.")
@click.option("--seeds", default=None, help="Comma-separated seeds (one run per seed).")
@click.option("--out", "run_out", type=click.Path(path_type=Path), default=None,
              help="Run directory (metrics.jsonl/.h5, accuracy.png, summary.md, checkpoints).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its checkpoint.")
@click.option("--target", default=None,
              help="Server's dataset (default: held-out part of --dataset; another name or "
                   ".h5 = cross-domain, resized/channel-converted to the source's shape).")
@click.option("--local-algorithm", type=click.Choice(["fedavg", "fedprox", "scaffold"]),
              default=None, help="Client update (fedprox uses --mu).")
@click.option("--dp-sigma", type=float, default=None,
              help="σ of the Gaussian noise added to each client's update (MrTF Sect. 5.5).")
@click.option("--dp-clip", type=float, default=None,
              help="Clip each client's update to this L2 norm before the noise (0 = none).")
@click.option("--eval-every", type=int, default=None, help="Evaluate every N rounds.")
@click.option("--local-test", type=float, default=None,
              help="Hold out this fraction of each client's data as its local test part and "
                   "record FedKF's AMP / FM / WLP (FedKF and the reference codes: 0.2).")
@click.option("--refine-steps", type=int, default=None,
              help=f"Distillation steps of the refinery methods (default {_RUN.refine_steps}).")
@click.option("--refine-lr", type=float, default=None, help="Distillation lr.")
@click.option("--variant", type=click.Choice(VARIANTS), default=None,
              help="Refinery variant.")
@click.option("--clr-min-round", type=int, default=None,
              help="Skip MrTF's clustered label refinery in the first N rounds "
                   f"(default {_RUN.clr_min_round}).")
@click.option("--keep-training-on-average", is_flag=True, default=None,
              help="Refinery methods: clients keep receiving the plain average (authors' code).")
@click.option("--fusion-iterations", type=int, default=None,
              help=f"FedFTG outer iterations per round (I, default {_RUN.fusion_iterations}).")
@click.option("--fusion-student-steps", type=int, default=None,
              help="FedFTG student steps per iteration "
                   f"(I_d, default {_RUN.fusion_student_steps}).")
@click.option("--fusion-batch", type=int, default=None,
              help="Generated batch size (FedFTG 50, FedKF 64).")
@click.option("--fedkf-kd-from-round", type=int, default=None,
              help="FedKF: knowledge fusion from this round (paper 0, authors' code 1).")
@click.option("--fedkf-oca", type=click.Choice(VARIANTS), default=None,
              help="FedKF OCA over all K slots (paper) or only clients that trained.")
@output_options
def simulate(out: Out, **opts) -> None:
    """Simulate a federation and export received models and the target set; or run and compare
    server methods over seeds (--config / --methods / --out). Both run the same engine: a
    plain simulation is the evaluation run's FedAvg track of --seed, without a run directory."""
    run_keys = ("config_file", "methods", "seeds", "run_out", "resume", "recipe", *RUN_ONLY)
    run_opts = {k: opts.pop(k) for k in run_keys}
    if run_opts["config_file"] or run_opts["methods"] or run_opts["run_out"]:
        return evaluation_run(out, opts, run_opts)
    for key in ("seeds", "resume"):
        if run_opts[key]:
            raise InputError(f"--{key} needs an evaluation run (--methods, --out or --config)")
    data: dict = {key: opts[name] for name, key in SHARED.items()}
    data.update(_recipe(run_opts["recipe"]))
    data["channels"] = int(opts["channels"]) if opts["channels"] else None
    data.update(seeds=[opts["seed"]], methods=["fedavg"])
    data.update({k: run_opts[k] for k in RUN_ONLY if run_opts[k] is not None})
    if data["mu"] > 0 and "local_algorithm" not in data:
        data["local_algorithm"] = "fedprox"  # --mu alone: FedProx, as its help says
    cfg = RunConfig.from_dict(data, "command line")
    cfg.validate()
    exports = Exports(cfg, opts["export_received"], opts["export_target"],
                      opts["export_history"], opts["force"])
    out.say(f"simulating {cfg.dataset}{' → ' + cfg.target if cfg.cross_domain else ''}: "
            f"K={cfg.clients} split={cfg.split} R={cfg.ratio} ({cfg.per_round}/round) "
            f"T={cfg.rounds} E={cfg.epochs} batch={cfg.batch_size} lr={cfg.lr} arch={cfg.arch} "
            f"local={cfg.local_algorithm} seed={opts['seed']}")

    warn_config(cfg, out)

    def show(rec: dict) -> None:
        loss = rec["local_loss"]
        out.say(f"round {rec['round']:>3}/{cfg.rounds}  accuracy {rec['accuracy']:.4f}  "
                f"local loss {float('nan') if loss is None else loss:.4f}  "
                f"{rec['seconds']:.1f}s")

    result = run_simulation(cfg, device=opts["device"], on_record=show,
                            listeners=exports.listeners)
    out.summary({"command": "simulate", "config": cfg.to_dict(), "rounds": result.records,
                 "final_accuracy": result.records[-1]["accuracy"],
                 "outputs": say_exports(exports, out)})


RUN_ONLY = ("target", "local_algorithm", "dp_sigma", "dp_clip", "eval_every", "local_test",
            "refine_steps", "refine_lr", "variant", "clr_min_round", "keep_training_on_average",
            "fusion_iterations", "fusion_student_steps", "fusion_batch", "fedkf_kd_from_round",
            "fedkf_oca", "label_smoothing", "local_augment")
#: CLI option name → RunConfig key, for options shared with the single FedAvg simulation
SHARED = {"dataset": "dataset", "clients": "clients", "split": "split", "ratio": "ratio",
          "rounds": "rounds", "epochs": "epochs", "local_steps": "local_steps", "lr": "lr",
          "batch_size": "batch_size", "mu": "mu", "arch": "arch", "norm": "norm",
          "target_size": "target_size", "image_size": "image_size", "channels": "channels"}


#: RunConfig key → CLI option name, for the keys a party recipe sets
OPTION_OF = {**{key: name for name, key in SHARED.items()}, "label_smoothing": "label_smoothing"}


def _explicit(name: str) -> bool:
    ctx = click.get_current_context()
    src = ctx.get_parameter_source(name)
    return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")


def _recipe(name: str | None) -> dict:
    """The party recipe's RunConfig keys whose flags were not given on the command line."""
    if name is None:
        return {}
    return {k: v for k, v in party_recipe(name).items() if not (k in OPTION_OF and
                                                                _explicit(OPTION_OF[k]))}


def evaluation_run(out: Out, opts: dict, run_opts: dict) -> None:
    """``mrtf simulate --config/--methods/--out``: defaults < config file < explicit flags."""
    from mrtf.federated.runner import RunHooks, run

    data: dict = _recipe(run_opts["recipe"])
    if run_opts["resume"] and run_opts["run_out"] is not None:
        # the run directory holds its config: `--out DIR --resume` alone continues the run
        # (flags given again must agree with it, or the run is refused as a different one)
        data.update(saved_config(run_opts["run_out"]))
    if run_opts["config_file"]:
        data.update(load_toml(run_opts["config_file"]))
    for name, key in SHARED.items():
        if _explicit(name):
            data[key] = opts[name]
    if _explicit("channels") and opts["channels"]:
        data["channels"] = int(opts["channels"])
    if _explicit("seed") and not run_opts["seeds"]:
        data["seeds"] = [opts["seed"]]
    if run_opts["run_out"] is not None:
        data["out"] = str(run_opts["run_out"])
    for key in ("methods", "seeds", *RUN_ONLY):
        if run_opts[key] is not None and _explicit(key):
            data[key] = run_opts[key]
    where = str(run_opts["config_file"] or "command line")
    cfg = RunConfig.from_dict(data, where)
    cfg.validate()
    exports = Exports(cfg, opts["export_received"], opts["export_target"],
                      opts["export_history"], opts["force"])
    out.say(f"evaluation run {cfg.dataset}{' → ' + cfg.target if cfg.cross_domain else ''}: "
            f"K={cfg.clients} split={cfg.split} R={cfg.ratio} T={cfg.rounds} arch={cfg.arch} "
            f"local={cfg.local_algorithm} methods={','.join(cfg.methods)} "
            f"seeds={','.join(map(str, cfg.seeds))} → {cfg.out}")
    warn_config(cfg, out)

    def show(rec: dict) -> None:
        if not out.bars:
            out.say(f"seed {rec['seed']} {rec['method']:<7} round {rec['round']:>3}/"
                    f"{cfg.rounds}  accuracy {rec['accuracy']:.4f}  {rec['seconds']:.1f}s")

    result = run(cfg, cfg.out, resume=run_opts["resume"], force=opts["force"],
                 progress=out.progress, device=opts["device"],
                 hooks=RunHooks(show, out.warn, exports.listeners))
    written = say_exports(exports, out)
    for method, s in result.summary.items():
        out.say(f"{method:<7} final {s['final_mean']:.4f} ± {s['final_std']:.4f}  best of last "
                f"5 {s['best5_mean']:.4f} ± {s['best5_std']:.4f}")
    out.say(f"wrote {result.out}/summary.md, accuracy.png, metrics.jsonl, metrics.h5")
    out.summary({"command": "simulate", "run": str(result.out), "config": cfg.to_dict(),
                 "summary": result.summary, "outputs": written})


def warn_config(cfg: RunConfig, out: Out) -> None:
    if cfg.local_algorithm == "scaffold" and (cfg.dp_sigma > 0 or cfg.dp_clip > 0):
        out.warn("DP noise and clipping apply to the uploaded models only; SCAFFOLD's "
                 "control-variate updates are sent as they are")


def say_exports(exports: Exports, out: Out) -> dict:
    """Say what was exported; returns the paths for the JSON summary."""
    written = exports.written()
    if "received" in written:
        out.say(f"wrote {len(written['received'])} received models to "
                f"{exports.received.directory}")
    if "target" in written:
        out.say(f"wrote the target set to {written['target']}")
    return written


def saved_config(run_dir: Path) -> dict:
    """The settings a run directory was started with (its ``config.json``), or {} when it
    holds none yet (then --resume starts the run)."""
    import json
    from dataclasses import fields

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        raise InputError(f"{path} is unreadable; start the run again with --force") from None
    if not isinstance(saved, dict):
        raise InputError(f"{path} is not a run config; start the run again with --force")
    known = {f.name for f in fields(RunConfig)}  # keys of older versions that no longer exist
    return {k: v for k, v in saved.items() if k in known and k != "out"}
