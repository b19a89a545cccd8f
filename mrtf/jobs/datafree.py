"""The refine job without data: FedFTG or FedKF fusion of the received models into one model
(and a grid of generated samples), written as one unit."""

from __future__ import annotations

from typing import Any

from mrtf.datafree.config import FusionConfig
from mrtf.datafree.fuse import choose_method, fedkf_futile, fuse
from mrtf.datafree.samples import dump_samples
from mrtf.errors import InputError
from mrtf.io.bundles import ReceivedSet, save_bundle
from mrtf.io.outputs import Outputs
from mrtf.io.refined import refined_meta
from mrtf.jobs.checks import load_student
from mrtf.jobs.guard import run_guarded
from mrtf.jobs.params import RefineJob
from mrtf.jobs.reporter import FusedFiles, Reporter
from mrtf.progress import log_lines


def fuse_files(rs: ReceivedSet, outs: Outputs, job: RefineJob, parties: list[dict[str, Any]],
               reporter: Reporter) -> FusedFiles:
    """Fuse ``rs`` without data and write the fused model (and the sample grid)."""
    method, reason = choose_method(rs, job.datafree)
    student, student_meta = load_student(rs, job, None, reporter)
    futile = fedkf_futile(rs.models, student) if method == "fedkf" else None
    if futile and job.dump_samples is not None:  # known now, not after the training
        raise InputError(f"fedkf would train nothing here: {futile}; so there is no "
                         "generator to draw: leave out --dump-samples")
    refined_meta(rs, student_meta, method, {}).validate("the fused model's metadata")
    seed = job.config.seed
    cfg = FusionConfig(method=method, seed=seed, device=job.config.device,
                       progress=job.config.progress)
    if job.fusion_steps is not None:  # total student steps, for either method
        cfg = cfg.with_total_steps(job.fusion_steps)
    reporter.say(f"data-free fusion with {method}: {reason}")
    with log_lines(cfg.progress):
        result = run_guarded(lambda: fuse(rs, cfg, student))
    for warning in result.warnings:
        reporter.warn(warning)
    last = result.history[-1] if result.history else {}
    reporter.say(f"{method} finished in {result.seconds:.1f}s; last losses: "
                 + ", ".join(f"{k} {v:.4f}" for k, v in last.items() if isinstance(v, float)))
    config = {"datafree": method, "reason": reason, "seed": seed, "steps": job.fusion_steps}
    if job.model is not None:
        with outs.writing(job.model) as tmp:
            save_bundle(tmp, result.model, refined_meta(rs, student_meta, method, config),
                        atomic=False, require_finite=True)
    if job.dump_samples is not None:
        with outs.writing(job.dump_samples) as tmp:
            # an unconditional (FedKF) generator has no classes: rows are what the fused
            # model predicts for its images, so each row is one class
            teacher = None if getattr(result.generator, "conditional", False) else result.model
            rows = "the class asked of the generator" if teacher is None else \
                "the class the fused model gives it"
            dump_samples(result.generator, tmp, rs.num_classes, seed=seed,
                         teacher=teacher, atomic=False,
                         title=f"{method}: generated images, one row per class ({rows})")
    outs.commit()  # the model and the sample grid: both or neither
    if job.model is not None:
        reporter.say(f"wrote fused model to {job.model}")
    if job.dump_samples is not None:
        reporter.say(f"wrote generated samples to {job.dump_samples}")
    return FusedFiles(result, method, reason, parties,
                      {"model": job.model, "samples": job.dump_samples})
