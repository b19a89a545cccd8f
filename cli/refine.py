"""``mrtf refine``: the pilot party's main job, received models + data → model and labels.

The options build a :class:`mrtf.jobs.RefineJob` (checked once, there) and
:func:`mrtf.jobs.refine_files` does the work; this module only prints what the job says
(:class:`CliReporter`): the parties table and the plan before the long steps, the account
after, and the ``--json`` summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from mrtf.cli.common import Out, output_options
from mrtf.cli.plan import say_plan
from mrtf.cli.refine_report import say_account, say_selection, scores, summary
from mrtf.jobs import FusedFiles, RefinedFiles, RefineJob, Reporter, refine_files
from mrtf.refinery import METHODS, RefineConfig
from mrtf.refinery.neighbour_vote import NEIGHBOURS
from mrtf.refinery.preview import RefinePreview
from mrtf.refinery.registry import method_help


@click.command(name="refine")
@click.argument("received", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(path_type=Path), default=None,
              help="The unlabeled target set (.h5 with x). Without it: data-free fusion.")
@click.option("--labels", "labels_out", type=click.Path(path_type=Path), default=None,
              help="Write the labels of --data here (.h5).")
@click.option("--model", "model_out", type=click.Path(path_type=Path), default=None,
              help="Write the refined model here (.safetensors bundle).")
@click.option("--csv", "csv_out", type=click.Path(path_type=Path), default=None,
              help="Write the labels as CSV too: id (the file name, or the row), label, "
                   "confidence.")
@click.option("--method", type=click.Choice(METHODS), default="adaptive", show_default=True,
              help=method_help())
@click.option("--variant", type=click.Choice(["paper", "reference"]), default="paper",
              show_default=True, help="Follow the paper, or the authors' public code.")
@click.option("--steps", type=int, default=None,
              help="Distillation steps (default 500; data-free: student steps).")
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--lr", type=float, default=None, help="Distillation learning rate.")
@click.option("--tau", type=float, default=4.0, show_default=True, help="Temperature τ.")
@click.option("--clr-iterations", type=int, default=1, show_default=True)
@click.option("--clr-min-round", type=int, default=5, show_default=True,
              help="Skip the clustered label refinery for models of the first N rounds "
                   "(rounds 1..N; the paper skips the first 5). 0 = always apply it.")
@click.option("--class-prior", type=click.Choice(["auto", "learned", "uniform"]),
              default="auto", show_default=True,
              help="adaptive: what the vote assumes of your data's class frequencies. "
                   "'uniform': every class about equally often (each model's class bias is "
                   "divided out; better labels on balanced data, worse on skewed data); "
                   "'learned': learnt from the votes; 'auto': whichever of the two gives "
                   "labels that agree more with the data's own nearest neighbours than "
                   "their class frequencies alone would give.")
@click.option("--neighbour-vote", type=int, default=NEIGHBOURS,
              show_default=True,
              help="adaptive: each label is the refined model's vote over the sample and its "
                   "K nearest samples in the model's feature space (+1 point of accuracy on "
                   "the benchmarks, see README). 0: the model's own prediction.")
@click.option("--augment/--no-augment", default=True, show_default=True,
              help="adaptive: jitter the refined model's inputs while it learns (small "
                   "shifts and rotations; +0.5 to +0.9 points on the benchmarks, see README). "
                   "Images only.")
@click.option("--aggregate", default="mean", show_default=True,
              help="The parameter average θ_{t+1}: mean (weighted by n_samples), median "
                   "(coordinate-wise) or trimmed:β (coordinate-wise trimmed mean, 0 <= β < 0.5).")
@click.option("--trust/--no-trust", "trust", default=None,
              help="Measure every party on --data and leave excluded ones out of the "
                   "average and the teachers (default: on for adaptive, off for the paper's "
                   "methods).")
@click.option("--min-confidence", type=float, default=None,
              help="Leave samples whose calibrated confidence is below this unlabeled "
                   "(label -1, abstained = 1 in the labels file).")
@click.option("--coverage", type=float, default=None,
              help="Label only this fraction of the samples, the most confident ones (the "
                   "rest: label -1, abstained = 1).")
@click.option("--student-arch", default=None,
              help="Fresh student architecture (needed when parties' architectures differ).")
@click.option("--student", "student_file", type=click.Path(path_type=Path), default=None,
              help="Start from this model file instead of the parameter average.")
@click.option("--datafree", type=click.Choice(["fedftg", "fedkf"]), default=None,
              help="Without --data: force this data-free method (default: chosen for you).")
@click.option("--dump-samples", type=click.Path(path_type=Path), default=None,
              help="Data-free: write a PNG grid of generated images per class.")
@click.option("--trust-arch", multiple=True, metavar="MODULE:FACTORY",
              help="Your own model code (trusted, local): received files that name this "
                   "module:factory are built with it; the current folder is importable. "
                   "Repeatable.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default=None, help="cpu, cuda, ... (default: CUDA when present).")
@click.option("--stream", type=click.Choice(["auto", "on", "off"]), default="auto",
              show_default=True,
              help="Stream the target set: teachers' outputs go to a scratch folder beside the "
                   "labels (removed at the end), memory stays flat in the number of samples. "
                   "auto: when holding them would take more than ~768 MB. Same labels.")
@click.option("--force", is_flag=True, help="Replace existing outputs.")
@output_options
def refine_cmd(received: Path, data: Path | None, labels_out: Path | None,
               model_out: Path | None, out: Out, csv_out: Path | None = None, **opts: Any
               ) -> None:
    """Refine RECEIVED models into one model and labels for --data (MrTF), or, without
    --data, fuse them data-free (FedFTG / FedKF)."""
    job = RefineJob(received, data, labels_out, model_out, csv_out,
                    config=refine_config(opts, out.progress),
                    min_confidence=opts["min_confidence"], coverage=opts["coverage"],
                    student_arch=opts["student_arch"], student_file=opts["student_file"],
                    trust_arch=opts["trust_arch"], datafree=opts["datafree"],
                    fusion_steps=opts["steps"] if data is None else None,
                    dump_samples=opts["dump_samples"],
                    force=opts["force"])
    reporter = CliReporter(out)
    done = refine_files(job, reporter)
    if isinstance(done, FusedFiles):
        out.summary(fused_summary(done, job))
        return
    out.summary(summary(done.result, done.samples, {"parties": done.parties},
                        job.config.aggregate, done.selection, reporter.accuracy,
                        done.written))


def refine_config(opts: dict[str, Any], progress: bool) -> RefineConfig:
    """The refinery's settings of the options (``--steps`` left out: RefineConfig's
    default)."""
    steps = {} if opts["steps"] is None else {"steps": opts["steps"]}
    return RefineConfig(method=opts["method"], variant=opts["variant"], tau=opts["tau"],
                        batch_size=opts["batch_size"], lr=opts["lr"],
                        clr_iterations=opts["clr_iterations"],
                        clr_min_round=opts["clr_min_round"], seed=opts["seed"],
                        device=opts["device"], progress=progress,
                        class_prior=opts["class_prior"], trust=opts["trust"],
                        aggregate=opts["aggregate"], stream=opts["stream"],
                        neighbour_vote=opts["neighbour_vote"], augment=opts["augment"],
                        **steps)


class CliReporter(Reporter):
    """What the job says, on the terminal: lines and warnings through :class:`Out`, the plan
    before the long steps (cli/plan.py), the account and the scores once refined."""

    def __init__(self, out: Out) -> None:
        self.out = out
        self.accuracy: dict[str, float] = {}
        self.said: list[str] = []  # the plan's lines: the account does not repeat them

    def say(self, line: str) -> None:
        self.out.say(line)

    def warn(self, line: str) -> None:
        self.out.warn(line)

    def planned(self, preview: RefinePreview) -> None:
        self.said += say_plan(preview, self.out)

    def chosen(self, line: str) -> None:
        self.said.append(f"plan: {line}")
        self.out.say(self.said[-1])

    def refined(self, files: RefinedFiles) -> None:
        say_account(files.result, self.out, self.said)
        say_selection(files.selection, files.result.calibration.confidence, self.out)
        self.accuracy = scores(files.result, files.truth, files.own_student, files.selection,
                               self.out)


def fused_summary(done: FusedFiles, job: RefineJob) -> dict[str, Any]:
    """The ``--json`` summary of a data-free refine."""
    result = done.result
    last = result.history[-1] if result.history else {}
    return {"command": "refine", "datafree": done.method, "reason": done.reason,
            "seconds": result.seconds, "warnings": result.warnings, "last_losses": last,
            "parties": done.parties,
            "model": str(job.model) if job.model else None,
            "samples": str(job.dump_samples) if job.dump_samples else None}
