"""The data-free branch of ``mrtf refine`` (no --data): FedFTG or FedKF fusion."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mrtf.cli.common import Out, run_guarded
from mrtf.errors import InputError
from mrtf.io.bundles import ReceivedSet, save_bundle
from mrtf.io.outputs import Outputs
from mrtf.progress import log_lines


def run_datafree(rs: ReceivedSet, outs: Outputs, model_out: Path | None, opts: dict[str, Any],
                 out: Out) -> None:
    """Fuse ``rs`` without data and write the fused model (and the sample grid)."""
    from mrtf.cli.refine import load_student
    from mrtf.datafree import FusionConfig, choose_method, dump_samples, fuse
    from mrtf.datafree.fuse import fedkf_futile
    from mrtf.io.refined import refined_meta

    method, reason = choose_method(rs, opts["datafree"])
    student, student_meta = load_student(rs, opts, None, out)
    futile = fedkf_futile(rs.models, student) if method == "fedkf" else None
    if futile and opts["dump_samples"] is not None:  # known now, not after the training
        raise InputError(f"fedkf would train nothing here: {futile}; so there is no "
                         "generator to draw: leave out --dump-samples")
    refined_meta(rs, student_meta, method, {}).validate("the fused model's metadata")
    cfg = FusionConfig(method=method, seed=opts["seed"], device=opts["device"],
                       progress=out.progress)
    if opts["steps"] is not None:  # total student steps, for either method
        cfg = cfg.with_total_steps(opts["steps"])
    out.say(f"data-free fusion with {method}: {reason}")
    with log_lines(out.progress):
        result = run_guarded(lambda: fuse(rs, cfg, student))
    for warning in result.warnings:
        out.warn(warning)
    last = result.history[-1] if result.history else {}
    out.say(f"{method} finished in {result.seconds:.1f}s; last losses: "
            + ", ".join(f"{k} {v:.4f}" for k, v in last.items() if isinstance(v, float)))
    config = {"datafree": method, "reason": reason, "seed": opts["seed"],
              "steps": opts["steps"]}
    if model_out is not None:
        with outs.writing(model_out) as tmp:
            save_bundle(tmp, result.model, refined_meta(rs, student_meta, method, config),
                        atomic=False, require_finite=True)
    if opts["dump_samples"] is not None:
        with outs.writing(opts["dump_samples"]) as tmp:
            # an unconditional (FedKF) generator has no classes: rows are what the fused
            # model predicts for its images, so each row is one class
            teacher = None if getattr(result.generator, "conditional", False) else result.model
            rows = "the class asked of the generator" if teacher is None else \
                "the class the fused model gives it"
            dump_samples(result.generator, tmp, rs.num_classes, seed=opts["seed"],
                         teacher=teacher, atomic=False,
                         title=f"{method}: generated images, one row per class ({rows})")
    outs.commit()  # the model and the sample grid: both or neither
    if model_out is not None:
        out.say(f"wrote fused model to {model_out}")
    if opts["dump_samples"] is not None:
        out.say(f"wrote generated samples to {opts['dump_samples']}")
    out.summary({"command": "refine", "datafree": method, "reason": reason,
                 "seconds": result.seconds, "warnings": result.warnings, "last_losses": last,
                 "parties": opts.get("parties"),
                 "model": str(model_out) if model_out else None,
                 "samples": str(opts["dump_samples"]) if opts["dump_samples"] else None})
