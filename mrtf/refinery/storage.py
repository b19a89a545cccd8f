"""Where the refinery keeps its whole-target arrays, decided once per run: rows in memory, or
spilled to scratch files and read back by row blocks (spill.py; issue 14). Both give the
stages one interface, an array read by row slices (``a[:k, s:e]`` for the teachers' logits,
``a[s:e]`` for features), so every stage is written once.

In memory the refinery holds the teachers' (K, M, C) logits and θ_{t+1}'s (M, D) features:
2.8 GB at M = 1M, K = 10, D = 256 with the adaptive method's float64 temporaries. Spilled
(``RefineConfig.stream``, 'auto' above :data:`STREAM_ABOVE_BYTES`), those go to a scratch
folder beside the outputs (``RefineConfig.scratch_dir``, removed when the data stages end) and
memory is flat in M beyond the (M, C) outputs: the targets, θ_{t+1}'s and the refined model's
softmax, the adaptive posterior (M, C) float64, and blocks. Labels are the same either way;
sums over M are added block-wise when spilled, so the adaptive consensus' probabilities may
differ in the last bits (never the paper methods' targets; tests/test_streaming.py).

What differs, and why:
- in memory the reliability checks' logits of the local models (measured on the whole
  target) are reused as teachers; spilled they are not held, and the data pass runs every
  teacher again;
- the calibration's evidence is read in blocks of :data:`BLOCK_ROWS` rows when spilled;
- the adaptive consensus reads its votes through votes.MemoryProbs or votes.SpilledProbs;
- SHOT (when the default adapts) keeps its pseudo-label pass's features in a scratch file.
"""

from __future__ import annotations

import numpy as np

from mrtf.refinery.config import RefineConfig
from mrtf.refinery.spill import Scratch, SpillArray, TeacherMajor
from mrtf.refinery.votes import MemoryProbs, SpilledProbs

#: 'auto' spills when the in-memory refinery would hold more than this (see memory_estimate)
STREAM_ABOVE_BYTES = 768 * 2**20
#: rows per block when the calibration's evidence is read from the logits spill
BLOCK_ROWS = 65_536


def memory_estimate(m: int, k: int, c: int, d: int, streaming: bool) -> int:
    """Bytes the refinery holds for M samples, K teachers, C classes, D features, roughly.
    In memory: logits (K, M, C), features (M, D), adaptive's float64 (S, M, C) views and a
    few (M, C) arrays. Spilled: the (M, C) arrays (targets, two softmaxes, a float64
    posterior, labels) and blocks (~200 MB)."""
    outputs = m * c * (3 * 4 + 2 * 8) + m * 8
    if streaming:
        return outputs + 200 * 2**20
    return outputs + m * (k * c * 4 + k * c * 8 + d * 4)


def use_streaming(config: RefineConfig, m: int, k: int, c: int, d: int) -> bool:
    """``config.stream``: 'on', 'off', or 'auto' (spill above STREAM_ABOVE_BYTES)."""
    if config.stream != "auto":
        return config.stream == "on"
    return memory_estimate(m, k, c, d, streaming=False) > STREAM_ABOVE_BYTES


def streams(received, source, config: RefineConfig) -> bool:
    """Whether this run spills: by ``config.stream`` and the size of the run."""
    k = len(received.models) + 1
    dims = [t.shape[1] for m in received.models for t in m.state_dict.values() if t.dim() == 2]
    return use_streaming(config, len(source), k, received.num_classes, max(dims, default=512))


class MemoryLogits:
    """The teachers' logits (K, M, C) float32 in memory: ``view`` is the array."""

    def __init__(self, k: int, m: int, c: int) -> None:
        self.view = np.empty((k, m, c), dtype=np.float32)

    def write(self, start: int, block: np.ndarray, first: int = 0) -> None:
        """Teachers [first, first + k) of rows [start, start + n) ← ``block`` (k, n, C)."""
        self.view[first:first + len(block), start:start + block.shape[1]] = block

    def overwrite(self, start: int, block: np.ndarray) -> None:
        """All teachers' rows [start, start + n) ← ``block`` (K, n, C) (e.g. Eq. 6's
        softmax in place: the logits are not read again)."""
        self.view[:, start:start + block.shape[1]] = block

    def source_probs(self) -> MemoryProbs:
        """What :meth:`overwrite` wrote, as the consensus' votes."""
        return MemoryProbs(self.view)


class SpilledLogits:
    """The teachers' logits in a (M, K, C) spill; ``view`` reads it as (K, M, C)."""

    def __init__(self, spill: SpillArray) -> None:
        self.spill = spill
        self.view = TeacherMajor(spill)

    def write(self, start: int, block: np.ndarray, first: int = 0) -> None:
        """All teachers' rows [start, start + n) ← ``block`` (K, n, C) (the data pass runs
        every teacher: nothing is reused, ``first`` is 0)."""
        assert first == 0, "a spill is written whole rows at a time"
        self.spill.write(start, block.transpose(1, 0, 2))

    def overwrite(self, start: int, block: np.ndarray) -> None:
        self.spill.write(start, block.transpose(1, 0, 2))

    def source_probs(self) -> SpilledProbs:
        return SpilledProbs(self.spill)


class MemoryStorage:
    """Rows in memory (every array an ndarray)."""

    spilled = False
    #: the reliability checks' logits of the local models are reused as teachers
    reuses_checked_logits = True
    #: rows per block of the calibration's evidence (None: all at once)
    signals_block: int | None = None

    def __enter__(self) -> MemoryStorage:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def logits(self, k: int, m: int, c: int) -> MemoryLogits:
        return MemoryLogits(k, m, c)

    def rows(self, name: str, m: int, d: int) -> np.ndarray:
        return np.empty((m, d), dtype=np.float32)


class SpilledStorage:
    """Rows spilled to a scratch folder in ``where`` (None: the system's temporary folder),
    removed with everything in it when the ``with`` block ends, on error too."""

    spilled = True
    reuses_checked_logits = False
    signals_block: int | None = BLOCK_ROWS

    def __init__(self, where: str | None) -> None:
        self.scratch = Scratch(where)

    def __enter__(self) -> SpilledStorage:
        self.scratch.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.scratch.__exit__(*exc)

    def logits(self, k: int, m: int, c: int) -> SpilledLogits:
        return SpilledLogits(self.scratch.array("logits", (m, k, c)))

    def rows(self, name: str, m: int, d: int) -> SpillArray:
        return self.scratch.array(name, (m, d))


def open_storage(received, source, config: RefineConfig) -> MemoryStorage | SpilledStorage:
    """The run's storage, decided once (:func:`streams`)."""
    if streams(received, source, config):
        return SpilledStorage(config.scratch_dir)
    return MemoryStorage()
