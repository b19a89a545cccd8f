"""Streaming refine: memory flat in M beyond the (M, C) outputs (issue 14).

The in-memory refinery (pipeline.py) holds the teachers' (K, M, C) logits, θ_{t+1}'s (M, D)
features and, for the adaptive method, the (S, M, C) stabilized softmax in float64: 2.8 GB
at M = 1M, K = 10, D = 256. Here the data pass writes the logits and features to scratch
files beside the output (spill.py; ``RefineConfig.scratch_dir``, removed at the end), and
every later stage reads them back a block at a time:

0. the party reliability checks (mrtf.trust, for the default and ``--trust``), as in memory
   (on a seeded sample of mrtf.trust.received.TRUST_SAMPLE target samples when there are
   more): the excluded parties are left out of the teachers and θ_{t+1} is re-averaged
   (``--aggregate``) before the data pass; the logits of that pass are not kept;
1. data pass: teachers' logits (and θ_{t+1}'s features) → spill, θ_{t+1}'s softmax kept
   (an (M, C) output), non-finite rows counted;
2. Eq. 6's global std per teacher: two passes over the logits spill (teachers.global_stds,
   the same block-wise float64 sums as the in-memory path);
3. targets: the paper's methods block by block (pipeline.ensemble_targets reads the spill as
   it reads an array), CLR's prototypes accumulated block by block (cluster.py); adaptive:
   the stabilized softmax written over the logits spill with each source's whole-M
   statistics (``--class-prior uniform`` divides their class bias out in place), Dawid-Skene
   EM with block-wise statistics and the parties' trust factors (streaming_adaptive.py),
   k-means trained on a sample and assigned by blocks;
4. distillation as in memory (it holds steps × batch rows, not M), or, where the default
   adapts θ_{t+1} to a target new to the parties, SHOT with its pseudo-label pass's
   features in a scratch file (shot.py), then one vote pass and a distillation to it
   (fit.py);
5. final prediction, streamed, and (adaptive) the neighbour vote (neighbour_vote.py: the
   refined model's features are compared block by block with a fixed reference set).

Held in memory: the (M, C) targets, θ_{t+1}'s and the refined model's softmax, the adaptive
posterior (M, C) float64, and blocks. The labels file is written block by block
(mrtf/io/labels_stream.py). Results equal the in-memory path's: labels identical on the
tests' inputs; sums over M are added block-wise, so probabilities may differ in the last
bits (the adaptive EM's sums), never the paper methods' targets.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from mrtf.device import pick_device
from mrtf.errors import InputError
from mrtf.refinery.cluster import prototype_targets
from mrtf.refinery.config import METHOD_SPECS, RefineConfig
from mrtf.refinery.fit import fit_student
from mrtf.refinery.spill import Scratch, SpillArray, TeacherMajor
from mrtf.refinery.streaming_adaptive import SourceStats, adaptive_targets_blocks
from mrtf.refinery.teachers import TeacherChunks, _softmax_np, predict_probs
from mrtf.refinery.trusted import apply_trust, trust_on, with_neighbours

if TYPE_CHECKING:  # pipeline imports this module lazily; no import cycle at run time
    from mrtf.refinery.pipeline import RefineResult

#: 'auto' streams when the in-memory path would hold more than this (see memory_estimate)
STREAM_ABOVE_BYTES = 768 * 2**20


def memory_estimate(m: int, k: int, c: int, d: int, streaming: bool) -> int:
    """Bytes the refinery holds for M samples, K teachers, C classes, D features, roughly.
    In memory: logits (K, M, C), features (M, D), adaptive's float64 (S, M, C) views and a
    few (M, C) arrays. Streaming: the (M, C) arrays (targets, two softmaxes, a float64
    posterior, labels) and blocks (~200 MB)."""
    outputs = m * c * (3 * 4 + 2 * 8) + m * 8
    if streaming:
        return outputs + 200 * 2**20
    return outputs + m * (k * c * 4 + k * c * 8 + d * 4)


def use_streaming(config: RefineConfig, m: int, k: int, c: int, d: int) -> bool:
    """``config.stream``: 'on', 'off', or 'auto' (stream above STREAM_ABOVE_BYTES)."""
    if config.stream != "auto":
        return config.stream == "on"
    return memory_estimate(m, k, c, d, streaming=False) > STREAM_ABOVE_BYTES


class _Pass:
    """The data pass's sinks: logits and features to the spill, θ_{t+1}'s softmax kept,
    non-finite rows counted."""

    def __init__(self, scratch: Scratch, m: int, k: int, self_last: bool) -> None:
        self.scratch, self.m, self.k, self.self_last = scratch, m, k, self_last
        self.logits: SpillArray | None = None
        self.features: SpillArray | None = None
        self.before: np.ndarray | None = None
        self.bad = 0

    def add(self, start: int, lg: np.ndarray, h: np.ndarray | None) -> None:
        if self.logits is None:
            c = lg.shape[-1]
            self.logits = self.scratch.array("logits", (self.m, self.k, c))
            self.before = np.empty((self.m, c), dtype=np.float32) if self.self_last else None
        self.bad += int((~np.isfinite(lg).all(axis=(0, 2))).sum())
        self.logits.write(start, lg.transpose(1, 0, 2))
        if self.before is not None:
            self.before[start:start + lg.shape[1]] = _softmax_np(lg[-1])
        if h is not None:
            if self.features is None:
                self.features = self.scratch.array("features", (self.m, h.shape[1]))
            self.features.write(start, h)


def refine_streaming(received, source, config: RefineConfig,
                     student: nn.Module | None = None) -> RefineResult:
    """pipeline.refine with the (K, M, C) and (M, D) arrays on disk (module docstring).
    Same arguments and result; ``config.scratch_dir`` is where the scratch folder goes."""
    from mrtf.refinery import pipeline as pl
    from mrtf.refinery.rectify import u_t

    dev = pick_device(config.device)
    spec = METHOD_SPECS[config.method]
    plan = pl._plan(received, source, config, student, dev)
    timings: dict[str, float] = {"teachers": 0.0, "clr": 0.0, "distill": 0.0, "predict": 0.0,
                                 "calibration": 0.0}
    t_trust = time.perf_counter()
    # the party reliability checks (on a sample of a large target, as in memory): the
    # excluded parties never run on the whole target
    trusted = apply_trust(plan, received, source, config, dev, student is not None) \
        if trust_on(config) else None
    t_trust = time.perf_counter() - t_trust
    used = pl.newest_locals(received) if trusted is None else trusted.kept
    u = u_t([m.meta.train_loss for m in used], received.num_classes)
    notes, skip_clr = pl._notes(received, plan, config)
    self_model = plan.agg if plan.agg is not None else plan.student
    teachers = spec.teacher_list(plan.locals_, plan.start, self_model)
    extra: dict[str, Any] = {}
    local = None  # the calibration's evidence (trust.calibration.Signals)
    novelty = None
    with Scratch(config.scratch_dir) as scratch:
        t0 = time.perf_counter()
        sink, before = _data_pass(scratch, teachers, self_model, spec.features and not skip_clr,
                                  source, config, dev)
        timings["teachers"] = time.perf_counter() - t0 + t_trust
        student_model = pl._live_start(plan, before, config, notes, student is not None)
        if sink is None:  # fedavg: θ_{t+1} as it is
            model, targets = self_model.eval(), before
        else:
            # the calibration's evidence from the raw logits, before adaptive's Eq. 6 pass
            # overwrites them in place (the consensus is attached once it exists)
            t0 = time.perf_counter()
            local = with_neighbours(_local_signals(sink, len(plan.locals_), before), source)
            timings["calibration"] = time.perf_counter() - t0
            novelty = pl._novelty(plan, TeacherMajor(sink.logits), used, config,
                                  student is not None)
            factors = None if trusted is None else \
                trusted.factors + [1.0] * (len(teachers) - len(plan.locals_))
            targets, extra = _targets(plan, sink, config, u, skip_clr, before, factors,
                                      None if local is None else local.neighbours)
            timings["clr"] = extra.pop("clr")
            if local is not None:
                local.consensus = np.asarray(targets, np.float32)
    if sink is not None:
        t0 = time.perf_counter()  # SHOT's features, when it adapts, go to a scratch file
        model = fit_student(student_model, source, targets, config, dev, novelty, streaming=True)
        timings["distill"] = time.perf_counter() - t0
    return pl.finish(model, source, bool(teachers), targets, before, plan, u, notes,
                     extra.get("adaptive"), novelty, local, trusted, config, timings, dev,
                     streaming=True)


def _data_pass(scratch: Scratch, teachers: list[nn.Module], self_model: nn.Module,
               features: bool, source, config: RefineConfig, dev: torch.device
               ) -> tuple[_Pass | None, np.ndarray]:
    """Step 1: the teachers' logits (and θ_{t+1}'s features when ``features``) to the spill,
    and θ_{t+1}'s softmax, ``before`` (read off the logits when it is the last teacher)."""
    sink = None
    if teachers:
        sink = _Pass(scratch, len(source), len(teachers), teachers[-1] is self_model)
        for start, lg, h in TeacherChunks(teachers, source, config.inference_batch, dev,
                                          self_model if features else None, config.stack,
                                          config.progress):
            sink.add(start, lg, h)
        if sink.bad:
            raise InputError(f"the received models' outputs are not finite on {sink.bad} "
                             f"of {len(source)} target samples (their weights or the data "
                             "overflow float32); rescale the data or check the models")
    if sink is not None and sink.before is not None:
        return sink, sink.before
    return sink, predict_probs(self_model, source, config.inference_batch, dev)


def _local_signals(sink: _Pass, k: int, before: np.ndarray):
    """trust.calibration.Signals of the local models, read from the logits spill by blocks."""
    from mrtf.trust.calibration import Signals

    if k == 0 or sink.logits is None:
        return None
    return Signals.from_logits(TeacherMajor(sink.logits), before, before, BLOCK_ROWS, k)


def _targets(plan, sink: _Pass, config: RefineConfig, u: float, skip_clr: bool,
             before: np.ndarray, factors: list[float] | None = None,
             neighbours: np.ndarray | None = None) -> tuple[np.ndarray, dict]:
    """pipeline._targets on the spill."""
    from mrtf.refinery import pipeline as pl

    assert sink.logits is not None
    logits = TeacherMajor(sink.logits)
    t0 = time.perf_counter()  # 'clr' times what pipeline._targets times: all of adaptive
    if config.method == "adaptive":
        targets, extra = _adaptive(plan, sink, logits, config, before, factors, neighbours)
        return targets, {**extra, "clr": time.perf_counter() - t0}
    targets = pl.ensemble_targets(logits, len(plan.locals_), config, u)
    if not METHOD_SPECS[config.method].features or skip_clr or config.clr_iterations == 0:
        return targets, {"clr": 0.0}
    assert sink.features is not None
    t0 = time.perf_counter()
    refined = prototype_targets(targets, sink.features, config.tau, config.clr_iterations,
                                config.variant, use_gpu=torch.cuda.is_available())
    return refined, {"clr": time.perf_counter() - t0}


def _adaptive(plan, sink: _Pass, logits: TeacherMajor, config: RefineConfig,
              before: np.ndarray, factors: list[float] | None,
              neighbours: np.ndarray | None) -> tuple[np.ndarray, dict]:
    """Eq. 6's softmax block by block over the logits spill, in place (the logits are not
    needed again), with each source's whole-M statistics (dead sources, class bias); then
    the block-wise consensus."""
    from mrtf.refinery import pipeline as pl

    assert sink.logits is not None
    k, _, c = logits.shape
    stats = SourceStats(k, c, class_bias=config.class_prior in ("uniform", "auto"))
    # the generator reads block s+1 only after block s is written back: in place is safe
    for s, q in pl._stabilized_blocks(logits, config):
        stats.add(q)
        sink.logits.write(s, q.transpose(1, 0, 2))
    out = adaptive_targets_blocks(sink.logits, stats, plan.names, before, sink.features,
                                  config.seed, len(plan.locals_), config.class_prior, factors,
                                  neighbours)
    return out.targets, {"adaptive": out}


def streams(received, source, config: RefineConfig) -> bool:
    """Whether the streaming refinery (streaming.py) runs: by ``config.stream`` and size."""
    k = len(received.models) + 1
    dims = [t.shape[1] for m in received.models for t in m.state_dict.values() if t.dim() == 2]
    return use_streaming(config, len(source), k, received.num_classes, max(dims, default=512))


#: rows per block when the calibration's evidence is read from the logits spill
BLOCK_ROWS = 65_536
