"""``mrtf refine``, ``mrtf label`` and ``mrtf score``: the pilot party's main jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np

from mrtf.cli.common import Out, output_options, run_guarded, table
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
from mrtf.io.hdf5 import H5Dataset, LabelSet, read_labels, write_labels
from mrtf.io.labels_csv import write_labels_csv
from mrtf.io.limits import check_memory
from mrtf.io.outputs import Outputs
from mrtf.io.parties import describe, duplicate_parties, plan_parties
from mrtf.models import build_model, image_kwargs
from mrtf.progress import log_lines
from mrtf.refinery import METHODS, RefineConfig, accuracy_of, predict_probs, refine
from mrtf.refinery.streaming import memory_estimate, use_streaming
from mrtf.scoring import score_labels


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
              help="adaptive (every source weighted by its measured trust; the default), "
                   "fedavg (average only), feddf (AvgLogit), st, st+rd, mrtf (the paper: "
                   "st+rd+clr).")
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
@click.option("--student-arch", default=None,
              help="Fresh student architecture (needed when parties' architectures differ).")
@click.option("--student", "student_file", type=click.Path(path_type=Path), default=None,
              help="Start from this model file instead of the parameter average.")
@click.option("--datafree", type=click.Choice(["fedftg", "fedkf"]), default=None,
              help="Without --data: force this data-free method (default: chosen for you).")
@click.option("--dump-samples", type=click.Path(path_type=Path), default=None,
              help="Data-free: write a PNG grid of generated images per class.")
@click.option("--trust-arch", multiple=True, help="A package.module:factory you trust.")
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
                       device=opts["device"], progress=out.progress,
                       stream=opts["stream"], scratch_dir=str(scratch.parent))
    streaming = use_streaming(cfg, m, k, c, d)
    check_memory(memory_estimate(m, k, c, d, streaming),
                 f"refining {m:,} samples with {k - 1} models and {c} classes")
    space = _estimated_bytes(rs, len(source), labels_out, model_out)
    if streaming:  # the scratch files: logits (M, K, C) and features (M, D), float32
        space[scratch] = space.get(scratch, 0) + m * (k * c + d) * 4
    outs.check_space(space)
    cfg.stream = "on" if streaming else "off"
    probe_outputs(rs, source, student)
    # the refined model's metadata must be writable: find out now, not after the work
    refined_meta(rs, student_meta, cfg.method, {}).validate("the refined model's metadata")
    local = rs.by_role("local")
    out.say(f"refining {len(local)} local models ({len(rs.by_role('global'))} θ_t) on "
            f"{len(source)} samples: method={cfg.method} variant={cfg.variant} "
            f"steps={cfg.steps} seed={cfg.seed}")
    with log_lines(out.progress):
        result = run_guarded(lambda: refine(rs, source, cfg, student))
    for note in result.info["notes"]:
        out.say(f"note: {note}")
    for line in result.info.get("trust", []):
        out.say(f"source {line}")
    if "estimated_accuracy" in result.info:
        est = result.info["estimated_accuracy"]
        out.say(f"label-free estimate (consensus): refined {est['refined']:.3f}, averaged "
                f"{est['averaged']:.3f}")
    scores: dict[str, float] = {}
    y = source.labels()
    if y is not None:  # scoring only: y never reaches the refinery
        # the model distillation starts from: the parameter average, or the given student
        # (heterogeneous parties have no average), named as what it is in text and JSON
        own = result.info["heterogeneous"] or student is not None
        first = "student" if own else "averaged"
        scores = {first: accuracy_of(result.averaged_probs, y),
                  "targets": accuracy_of(result.target_probs, y),
                  "refined": accuracy_of(result.probs, y)}
        out.say(table([["student before refinement" if own else "averaged model",
                        scores[first]], ["teacher targets", scores["targets"]],
                       ["refined model", scores["refined"]]], ["accuracy on --data y", ""]))
    parties = [m.name for m in rs.models]
    config = {**result.info["config"], "u_t": result.info["u_t"]}
    # every output is written to its temporary file first, then they are renamed together
    labels = LabelSet.from_probs(result.probs, source.ids())
    if labels_out is not None:
        with outs.writing(labels_out) as tmp:
            write_labels(tmp, labels, cfg.method, config, parties, atomic=False)
    if opts["csv_out"] is not None:
        with outs.writing(opts["csv_out"]) as tmp:
            write_labels_csv(tmp, labels, atomic=False)
    if model_out is not None:
        meta = refined_meta(rs, student_meta, cfg.method, config)
        with outs.writing(model_out) as tmp:
            save_bundle(tmp, result.model, meta, atomic=False, require_finite=True)
    outs.commit()
    for path in (labels_out, opts["csv_out"]):
        if path is not None:
            out.say(f"wrote labels for {len(source)} samples to {path}")
    if model_out is not None:
        out.say(f"wrote refined model to {model_out}")
    out.summary({"command": "refine", "method": cfg.method, "variant": cfg.variant,
                 "samples": len(source), "u_t": result.info["u_t"],
                 "heterogeneous": result.info["heterogeneous"], "notes": result.info["notes"],
                 "sources": result.info.get("sources"), "parties": opts["parties"],
                 "estimated_accuracy": result.info.get("estimated_accuracy"),
                 "accuracy": scores or None, "timings": result.timings,
                 "labels": str(labels_out) if labels_out else None,
                 "csv": str(opts["csv_out"]) if opts["csv_out"] else None,
                 "model": str(model_out) if model_out else None})


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
        arch = opts["student_arch"]
        kwargs = _student_kwargs(rs, arch, sample_shape)
        import torch

        torch.manual_seed(opts["seed"])
        model = build_model(arch, rs.num_classes, **kwargs)
        return model, BundleMeta(arch=arch, num_classes=rs.num_classes, arch_kwargs=kwargs)
    return None, None


def _student_kwargs(rs: ReceivedSet, arch: str, shape: tuple[int, ...] | None) -> dict:
    if shape is None:  # data-free: take the image shape from a received image model
        kw = next((m.meta.arch_kwargs for m in rs.models
                   if "in_channels" in m.meta.arch_kwargs), None)
        if kw is None:
            raise InputError("cannot tell the image shape for --student-arch without --data")
        return image_kwargs(arch, kw["in_channels"], kw["image_size"])
    if len(shape) == 3:
        return image_kwargs(arch, shape[0], shape[-1])
    return {}


def refined_meta(rs: ReceivedSet, student_meta: BundleMeta | None, method: str,
                 config: dict[str, Any]) -> BundleMeta:
    """Bundle metadata of the refined model (so it can be received again)."""
    import json

    base = student_meta or rs.by_role("local")[0].meta
    counts = [m.meta.label_counts for m in rs.by_role("local")]
    total = (np.sum(counts, axis=0).astype(int).tolist()
             if all(c is not None for c in counts) else None)
    rounds = [m.meta.round for m in rs.models if m.meta.round is not None]
    return BundleMeta(arch=base.arch, num_classes=rs.num_classes, arch_kwargs=base.arch_kwargs,
                      party="refined", role="refined", label_counts=total,
                      round=max(rounds) if rounds else None,  # the round it refines
                      extra={"mrtf.method": method,
                             "mrtf.config": json.dumps(config, sort_keys=True, default=str)})


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(path_type=Path), required=True,
              help="Samples to label (.h5 with x).")
@click.option("--labels", "labels_out", type=click.Path(path_type=Path), default=None,
              help="Where to write the labels (.h5).")
@click.option("--csv", "csv_out", type=click.Path(path_type=Path), default=None,
              help="Write the labels as CSV too: id (the file name, or the row), label, "
                   "confidence.")
@click.option("--batch-size", type=int, default=1024, show_default=True)
@click.option("--trust-arch", multiple=True, help="A package.module:factory you trust.")
@click.option("--device", default=None)
@click.option("--force", is_flag=True, help="Replace an existing labels file.")
@output_options
def label(model: Path, data: Path, labels_out: Path | None, csv_out: Path | None,
          batch_size: int, trust_arch: tuple[str, ...], device: str | None, force: bool,
          out: Out) -> None:
    """Label new data with a (refined) MODEL file: --labels (.h5) and/or --csv."""
    if labels_out is None and csv_out is None:
        raise InputError("nothing to write: give --labels FILE.h5 and/or --csv FILE.csv")
    with Outputs([labels_out, csv_out], force, (data, model)) as outs:
        bundle = load_bundle(model, trust_arch)
        for note in bundle.notes:
            out.warn(f"{bundle.path.name}: {note}")
        with H5Dataset(data) as source:
            net = bundle.build()
            check_model_fits(net, bundle.path.name, source, bundle.meta.num_classes,
                             bundle.meta.arch_kwargs)
            check_memory(len(source) * bundle.meta.num_classes * 4 * 4,
                         f"labeling {len(source):,} samples")
            outs.check_space({p: len(source) * (bundle.meta.num_classes + 6) * 4
                              for p in (labels_out, csv_out) if p is not None})
            with log_lines(out.progress):
                probs = run_guarded(lambda: predict_probs(net, source, batch_size, device))
            labels = LabelSet.from_probs(probs, source.ids())
            if labels_out is not None:
                with outs.writing(labels_out) as tmp:
                    write_labels(tmp, labels, "label", {"model": str(model)},
                                 [bundle.meta.party or bundle.path.stem], atomic=False)
            if csv_out is not None:
                with outs.writing(csv_out) as tmp:
                    write_labels_csv(tmp, labels, atomic=False)
            y = source.labels()
        outs.commit()
    acc = accuracy_of(probs, y) if y is not None else None
    where = " and ".join(str(p) for p in (labels_out, csv_out) if p is not None)
    out.say(f"labeled {len(probs)} samples with {model.name} → {where}"
            + (f"  (accuracy on y: {acc:.4f})" if acc is not None else ""))
    out.summary({"command": "label", "samples": len(probs),
                 "labels": str(labels_out) if labels_out else None,
                 "csv": str(csv_out) if csv_out else None, "accuracy": acc})


@click.command()
@click.argument("labels", type=click.Path(path_type=Path))
@click.option("--truth", type=click.Path(path_type=Path), required=True,
              help="An .h5 dataset holding the true labels y.")
@output_options
def score(labels: Path, truth: Path, out: Out) -> None:
    """Score a LABELS file against the y of --truth."""
    predicted = read_labels(labels)
    with H5Dataset(truth) as ds:
        if not ds.has_labels:
            raise InputError(f"{truth}: has no 'y' to score against")
        if len(ds) != len(predicted.labels):  # before reading y: its row count is declared
            raise InputError(f"{labels} holds {len(predicted.labels)} labels but {truth} has "
                             f"{len(ds)} samples")
        y, ids = ds.labels(), ds.ids()
    if predicted.ids is not None and ids is not None and (
            len(ids) != len(predicted.ids) or not np.array_equal(ids, predicted.ids)):
        raise InputError(f"{labels} and {truth} hold different sample ids")
    # the labels file says how many classes there are; a y outside them is refused, not
    # given a row of its own (y = 10^12 would ask for a 10^12 × 10^12 confusion matrix)
    c = predicted.probs.shape[1]
    if int(y.min()) < 0 or int(y.max()) >= c:
        raise InputError(f"{truth}: 'y' holds {int(y.min())}..{int(y.max())}, outside the "
                         f"{c} classes of {labels} (0..{c - 1})")
    result = score_labels(predicted.labels, y, c)
    out.say(f"accuracy {result['accuracy']:.4f} on {result['n']} samples")
    out.say(table([[i, result["per_class"][i], result["support"][i]] for i in range(c)],
                  ["class", "accuracy", "support"]))
    out.say("confusion (rows: true, columns: predicted)")
    out.say(table([[i, *row] for i, row in enumerate(result["confusion"])],
                  ["", *map(str, range(c))]))
    out.summary({"command": "score", **result})
