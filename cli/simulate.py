"""``mrtf simulate``: run a FedAvg federation and export what a pilot party receives."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options
from mrtf.errors import InputError
from mrtf.federated import LocalConfig, SimulationConfig, export_received, export_target, run_fedavg
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
@click.option("--batch-size", default=64, show_default=True, help="Local batch size.")
@click.option("--mu", default=0.0, show_default=True,
              help="FedProx proximal coefficient (0 = FedAvg).")
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
@output_options
def simulate(out: Out, **opts) -> None:
    """Simulate a federation (FedAvg) and export received models and the target set."""
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
            f"({cfg.per_round}/round) T={cfg.rounds} E={cfg.local.epochs} arch={cfg.arch} "
            f"seed={cfg.seed}")

    def show(rec) -> None:
        out.say(f"round {rec.round + 1:>3}/{cfg.rounds}  accuracy {rec.accuracy:.4f}  "
                f"local loss {rec.train_loss:.4f}  {rec.seconds:.1f}s")

    result = run_fedavg(cfg, on_round=show, device=device)
    written: dict[str, object] = {}
    if received_dir is not None:
        paths = export_received(result, received_dir, force=force, history=history)
        written["received"] = [str(p) for p in paths]
        out.say(f"wrote {len(paths)} received models to {received_dir}")
    if target_file is not None:
        export_target(result, target_file)
        written["target"] = str(target_file)
        out.say(f"wrote target set ({len(result.federation.target_y)} samples) to "
                f"{target_file}")
    out.summary({
        "command": "simulate", "config": _config_dict(cfg),
        "rounds": [vars(r) for r in result.records],
        "final_accuracy": result.records[-1].accuracy, "outputs": written,
    })


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
