"""The refine job as a library call: a received-models directory (+ unlabeled data) → a
refined model and labels on disk, with every check ``mrtf refine`` makes.

``mrtf refine`` is this function plus its options; the Flower pilot party calls it in its own
process; a notebook calls it directly::

    from mrtf import RefineConfig, RefineJob, refine_files

    done = refine_files(RefineJob("runs/received", data="runs/target.h5",
                                  labels="runs/labels.h5", config=RefineConfig(seed=0)))
    done.labels.labels            # (M,) int64, as written to runs/labels.h5

What the job owns: the inputs checked before any long step (the received files, the data's
columns, every model's first outputs, the student), which received models count
(mrtf.trust.selection, said as a table), the memory and disk estimates (streaming decided
here), the outputs claimed and locked before the work and written together at the end
(mrtf.io.outputs: an interrupted or failed job leaves nothing half-written). What it says goes
to a :class:`~mrtf.jobs.reporter.Reporter`: the plan (trust verdicts, the parameter average or
not, vote or adapt) comes before the distillation.
"""

from __future__ import annotations

from mrtf.datafree.fuse import choose_method
from mrtf.errors import InputError
from mrtf.io.bundles import ReceivedSet, load_received, model_files, save_bundle
from mrtf.io.hdf5 import H5Dataset
from mrtf.io.labels import LabelSet, write_labels
from mrtf.io.labels_csv import write_labels_csv
from mrtf.io.outputs import Outputs
from mrtf.io.refined import refined_meta
from mrtf.jobs.checks import checked_config, load_student, probe_outputs, report_parties
from mrtf.jobs.datafree import fuse_files
from mrtf.jobs.guard import run_guarded
from mrtf.jobs.params import RefineJob
from mrtf.jobs.reporter import FusedFiles, RefinedFiles, Reporter
from mrtf.progress import log_lines
from mrtf.refinery.augment import applies
from mrtf.refinery.pipeline import refine
from mrtf.trust.selective import select


def refine_files(job: RefineJob, reporter: Reporter | None = None
                 ) -> RefinedFiles | FusedFiles:
    """Run ``job`` (:class:`RefineJob`, checked when made): refine the received models on
    ``job.data`` and write the labels and/or the model, or, without data, fuse them
    data-free (FedFTG / FedKF). ``reporter`` hears the plan before the long steps and the
    account after (default: nothing is said).

    Raises :class:`mrtf.errors.InputError` (one line) on any bad input, before the work
    starts where it can be known then; on any failure nothing is left half-written.
    """
    reporter = reporter or Reporter()
    inputs = job.inputs(model_files(job.received))
    # outputs are checked, locked and their temporary files created before any heavy work
    with Outputs(job.outputs, job.force, inputs) as outs:
        rs = load_received(job.received, job.trust_arch)
        for note in rs.notes:
            reporter.warn(note)
        kind = "refine"
        if job.data is None and any(m.onnx for m in rs.models):
            raise InputError("data-free fusion trains a generator through the teachers' "
                             "gradients, which ONNX models do not give: refine with --data")
        if job.data is None:
            kind = choose_method(rs, job.datafree)[0]
        parties = report_parties(rs, kind, reporter)
        if job.data is None:
            return fuse_files(rs, outs, job, parties, reporter)
        with H5Dataset(job.data) as source:
            return _refine_with_data(rs, source, outs, job, parties, reporter)


def _refine_with_data(rs: ReceivedSet, source: H5Dataset, outs: Outputs, job: RefineJob,
                      parties: list[dict], reporter: Reporter) -> RefinedFiles:
    student, student_meta = load_student(rs, job, source.sample_shape, reporter)
    cfg = checked_config(rs, source, outs, job)
    # y and ids are read (in blocks) now that the job's size is checked: a bad one found
    # after the refinement would waste it
    source.check_columns(rs.num_classes, " of the received models")
    probe_outputs(rs, source, student)
    if cfg.method == "adaptive" and cfg.augment and not applies(source.sample_shape):
        reporter.say(f"note: input jitter is for images; off for samples of shape "
                     f"{source.sample_shape} (feature vectors)")
    # the refined model's metadata must be writable: find out now, not after the work
    refined_meta(rs, student_meta, cfg.method, {}).validate("the refined model's metadata")
    reporter.say(f"refining {len(rs.by_role('local'))} local models "
                 f"({len(rs.by_role('global'))} θ_t) on {len(source)} samples: "
                 f"method={cfg.method} variant={cfg.variant} steps={cfg.steps} seed={cfg.seed}")
    with log_lines(cfg.progress):
        result = run_guarded(lambda: refine(rs, source, cfg, student, reporter))
    cal = result.calibration
    selection = select(cal.confidence, job.min_confidence, job.coverage)
    # the model distillation starts from: the parameter average, or the given student
    # (heterogeneous parties, and parties of their own starts, have no average: the latter
    # start from the best party), named as what it is in text and JSON
    basin = None if result.parties is None else result.parties.basin
    own = result.heterogeneous or student is not None or \
        (basin is not None and not basin.average_used)
    config = result.run_config()
    # every output is written to its temporary file first, then they are renamed together
    labels = LabelSet.from_probs(
        result.probs, source.ids(), cal.confidence,
        None if selection is None else selection.abstained,
        {**cal.attrs(), **({"selection": selection.to_dict()} if selection else {})})
    done = RefinedFiles(result, labels, selection, len(source), parties, own, source.labels(),
                        {"labels": job.labels, "csv": job.csv, "model": job.model})
    reporter.refined(done)
    names = [m.name for m in rs.models]
    if job.labels is not None:
        with outs.writing(job.labels) as tmp:
            write_labels(tmp, labels, cfg.method, config, names, atomic=False)
    if job.csv is not None:
        with outs.writing(job.csv) as tmp:
            write_labels_csv(tmp, labels, atomic=False)
    if job.model is not None:
        meta = refined_meta(rs, student_meta, cfg.method, config, cal, result.reading)
        with outs.writing(job.model) as tmp:
            save_bundle(tmp, result.model, meta, atomic=False, require_finite=True)
    outs.commit()
    for path in (job.labels, job.csv):
        if path is not None:
            reporter.say(f"wrote labels for {len(source)} samples to {path}")
    if job.model is not None:
        reporter.say(f"wrote refined model to {job.model}")
    return done
