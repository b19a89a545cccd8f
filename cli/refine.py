"""``mrtf refine``: the pilot party's main job, received models + data → model and labels.

The options build a :class:`mrtf.jobs.RefineJob` (checked once, there) and
:func:`mrtf.jobs.refine_files` does the work; this module only prints what the job says
(:class:`CliReporter`): the parties table and the plan before the long steps, the account
after, and the ``--json`` summary."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

import click

from mrtf.cli.common import Out, output_options
from mrtf.cli.defaults import field_default, field_option
from mrtf.cli.plan import say_plan
from mrtf.cli.refine_report import say_account, say_selection, scores, summary
from mrtf.jobs import FusedFiles, RefinedFiles, RefineJob, Reporter, refine_files
from mrtf.refinery import METHODS, RefineConfig
from mrtf.refinery.config import STREAM_MODES
from mrtf.refinery.fastpath import PRECISIONS
from mrtf.refinery.options import method_options, methods_with_options
from mrtf.refinery.preview import RefinePreview
from mrtf.refinery.prior_choice import CLASS_PRIORS
from mrtf.refinery.registry import method_help
from mrtf.refinery.storage import STREAM_ABOVE_BYTES
from mrtf.refinery.variants import VARIANTS
from mrtf.trust.class_frequencies import parse_class_frequencies


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
@field_option(RefineConfig, "--method", type=click.Choice(METHODS), help=method_help())
@field_option(RefineConfig, "--variant", type=click.Choice(VARIANTS),
              help="Follow the paper, or the authors' public code.")
@click.option("--steps", type=int, default=None,
              help=f"Distillation steps (default {field_default(RefineConfig, 'steps')}; "
                   "data-free: student steps).")
@field_option(RefineConfig, "--batch-size", type=int)
@click.option("--lr", type=float, default=None, help="Distillation learning rate.")
@field_option(RefineConfig, "--tau", type=float, help="Temperature τ.")
@field_option(RefineConfig, "--clr-iterations", type=int)
@field_option(RefineConfig, "--clr-min-round", type=int,
              help="Skip the clustered label refinery for models of the first N rounds "
                   "(rounds 1..N; the paper skips the first 5). 0 = always apply it.")
@field_option(RefineConfig, "--class-prior", type=click.Choice(CLASS_PRIORS),
              help="adaptive: what the vote assumes of your data's class frequencies. "
                   "'uniform': every class about equally often (each model's class bias is "
                   "divided out; better labels on balanced data, worse on skewed data); "
                   "'learned': learnt from the votes; 'auto': whichever of the two gives "
                   "labels that agree more with the data's own nearest neighbours than "
                   "their class frequencies alone would give.")
@field_option(RefineConfig, "--neighbour-vote", type=int,
              help="adaptive: each label is the refined model's vote over the sample and its "
                   "K nearest samples in the model's feature space (+1 point of accuracy on "
                   "the benchmarks, see README). 0: the model's own prediction.")
@field_option(RefineConfig, "--augment/--no-augment",
              help="adaptive: jitter the refined model's inputs while it learns (small "
                   "shifts and rotations; +0.5 to +0.9 points on the benchmarks, see README). "
                   "Images only.")
@field_option(RefineConfig, "--input-reading", metavar="auto|search|off|READING",
              help="How the target's images are read: search (the reading under which the "
                   "parties' predictions are most informative: shrunk by 0.6-0.9, as each "
                   "pixel's contrast to the image's dominant colour, or both; e.g. USPS "
                   "digits that fill their frame, or MNIST-M, read by MNIST parties), off "
                   "(as given) or a READING: FACTOR in [0.5, 2], fg, or fg:FACTOR. auto: "
                   "search for adaptive, off for the other methods. The refined model's "
                   "file keeps the reading for mrtf label.")
@field_option(RefineConfig, "--aggregate",
              help="The parameter average θ_{t+1}: mean (weighted by n_samples), median "
                   "(coordinate-wise) or trimmed:β (coordinate-wise trimmed mean, 0 <= β < 0.5).")
@field_option(RefineConfig, "--trust/--no-trust", "trust",
              help="Measure every party on --data and leave excluded ones out of the "
                   "average and the teachers (default: on for adaptive, off for the paper's "
                   "methods).")
@click.option("--class-frequencies", metavar="F1,F2,...", default=None,
              help="Your data's class frequencies, if you know them: one number per class "
                   "(shares or counts). They replace the even spread of classes the default "
                   "otherwise assumes: its consensus divides each model's class bias out "
                   "toward them, the diversity term of SHOT, NRC and DECISION aims at "
                   "them, and the label-free estimate reads the labels' spread against "
                   "them. Sets the class prior (leave --class-prior at auto).")
@click.option("--option", "method_option", multiple=True, metavar="KEY=VALUE",
              help="A setting of the method's own: a field of its settings, e.g. "
                   "adapt_vote=true for adaptive (also adapt the vote's student), "
                   "sample_budget=20000 for decision. Repeatable. Methods "
                   "that take them: " + ", ".join(methods_with_options()) + ".")
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
@field_option(RefineConfig, "--precision", type=click.Choice(PRECISIONS),
              help="The teachers' pass in fp32 or bf16 (faster on GPUs and CPUs with bf16 "
                   "units; the run notes how often its labels agree with fp32's).")
@field_option(RefineConfig, "--seed", type=int)
@field_option(RefineConfig, "--device", help="cpu, cuda, ... (default: CUDA when present).")
@field_option(RefineConfig, "--stream", type=click.Choice(STREAM_MODES),
              help="Stream the target set: teachers' outputs go to a scratch folder beside the "
                   "labels (removed at the end), memory stays flat in the number of samples. "
                   f"auto: when holding them would take more than ~{STREAM_ABOVE_BYTES >> 20} "
                   "MB. Same labels.")
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
    """The refinery's settings of the options: every option named as a RefineConfig field
    (``--steps`` left out when not given: RefineConfig's default), ``--option`` as the
    method's own settings."""
    given = {f.name: opts[f.name] for f in fields(RefineConfig) if f.name in opts}
    if given["steps"] is None:
        del given["steps"]
    if given["class_frequencies"] is not None:
        given["class_frequencies"] = parse_class_frequencies(given["class_frequencies"])
    options = method_options(opts["method"], opts["method_option"])
    return RefineConfig(**given, progress=progress, method_options=options)


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
