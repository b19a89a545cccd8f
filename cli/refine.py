"""``mrtf refine``: the pilot party's main job, received models + data → model and labels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np

from mrtf.averaging import parse_aggregate
from mrtf.cli.common import Out, output_options, run_guarded
from mrtf.cli.refine_report import say_account, say_selection, scores, summary
from mrtf.errors import InputError
from mrtf.io.bundles import (
    BundleMeta,
    ReceivedSet,
    load_bundle,
    load_received,
    model_files,
    save_bundle,
)
from mrtf.io.fits import check_model_fits
from mrtf.io.hdf5 import H5Dataset
from mrtf.io.labels import LabelSet, write_labels
from mrtf.io.labels_csv import write_labels_csv
from mrtf.io.limits import check_memory
from mrtf.io.outputs import Outputs
from mrtf.io.refined import new_student, refined_meta, student_of_onnx_set
from mrtf.progress import log_lines
from mrtf.refinery import METHODS, RefineConfig, refine
from mrtf.refinery.augment import applies
from mrtf.refinery.neighbour_vote import NEIGHBOURS, check_neighbours
from mrtf.refinery.registry import method_help
from mrtf.refinery.storage import memory_estimate, use_streaming
from mrtf.trust.basin import start_line
from mrtf.trust.parties import describe, duplicate_parties, plan_parties
from mrtf.trust.selective import check_selection, select


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
    if (labels_out is not None or csv_out is not None) and data is None:
        raise InputError("--labels needs --data (the samples to label); without --data, "
                         "refine fuses the models data-free and writes only --model")
    if labels_out is None and model_out is None and csv_out is None:
        raise InputError("nothing to write: give --labels, --csv and/or --model")
    opts["csv_out"] = csv_out
    if data is None and opts["dump_samples"] is None and model_out is None:
        raise InputError("data-free fusion needs --model")
    if data is not None and (opts["datafree"] or opts["dump_samples"]):
        raise InputError("--datafree and --dump-samples apply only without --data")
    try:
        parse_aggregate(opts["aggregate"])
    except ValueError as exc:
        raise InputError(f"--aggregate: {exc}") from None
    if data is None and (opts["aggregate"] != "mean" or opts["trust"]):
        raise InputError("--aggregate and --trust apply with --data only")
    check_selection(opts["min_confidence"], opts["coverage"])
    check_neighbours(opts["neighbour_vote"])
    if data is None and (opts["min_confidence"] is not None or opts["coverage"] is not None):
        raise InputError("--min-confidence and --coverage apply with --data only")
    # every input a listed output could clobber: the received files (and sidecars), the data
    inputs = [p for f in model_files(received) for p in (f, f.with_suffix(".json"))]
    inputs += [data, opts["student_file"]]
    # outputs are checked, locked and their temporary files created before any heavy work
    with Outputs([labels_out, model_out, csv_out, opts["dump_samples"]], opts["force"],
                 inputs) as outs:
        rs = load_received(received, opts["trust_arch"])
        for note in rs.notes:
            out.warn(note)
        job = "refine"
        if data is None and any(m.onnx for m in rs.models):
            raise InputError("data-free fusion trains a generator through the teachers' "
                             "gradients, which ONNX models do not give: refine with --data")
        if data is None:
            from mrtf.datafree import choose_method

            job = choose_method(rs, opts["datafree"])[0]
        opts["parties"] = report_parties(rs, job, out)
        if data is None:
            from mrtf.cli.datafree import run_datafree

            return run_datafree(rs, outs, model_out, opts, out)
        with H5Dataset(data) as source:
            _refine_with_data(rs, source, outs, labels_out, model_out, opts, out)


def _refine_with_data(rs: ReceivedSet, source: H5Dataset, outs: Outputs,
                      labels_out: Path | None, model_out: Path | None, opts: dict[str, Any],
                      out: Out) -> None:
    student, student_meta = load_student(rs, opts, source.sample_shape, out)
    cfg = _checked_config(rs, source, outs, labels_out, model_out, opts, out.progress)
    # y and ids are read (in blocks) now that the job's size is checked: a bad one found
    # after the refinement would waste it
    source.check_columns(rs.num_classes, " of the received models")
    probe_outputs(rs, source, student)
    if cfg.method == "adaptive" and cfg.augment and not applies(source.sample_shape):
        out.say(f"note: input jitter is for images; off for samples of shape "
                f"{source.sample_shape} (feature vectors)")
    # the refined model's metadata must be writable: find out now, not after the work
    refined_meta(rs, student_meta, cfg.method, {}).validate("the refined model's metadata")
    out.say(f"refining {len(rs.by_role('local'))} local models "
            f"({len(rs.by_role('global'))} θ_t) on {len(source)} samples: "
            f"method={cfg.method} variant={cfg.variant} steps={cfg.steps} seed={cfg.seed}")
    with log_lines(out.progress):
        result = run_guarded(lambda: refine(rs, source, cfg, student))
    say_account(result, out)
    cal = result.calibration
    selection = select(cal.confidence, opts["min_confidence"], opts["coverage"])
    say_selection(selection, cal.confidence, out)
    # the model distillation starts from: the parameter average, or the given student
    # (heterogeneous parties have no average), named as what it is in text and JSON
    own = result.heterogeneous or student is not None
    accuracy = scores(result, source.labels(), own, selection, out)
    config = result.run_config()
    # every output is written to its temporary file first, then they are renamed together
    labels = LabelSet.from_probs(
        result.probs, source.ids(), cal.confidence,
        None if selection is None else selection.abstained,
        {**cal.attrs(), **({"selection": selection.to_dict()} if selection else {})})
    parties = [m.name for m in rs.models]
    if labels_out is not None:
        with outs.writing(labels_out) as tmp:
            write_labels(tmp, labels, cfg.method, config, parties, atomic=False)
    if opts["csv_out"] is not None:
        with outs.writing(opts["csv_out"]) as tmp:
            write_labels_csv(tmp, labels, atomic=False)
    if model_out is not None:
        meta = refined_meta(rs, student_meta, cfg.method, config, cal)
        with outs.writing(model_out) as tmp:
            save_bundle(tmp, result.model, meta, atomic=False, require_finite=True)
    outs.commit()
    for path in (labels_out, opts["csv_out"]):
        if path is not None:
            out.say(f"wrote labels for {len(source)} samples to {path}")
    if model_out is not None:
        out.say(f"wrote refined model to {model_out}")
    out.summary(summary(result, len(source), opts, cfg.aggregate, selection, accuracy,
                        {"labels": labels_out, "csv": opts["csv_out"], "model": model_out}))


def _checked_config(rs: ReceivedSet, source: H5Dataset, outs: Outputs,
                    labels_out: Path | None, model_out: Path | None, opts: dict[str, Any],
                    progress: bool) -> RefineConfig:
    """The RefineConfig of the options, once the run fits in memory and on disk (streaming
    or not is decided here and fixed in the config)."""
    # in memory the teachers' outputs (K × M × C) and the features of M samples are held;
    # streaming holds (M, C) arrays and spills the rest beside the outputs: a file declaring
    # 10^9 rows is refused here, not by the OOM killer (or a full disk) later
    k, c, m, d = len(rs.models) + 1, rs.num_classes, len(source), _feature_dim(rs)
    scratch = next(p for p in (labels_out, model_out, opts["csv_out"]) if p is not None)
    cfg = RefineConfig(method=opts["method"], variant=opts["variant"], tau=opts["tau"],
                       steps=500 if opts["steps"] is None else opts["steps"],
                       batch_size=opts["batch_size"], lr=opts["lr"],
                       clr_iterations=opts["clr_iterations"],
                       clr_min_round=opts["clr_min_round"], seed=opts["seed"],
                       device=opts["device"], progress=progress,
                       class_prior=opts["class_prior"],
                       trust=opts["trust"], aggregate=opts["aggregate"],
                       stream=opts["stream"], scratch_dir=str(scratch.parent),
                       neighbour_vote=opts["neighbour_vote"], augment=opts["augment"])
    streaming = use_streaming(cfg, m, k, c, d)
    check_memory(memory_estimate(m, k, c, d, streaming),
                 f"refining {m:,} samples with {k - 1} models and {c} classes")
    space = _estimated_bytes(rs, len(source), labels_out, model_out)
    if streaming:  # the scratch files: logits (M, K, C) and features (M, D), float32
        space[scratch] = space.get(scratch, 0) + m * (k * c + d) * 4
    outs.check_space(space)
    cfg.stream = "on" if streaming else "off"
    return cfg


def report_parties(rs: ReceivedSet, job: str, out: Out) -> list[dict[str, Any]]:
    """Say before the work which received files ``job`` uses and which it leaves out (and
    why), and flag a party name on two files of one round."""
    rows = plan_parties(rs, job)
    said, warned = describe(rows)
    for line in said:
        out.say(line)
    for line in warned:
        out.warn(line)
    for line in duplicate_parties(rs):
        out.warn(line)
    basin = start_line(rs) if job == "refine" and rs.models else None
    if basin is not None:
        out.say(basin)
    return [r.to_dict() for r in rows]


def probe_outputs(rs: ReceivedSet, source: H5Dataset, student: Any = None,
                  rows: int = 256) -> None:
    """Every model on the first rows of the data: finite logits of the right width, or one
    line now (weights and data that overflow float32 otherwise fail deep inside the work)."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(source.read(0, rows)))
    named = [(m.path.name, m.build, m.meta.num_classes, m.meta.arch_kwargs) for m in rs.models]
    if student is not None:
        named.append(("the student", lambda: student, rs.num_classes, {}))
    for name, build, classes, kwargs in named:
        net = build()
        check_model_fits(net, name, source, classes, kwargs)
        with torch.inference_mode():
            logits = net.eval()(x)
        if not bool(torch.isfinite(logits).all()):
            raise InputError(f"{name}: its outputs on {source.path.name} are not finite (its "
                             "weights or the data overflow float32)")


def _feature_dim(rs: ReceivedSet) -> int:
    """The widest classifier input of the received models (their feature vectors' size)."""
    dims = [t.shape[1] for m in rs.models for t in m.state_dict.values() if t.dim() == 2]
    return max(dims, default=512)


def _estimated_bytes(rs: ReceivedSet, m: int, labels_out: Path | None,
                     model_out: Path | None) -> dict[Path, int]:
    """What the outputs will take on disk, roughly (labels: probs + 3 columns + ids)."""
    sizes: dict[Path, int] = {}
    if labels_out is not None:
        sizes[labels_out] = m * (rs.num_classes + 4) * 4 + m * 8
    if model_out is not None:
        sizes[model_out] = max(sum(t.numel() * 4 for t in m_.state_dict.values())
                               for m_ in rs.models)
    return sizes


def load_student(rs: ReceivedSet, opts: dict[str, Any], sample_shape: tuple[int, ...] | None,
                 out: Out | None = None) -> tuple[Any, BundleMeta | None]:
    """The student module and its bundle metadata from --student / --student-arch, or None."""
    if opts["student_file"] is not None and opts["student_arch"] is not None:
        raise InputError("give --student or --student-arch, not both")
    if opts["student_file"] is not None:
        sm = load_bundle(opts["student_file"], opts["trust_arch"])
        for note in sm.notes if out is not None else ():
            out.warn(f"{sm.path.name}: {note}")
        if sm.meta.num_classes != rs.num_classes:
            raise InputError(f"--student {sm.path.name} has {sm.meta.num_classes} classes but "
                             f"the received models have {rs.num_classes}")
        return sm.build(), sm.meta
    if opts["student_arch"] is not None:
        return new_student(rs, opts["student_arch"], opts["seed"], sample_shape)
    onnx_start = student_of_onnx_set(rs)
    if onnx_start is not None:
        if out is not None:
            out.say(onnx_start[2])
        return onnx_start[0], onnx_start[1]
    return None, None
