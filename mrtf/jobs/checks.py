"""The refine job's checks before the long work: which received files count (said as a
table), the student, every model's first outputs on the data, and whether the run fits in
memory and on disk (streaming decided here). Each failure is one InputError line, raised
before anything heavy runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.io.bundles import BundleMeta, ReceivedSet, load_bundle
from mrtf.io.fits import check_model_fits
from mrtf.io.hdf5 import H5Dataset
from mrtf.io.limits import check_memory
from mrtf.io.outputs import Outputs
from mrtf.io.refined import new_student, student_of_onnx_set
from mrtf.jobs.params import RefineJob
from mrtf.jobs.reporter import Reporter
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.storage import memory_estimate, use_streaming
from mrtf.trust.basin import start_line
from mrtf.trust.parties import describe, duplicate_parties, plan_parties
from mrtf.trust.selection import select as select_parties


def report_parties(rs: ReceivedSet, job: str, reporter: Reporter) -> list[dict[str, Any]]:
    """Say before the work which received files ``job`` uses and which it leaves out (and
    why), and flag a party name on two files of one round."""
    rows = plan_parties(rs, job)
    said, warned = describe(rows)
    for line in said:
        reporter.say(line)
    for line in warned:
        reporter.warn(line)
    for line in duplicate_parties(rs):
        reporter.warn(line)
    basin = start_line(rs) if job == "refine" and rs.models else None
    if basin is not None:
        reporter.say(basin)
    return [r.to_dict() for r in rows]


def probe_outputs(rs: ReceivedSet, source: H5Dataset, student: Any = None,
                  rows: int = 256) -> None:
    """Every model on the first rows of the data: finite logits of the right width, or one
    line now (weights and data that overflow float32 otherwise fail deep inside the work)."""
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


def load_student(rs: ReceivedSet, job: RefineJob, sample_shape: tuple[int, ...] | None,
                 reporter: Reporter) -> tuple[Any, BundleMeta | None]:
    """The student module and its bundle metadata from ``student_file`` / ``student_arch``
    (or the PyTorch parties' average of a set with ONNX parties), or (None, None)."""
    if job.student_file is not None:
        sm = load_bundle(job.student_file, job.trust_arch)
        for note in sm.notes:
            reporter.warn(f"{sm.path.name}: {note}")
        if sm.meta.num_classes != rs.num_classes:
            raise InputError(f"--student {sm.path.name} has {sm.meta.num_classes} classes but "
                             f"the received models have {rs.num_classes}")
        return sm.build(), sm.meta
    if job.student_arch is not None:
        return new_student(rs, job.student_arch, job.config.seed, sample_shape)
    # the parties that teach: the one rule for which received models count
    onnx_start = student_of_onnx_set(select_parties(rs).locals_)
    if onnx_start is not None:
        reporter.say(onnx_start[2])
        return onnx_start[0], onnx_start[1]
    return None, None


def checked_config(rs: ReceivedSet, source: H5Dataset, outs: Outputs,
                   job: RefineJob) -> RefineConfig:
    """The job's RefineConfig once the run fits in memory and on disk (streaming or not is
    decided here and fixed in the config; scratch files go beside the first output)."""
    # in memory the teachers' outputs (K × M × C) and the features of M samples are held;
    # streaming holds (M, C) arrays and spills the rest beside the outputs: a file declaring
    # 10^9 rows is refused here, not by the OOM killer (or a full disk) later
    k, c, m, d = len(rs.models) + 1, rs.num_classes, len(source), _feature_dim(rs)
    job.config.check_classes(c)
    scratch = next(p for p in (job.labels, job.model, job.csv) if p is not None)
    cfg = dataclasses.replace(job.config, scratch_dir=job.config.scratch_dir or
                              str(scratch.parent))
    streaming = use_streaming(cfg, m, k, c, d)
    check_memory(memory_estimate(m, k, c, d, streaming),
                 f"refining {m:,} samples with {k - 1} models and {c} classes")
    space = _estimated_bytes(rs, len(source), job.labels, job.model)
    if streaming:  # the scratch files: logits (M, K, C) and features (M, D), float32
        space[scratch] = space.get(scratch, 0) + m * (k * c + d) * 4
    outs.check_space(space)
    cfg.stream = "on" if streaming else "off"
    return cfg


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
