"""``mrtf simulate``: run a FedAvg federation and export what a pilot party receives, or (with
``--config``, ``--methods`` or ``--out``) a federated evaluation run comparing server methods
over seeds (mrtf.federated.runner)."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options
from mrtf.cli.export_run import write_exports
from mrtf.errors import InputError
from mrtf.federated import LocalConfig, SimulationConfig, run_fedavg
from mrtf.federated.simulate import check_received_dir
from mrtf.io.atomic import check_output
from mrtf.models import available_archs


@click.command()
@click.option("--dataset", default="mnist5k", show_default=True,
              help="Built-in dataset (digits, mnist5k, mnistm5k) or an .h5 file with x and y.")
@click.option("--clients", "-K", default=20, show_default=True, help="Number of clients K.")
@click.option("--split", default="dirichlet:0.1", show_default=True,
              help="iid, label:C (C classes per client) or dirichlet:ALPHA.")
@click.option("--ratio", "-R", default=0.2, show_default=True,
              help="Fraction of clients selected each round.")
@click.option("--rounds", "-T", default=1, show_default=True, help="Communication rounds.")
@click.option("--epochs", "-E", default=2, show_default=True, help="Local epochs per round.")
@click.option("--local-steps", type=int, default=None,
              help="Local SGD steps per round (overrides --epochs).")
@click.option("--lr", default=0.05, show_default=True, help="Local SGD learning rate.")
@click.option("--batch-size", default=16, show_default=True,
              help="Local batch size (16: clients hold ~200 samples; measured in "
                   "docs/results.md, 64 left a 10-round federation near chance).")
@click.option("--mu", default=0.0, show_default=True,
              help="FedProx proximal coefficient μ (0 = FedAvg; evaluation runs: with "
                   "--local-algorithm fedprox, e.g. 0.01).")
@click.option("--arch", default="lenet", show_default=True,
              help=f"Model architecture: {', '.join(available_archs())}.")
@click.option("--norm", type=click.Choice(["batch", "group", "none"]), default=None,
              help="Normalisation layers, for nets that have them.")
@click.option("--target-size", default=1000, show_default=True,
              help="Samples held out as the server's unlabeled target set.")
@click.option("--image-size", type=int, default=None, help="Resize images to this size.")
@click.option("--channels", type=click.Choice(["1", "3"]), default=None,
              help="Convert images to 1 or 3 channels.")
@click.option("--seed", default=0, show_default=True, help="Seed for splits, init, training.")
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
              help="Distillation steps of the refinery methods (default 500).")
@click.option("--refine-lr", type=float, default=None, help="Distillation lr.")
@click.option("--variant", type=click.Choice(["paper", "reference"]), default=None,
              help="Refinery variant.")
@click.option("--clr-min-round", type=int, default=None,
              help="Skip MrTF's clustered label refinery in the first N rounds (default 5).")
@click.option("--keep-training-on-average", is_flag=True, default=None,
              help="Refinery methods: clients keep receiving the plain average (authors' code).")
@click.option("--fusion-iterations", type=int, default=None,
              help="FedFTG outer iterations per round (I, default 10).")
@click.option("--fusion-student-steps", type=int, default=None,
              help="FedFTG student steps per iteration (I_d, default 5).")
@click.option("--fusion-batch", type=int, default=None,
              help="Generated batch size (FedFTG 50, FedKF 64).")
@click.option("--fedkf-kd-from-round", type=int, default=None,
              help="FedKF: knowledge fusion from this round (paper 0, authors' code 1).")
@click.option("--fedkf-oca", type=click.Choice(["paper", "reference"]), default=None,
              help="FedKF OCA over all K slots (paper) or only clients that trained.")
@output_options
def simulate(out: Out, **opts) -> None:
    """Simulate a federation (FedAvg) and export received models and the target set; or run
    and compare server methods over seeds (--config / --methods / --out)."""
    run_keys = ("config_file", "methods", "seeds", "run_out", "resume", *RUN_ONLY)
    run_opts = {k: opts.pop(k) for k in run_keys}
    if run_opts["config_file"] or run_opts["methods"] or run_opts["run_out"]:
        return evaluation_run(out, opts, run_opts)
    given = [k for k, v in run_opts.items() if v not in (None, False)]
    exporting = opts["export_received"] is not None or opts["export_target"] is not None
    if given and exporting and all(k in RUN_ONLY for k in given):
        from mrtf.cli.export_run import export_run

        return export_run(out, opts, run_opts, SHARED, RUN_ONLY)
    if given:
        raise InputError(f"--{given[0].replace('_', '-')} needs an evaluation run "
                         "(--methods, --out or --config) or an export (--export-received, "
                         "--export-target)")
    received_dir, target_file = opts.pop("export_received"), opts.pop("export_target")
    force, device = opts.pop("force"), opts.pop("device")
    history = opts.pop("export_history")
    cfg = build_config(opts)
    cfg.validate()
    # Check every output before any work, so a refused run writes nothing.
    if received_dir is not None:
        check_received_dir(received_dir, force)
    if target_file is not None:
        check_output(target_file, force)
    out.say(f"simulating {cfg.dataset}: K={cfg.clients} split={cfg.split} R={cfg.ratio} "
            f"({cfg.per_round}/round) T={cfg.rounds} E={cfg.local.epochs} "
            f"batch={cfg.local.batch_size} lr={cfg.local.lr} arch={cfg.arch} seed={cfg.seed}")

    def show(rec) -> None:
        out.say(f"round {rec.round + 1:>3}/{cfg.rounds}  accuracy {rec.accuracy:.4f}  "
                f"local loss {rec.train_loss:.4f}  {rec.seconds:.1f}s")

    result = run_fedavg(cfg, on_round=show, device=device)
    written = write_exports(result, received_dir, target_file, force, history, out)
    out.summary({
        "command": "simulate", "config": _config_dict(cfg),
        "rounds": [{**vars(r), "round": r.round + 1} for r in result.records],  # 1-based
        "final_accuracy": result.records[-1].accuracy, "outputs": written,
    })


RUN_ONLY = ("target", "local_algorithm", "dp_sigma", "dp_clip", "eval_every", "local_test",
            "refine_steps", "refine_lr", "variant", "clr_min_round", "keep_training_on_average",
            "fusion_iterations", "fusion_student_steps", "fusion_batch", "fedkf_kd_from_round",
            "fedkf_oca")
#: CLI option name → RunConfig key, for options shared with the single FedAvg simulation
SHARED = {"dataset": "dataset", "clients": "clients", "split": "split", "ratio": "ratio",
          "rounds": "rounds", "epochs": "epochs", "local_steps": "local_steps", "lr": "lr",
          "batch_size": "batch_size", "mu": "mu", "arch": "arch", "norm": "norm",
          "target_size": "target_size", "image_size": "image_size", "channels": "channels"}


def _explicit(name: str) -> bool:
    ctx = click.get_current_context()
    src = ctx.get_parameter_source(name)
    return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")


def evaluation_run(out: Out, opts: dict, run_opts: dict) -> None:
    """``mrtf simulate --config/--methods/--out``: defaults < config file < explicit flags."""
    from mrtf.federated.runner import RunConfig, load_toml, run

    for bad in ("export_received", "export_target", "export_history"):
        if opts.get(bad):
            raise InputError(f"--{bad.replace('_', '-')} is for a single FedAvg simulation, "
                             "not an evaluation run (--methods/--out/--config)")
    data: dict = {}
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
    out.say(f"evaluation run {cfg.dataset}{' → ' + cfg.target if cfg.cross_domain else ''}: "
            f"K={cfg.clients} split={cfg.split} R={cfg.ratio} T={cfg.rounds} arch={cfg.arch} "
            f"local={cfg.local_algorithm} methods={','.join(cfg.methods)} "
            f"seeds={','.join(map(str, cfg.seeds))} → {cfg.out}")
    if cfg.local_algorithm == "scaffold" and (cfg.dp_sigma > 0 or cfg.dp_clip > 0):
        out.warn("DP noise and clipping apply to the uploaded models only; SCAFFOLD's "
                 "control-variate updates are sent as they are")

    def show(rec: dict) -> None:
        if not out.bars:
            out.say(f"seed {rec['seed']} {rec['method']:<7} round {rec['round']:>3}/"
                    f"{cfg.rounds}  accuracy {rec['accuracy']:.4f}  {rec['seconds']:.1f}s")

    result = run(cfg, cfg.out, resume=run_opts["resume"], force=opts["force"],
                 progress=out.progress, device=opts["device"], on_record=show,
                 on_warning=out.warn)
    for method, s in result.summary.items():
        out.say(f"{method:<7} final {s['final_mean']:.4f} ± {s['final_std']:.4f}  best of last "
                f"5 {s['best5_mean']:.4f} ± {s['best5_std']:.4f}")
    out.say(f"wrote {result.out}/summary.md, accuracy.png, metrics.jsonl, metrics.h5")
    out.summary({"command": "simulate", "run": str(result.out), "config": cfg.to_dict(),
                 "summary": result.summary})


def saved_config(run_dir: Path) -> dict:
    """The settings a run directory was started with (its ``config.json``), or {} when it
    holds none yet (then --resume starts the run)."""
    import json
    from dataclasses import fields

    from mrtf.federated.runner import RunConfig

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


def build_config(opts: dict) -> SimulationConfig:
    """SimulationConfig from parsed CLI options (LocalConfig errors become InputError)."""
    try:
        local = LocalConfig(epochs=opts.pop("epochs"), steps=opts.pop("local_steps"),
                            lr=opts.pop("lr"), batch_size=opts.pop("batch_size"),
                            mu=opts.pop("mu"))
    except ValueError as exc:
        raise InputError(str(exc)) from None
    channels = opts.pop("channels")
    return SimulationConfig(local=local, channels=int(channels) if channels else None, **opts)


def _config_dict(cfg: SimulationConfig) -> dict:
    from dataclasses import asdict

    return asdict(cfg)
