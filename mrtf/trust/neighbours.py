"""The target data's own neighbourhoods: a label-free signal for the calibrated confidence.

Labels that are right follow the target's natural clusters; labels that are 30 % right on
MNIST cut across them. The refinery measures this per sample as the share of its k nearest
target samples (in the target's own input space, not in any received model's features) that
carry the same label. The neighbourhoods depend on the data only, so they are found before
any label exists (:func:`target_neighbours`, kept in ``Signals.neighbours``) and the labels
are compared with them at calibration time (:func:`label_consistency`).

The neighbours are searched among a **reference set** of at most :data:`REFERENCE` target
rows (all rows when there are fewer, else evenly spaced ones), in the :data:`DIMS` leading
principal components of the reference's flattened inputs, by cosine similarity. A fixed
reference size keeps the signal's scale the one the calibrator was fitted at (the grid's
targets have 1,000 samples; with all M rows, neighbours grow closer as M grows), and it
costs one pass over the target by blocks, so the streaming path computes it too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from mrtf.compute.backend import choose_backend
from mrtf.compute.knn import topk_block, unit_rows
from mrtf.io.read_ahead import source_chunks

#: neighbours per sample
K = 10
#: at most this many target rows are searched for neighbours (the grid's target size)
REFERENCE = 1000
#: principal components of the flattened input the similarity is measured in
DIMS = 50
#: inputs with more values per sample are read at this many fixed coordinates (seeded), so
#: the principal components stay cheap on large images
MAX_INPUT = 4096
#: rows compared with the reference at a time
BLOCK = 1024


def reference_rows(m: int, reference: int = REFERENCE) -> np.ndarray:
    """Row indices of the reference set: all m rows, or ``reference`` evenly spaced ones
    (spread over the file, so a target sorted by class still gives every class)."""
    if m <= reference:
        return np.arange(m, dtype=np.int64)
    return np.unique(np.linspace(0, m - 1, reference).round().astype(np.int64))


def read_rows(source, rows: np.ndarray) -> np.ndarray:
    """The inputs of ``rows`` (sorted reference rows, :func:`reference_rows`) of ``source``:
    one read when they are all the rows, else the source's ``take`` (an H5Dataset reads them
    by storage blocks: one read per row took 1.5 s for 4,096 rows of a 1M-row file), else one
    read per row."""
    if len(rows) == len(source):
        return source.read(0, len(source))
    if hasattr(source, "take"):
        return np.asarray(source.take(rows), dtype=np.float32)
    return np.concatenate([source.read(int(i), int(i) + 1) for i in rows])


def _unit(z: np.ndarray) -> np.ndarray:
    return z / (np.linalg.norm(z, axis=1, keepdims=True) + 1e-12)


@dataclass
class _Projection:
    """The reference's principal subspace: target rows → unit vectors in it (float64)."""

    cols: np.ndarray | None  # the fixed input coordinates read (None: all)
    mu: np.ndarray
    basis: np.ndarray  # (width, dims)

    def flat(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
        return x if self.cols is None else x[:, self.cols]

    def unit(self, x: np.ndarray) -> np.ndarray:
        return _unit((self.flat(x) - self.mu) @ self.basis)


def target_neighbours(source, k: int = K, reference: int = REFERENCE, dims: int = DIMS,
                      block: int = BLOCK, device: str | torch.device | None = None
                      ) -> np.ndarray | None:
    """(M, k) int32: each target row's k nearest reference rows (itself excluded), as row
    indices of ``source`` (anything with ``len`` and ``read(start, stop)``: H5Dataset,
    ArraySource). None when the target has fewer than 2 rows. Never reads labels.

    ``device`` (None: CUDA when present): on the CPU, numpy as always; elsewhere the blocks
    are projected and searched on the device in float64 (mrtf.compute.knn): the same
    neighbour sets up to ties (in another order within a row, which label_consistency, a
    share, does not see)."""
    m = len(source)
    ref = reference_rows(m, reference)
    k = min(k, len(ref) - 1)
    if k < 1:
        return None
    width = int(np.prod(source.read(0, 1).shape[1:]))
    cols = None if width <= MAX_INPUT else \
        np.sort(np.random.default_rng(0).choice(width, MAX_INPUT, replace=False))
    proj = _Projection(cols, np.zeros(0), np.zeros(0))
    xr = proj.flat(read_rows(source, ref))
    proj.mu = xr.mean(0)
    _, _, vt = np.linalg.svd(xr - proj.mu, full_matrices=False)
    proj.basis = vt[:dims].T
    zr = _unit((xr - proj.mu) @ proj.basis)
    where = choose_backend(device)
    if not where.on_host:
        return _device_neighbours(source, proj, zr, ref, k, block, where.device)
    out = np.empty((m, k), dtype=np.int32)  # half of int64 at 1M rows: 40 MB for k = 10
    for s, x in source_chunks(source, block):  # plain reads on the CPU (mrtf.io.read_ahead)
        z = proj.unit(x)
        sim = z @ zr.T
        rows = np.arange(s, s + len(z))
        pos = np.minimum(np.searchsorted(ref, rows), len(ref) - 1)
        own = ref[pos] == rows  # a reference row is not its own neighbour
        sim[np.nonzero(own)[0], pos[own]] = -np.inf
        top = np.argpartition(-sim, k - 1, axis=1)[:, :k]
        out[s:s + len(z)] = ref[top]
    return out


def _device_neighbours(source, proj: _Projection, zr: np.ndarray, ref: np.ndarray, k: int,
                       block: int, device: torch.device) -> np.ndarray:
    """target_neighbours' search on ``device``: each block read, moved, projected (float64)
    and compared with the reference by one product and top-k."""
    mu, basis = (torch.from_numpy(a).to(device) for a in (proj.mu, proj.basis))
    ref_unit = torch.from_numpy(zr).to(device)
    out = np.empty((len(source), k), dtype=np.int32)
    for s, x in source_chunks(source, block, device):  # the next block read meanwhile
        x = np.asarray(x)
        x = x.reshape(len(x), -1) if proj.cols is None else x.reshape(len(x), -1)[:, proj.cols]
        z = unit_rows((torch.from_numpy(np.ascontiguousarray(x)).to(device).double() - mu)
                      @ basis)
        rows = np.arange(s, s + len(x))
        pos = np.minimum(np.searchsorted(ref, rows), len(ref) - 1)
        skip = torch.from_numpy(np.where(ref[pos] == rows, pos, -1)).to(device)
        _, top = topk_block(z, ref_unit, k, exclude=skip, db_block=len(ref))
        out[s:s + len(x)] = ref[top.cpu().numpy()]
    return out


def label_consistency(labels: np.ndarray, neighbours: np.ndarray,
                      own: np.ndarray | None = None, block: int = 65536) -> np.ndarray:
    """(n,) share of each row's neighbours whose label equals its own; by blocks of rows, so
    no (n, k) temporary is made. ``labels`` are all M labels (the neighbours index into
    them); ``own`` the rows' own labels (default: labels[:n], i.e. neighbours of every row)."""
    labels = np.asarray(labels)
    own = labels[:len(neighbours)] if own is None else np.asarray(own)
    out = np.empty(len(neighbours), dtype=np.float64)
    for s in range(0, len(neighbours), block):
        out[s:s + block] = (labels[neighbours[s:s + block]] == own[s:s + block, None]).mean(1)
    return out
