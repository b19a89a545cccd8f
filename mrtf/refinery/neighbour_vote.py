"""The neighbour vote: each label is decided by the refined model on the sample and on its
nearest target samples in the refined model's own feature space (the adaptive default).

    p̃(x) = (p(x) + Σ_{j ∈ N_k(x)} p(j)) / (k + 1)

p: the refined model's softmax; N_k(x): the k reference rows whose features (the model's
penultimate layer, L2-normalised) are most cosine-similar to x's, x itself excluded. A
distilled student's features already group the target by class better than its last layer
separates them, so a sample the model gets wrong among right neighbours is outvoted (the
neighbourhood-consistency idea of source-free adaptation, e.g. NRC, Yang et al. 2021, applied
once to the outputs, with no training).

Measured (bench/label_quality.py, the default's labels before and after, 3 seeds): k = 3
gave +0.9 points on the grid (24 sets) and +1.0 on the fresh sets (27), better in 39 of the
53 sets, worse in 12 (at most −1.1: already-right labels of a confident model, one-shot
Dirichlet and 50 rounds); k = 5, 10, 20 and label spreading (Zhou et al. 2004, α = 0.5-0.99)
gained less. k was chosen on both sets together, so there is no held-out check of it.

Neighbours are searched among a **reference set** of at most :data:`REFERENCE` rows (all
rows when there are fewer, else evenly spaced ones, mrtf.trust.neighbours.reference_rows),
so the cost is M × REFERENCE × D multiply-adds, streamed by blocks: nothing (M, D) is held.
The gain shrinks as the reference thins (1,000-row targets: +0.9 points with all rows, +0.5
with 500, 0 with 250), so the reference is 4× the grid's density of samples per class.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.compute.knn import topk_block
from mrtf.device import pick_device
from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.refinery.teachers import TeacherChunks, _softmax_np, predict_probs
from mrtf.trust.neighbours import read_rows, reference_rows

#: neighbours per sample (see the module docstring for how it was chosen)
NEIGHBOURS = 3
#: at most this many target rows are searched for neighbours
REFERENCE = 4096
#: rows compared with the reference at a time
BLOCK = 2048


def check_neighbours(k: int) -> None:
    """InputError unless k (``--neighbour-vote``) is ≥ 0."""
    if k < 0:
        raise InputError(f"--neighbour-vote must be >= 0 (0: off), got {k}")


@dataclass(frozen=True)
class NeighbourVoteSummary:
    """What ``RefineResult.neighbour_vote`` records of a vote: k neighbours per sample,
    searched among ``reference`` rows; ``changed`` labels differ from the model's own
    prediction."""

    k: int
    reference: int
    changed: int

    def line(self) -> str:
        return (f"neighbour vote (k = {self.k}, among {self.reference:,} samples): "
                f"{self.changed:,} labels differ from the refined model's own prediction")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class NeighbourVote:
    """probs (M, C) float32: the refined model's own softmax. voted (M, C) float32: p̃, the
    labels' probabilities. neighbours (M, k) int32: each row's neighbours (source rows).
    reference: how many rows were searched. changed: labels the vote changed."""

    probs: np.ndarray
    voted: np.ndarray
    neighbours: np.ndarray
    reference: int

    @property
    def changed(self) -> int:
        return int((self.probs.argmax(1) != self.voted.argmax(1)).sum())

    def summary(self) -> NeighbourVoteSummary:
        return NeighbourVoteSummary(int(self.neighbours.shape[1]), self.reference,
                                    self.changed)


def _unit(h: np.ndarray) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
    return t / t.norm(dim=1, keepdim=True).clamp_min(1e-12)


def nearest_rows(queries: np.ndarray, rows: np.ndarray, ref_unit: torch.Tensor,
                 ref: np.ndarray, k: int) -> np.ndarray:
    """(n, k) int64: for query features (n, D) of source rows ``rows``, the source rows of
    their k most cosine-similar reference rows (``ref_unit`` (R, D) normalised, ``ref`` their
    sorted row indices); a query that is itself a reference row skips itself. On the device
    ``ref_unit`` is on, by one product and top-k (mrtf.compute.knn)."""
    pos = np.minimum(np.searchsorted(ref, rows), len(ref) - 1)
    skip = torch.from_numpy(np.where(ref[pos] == rows, pos, -1)).to(ref_unit.device)
    _, top = topk_block(_unit(queries).to(ref_unit.device), ref_unit, k, exclude=skip,
                        db_block=max(1, len(ref_unit)))
    return ref[top.cpu().numpy()]


def vote(probs: np.ndarray, neighbours: np.ndarray, block: int = 65_536) -> np.ndarray:
    """p̃ = (p(x) + Σ_j p(j)) / (k + 1), by blocks of rows; (M, C) float32."""
    out = np.empty(probs.shape, dtype=np.float32)
    k = neighbours.shape[1]
    for s in range(0, len(probs), block):
        nb = neighbours[s:s + block]
        acc = probs[s:s + block].astype(np.float64) + probs[nb].sum(1, dtype=np.float64)
        out[s:s + block] = acc / (k + 1)
    return out


def predict_with_vote(model: nn.Module, source, k: int = NEIGHBOURS,
                      reference: int = REFERENCE, batch_size: int = 1024,
                      device: torch.device | str | None = None, stack: str = "auto"
                      ) -> NeighbourVote:
    """The refined model's softmax on ``source`` and its neighbour vote, in one streamed pass
    (plus a pass over the reference rows when the target has more than ``reference``).
    The model must have ``forward_features`` (every zoo model does). Never reads labels.
    The neighbours are searched on ``device`` too; the model is lent to the passes and left
    where it was (placement.py)."""
    dev = pick_device(device)
    m = len(source)
    ref = reference_rows(m, reference)
    k = min(k, len(ref) - 1)
    ref_unit = None
    if len(ref) < m:  # the reference rows' features first, so every block finds its neighbours
        ref_unit = _unit(_features(model, ArraySource(read_rows(source, ref)), batch_size,
                                   device, stack)).to(dev)
    probs: np.ndarray | None = None
    feats: np.ndarray | None = None  # only when the reference is the whole target (m ≤ R)
    # int32 as the target's own neighbourhoods (trust/neighbours.py): held to the end of the
    # refine, half of int64's bytes, and the same rows
    neighbours = np.empty((m, max(k, 0)), dtype=np.int32 if m < 2**31 else np.int64)
    for start, lg, h in TeacherChunks([model], source, batch_size, device, model, stack):
        if probs is None:
            probs = np.empty((m, lg.shape[-1]), dtype=np.float32)
        probs[start:start + lg.shape[1]] = _softmax_np(lg[0])
        rows = np.arange(start, start + len(h))
        if ref_unit is not None:
            neighbours[rows] = nearest_rows(h, rows, ref_unit, ref, k)
        else:
            feats = np.empty((m, h.shape[1]), np.float32) if feats is None else feats
            feats[rows] = h
    assert probs is not None
    if k < 1:
        return NeighbourVote(probs, probs.copy(), neighbours, len(ref))
    if ref_unit is None:
        assert feats is not None
        ref_unit = _unit(feats).to(dev)
        for s in range(0, m, BLOCK):
            rows = np.arange(s, min(m, s + BLOCK))
            neighbours[rows] = nearest_rows(feats[rows], rows, ref_unit, ref, k)
    return NeighbourVote(probs, vote(probs, neighbours), neighbours, len(ref))


def final_probs(model: nn.Module, source, k: int, batch_size: int = 1024,
                device: torch.device | str | None = None, stack: str = "auto"
                ) -> tuple[np.ndarray, NeighbourVote | None]:
    """The labels' probabilities (M, C): the neighbour vote's with k ≥ 1 (and a model with
    features), else the model's own softmax (the paper's methods); and the vote, if any."""
    if k >= 1 and hasattr(model, "forward_features") and len(source) > 1:
        out = predict_with_vote(model, source, k, REFERENCE, batch_size, device, stack)
        return out.voted, out
    return predict_probs(model, source, batch_size, device, stack), None


def _features(model: nn.Module, source, batch_size: int, device, stack: str) -> np.ndarray:
    parts = [h for _, _, h in TeacherChunks([model], source, batch_size, device, model, stack)]
    return np.concatenate(parts)
