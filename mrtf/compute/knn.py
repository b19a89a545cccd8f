"""Exact nearest neighbours in torch, on any device: blocked matrix products and top-k.

The queries are taken ``block`` rows at a time and the database ``db_block`` rows at a time,
so the similarity matrix held is at most block × db_block (64 MiB of float32 at the defaults),
whatever the sizes; the running top-k of a query block is merged across database blocks.
With one database block the result is one product and one ``topk``: the neighbour vote's CPU
path (neighbour_vote.nearest_rows) is this, unchanged. Inner product ('ip', the cosine of
normalised rows: every caller's metric) or squared L2 ('l2', ranked by 2 q·d - |d|²).
Ties between equal similarities may be broken differently from faiss.
"""

from __future__ import annotations

import numpy as np
import torch

from mrtf.compute.lean_ops import row_norms

METRICS = ("ip", "l2")
#: query rows per product
BLOCK = 4096
#: database rows per product
DB_BLOCK = 4096


def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows divided by their L2 norm + 1e-12 (cluster._normalise's formula, in x's dtype)."""
    return x / (row_norms(x) + 1e-12)


def similarities(queries: torch.Tensor, database: torch.Tensor, metric: str = "ip"
                 ) -> torch.Tensor:
    """(n, N) scores, larger is nearer: q·d ('ip') or 2 q·d - |d|² ('l2': |q - d|² ranks the
    same without |q|², which is constant per query)."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    sim = queries @ database.T
    if metric == "l2":
        sim = 2 * sim - (database * database).sum(1)[None]
    return sim


def _exclude(sim: torch.Tensor, exclude: torch.Tensor | None, offset: int) -> torch.Tensor:
    """``sim`` with -inf at each query's excluded database position (``exclude`` (n,), -1:
    none): in place by index on the CPU; elsewhere by :func:`_excluded_by_mask`, the same
    values without the indexing kernels, whose CUDA module is among the largest a refine
    would load (docs/gpu.md, "Host memory")."""
    if exclude is None:
        return sim
    if sim.device.type == "cpu":
        _exclude_by_index(sim, exclude - offset)
        return sim
    return _excluded_by_mask(sim, exclude - offset)


def _exclude_by_index(sim: torch.Tensor, pos: torch.Tensor) -> None:
    hit = torch.nonzero((pos >= 0) & (pos < sim.shape[1])).flatten()
    sim[hit, pos[hit]] = -float("inf")


def _excluded_by_mask(sim: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(sim.shape[1], device=sim.device)
    return torch.where(pos[:, None] == cols[None, :], -float("inf"), sim)


def topk_block(queries: torch.Tensor, database: torch.Tensor, k: int, metric: str = "ip",
               exclude: torch.Tensor | None = None, db_block: int = DB_BLOCK
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One query block's k best database rows: (scores (n, k), indices (n, k) int64), best
    first. ``exclude`` (n,) int64: a database position each query must skip (-1: none)."""
    best_s: torch.Tensor | None = None
    best_i: torch.Tensor | None = None
    for s in range(0, len(database), db_block):
        sim = similarities(queries, database[s:s + db_block], metric)
        sim = _exclude(sim, exclude, s)
        top = sim.topk(min(k, sim.shape[1]), dim=1)
        idx = top.indices + s
        if best_s is None:
            best_s, best_i = top.values, idx
            continue
        merged = torch.cat([best_s, top.values], 1).topk(k, dim=1)
        best_s, best_i = merged.values, torch.cat([best_i, idx], 1).gather(1, merged.indices)
    assert best_s is not None and best_i is not None
    return best_s, best_i


def knn(queries, database, k: int, device: torch.device | str = "cpu", metric: str = "ip",
        block: int = BLOCK, db_block: int = DB_BLOCK) -> tuple[np.ndarray, np.ndarray]:
    """Exact k nearest database rows of every query row on ``device``: (scores (M, k) float32,
    indices (M, k) int64), best first. ``queries`` may be any array read by row slices (a
    spill); the database (N, D) is moved to the device once."""
    db = torch.as_tensor(np.ascontiguousarray(database, dtype=np.float32)).to(device)
    scores = np.empty((len(queries), k), dtype=np.float32)
    out = np.empty((len(queries), k), dtype=np.int64)
    for s in range(0, len(queries), block):
        q = torch.as_tensor(np.ascontiguousarray(queries[s:s + block], dtype=np.float32))
        val, idx = topk_block(q.to(device), db, k, metric, db_block=db_block)
        scores[s:s + len(q)], out[s:s + len(q)] = val.cpu().numpy(), idx.cpu().numpy()
    return scores, out


def nearest_block(queries: torch.Tensor, database: torch.Tensor, metric: str = "ip",
                  db_block: int = DB_BLOCK) -> torch.Tensor:
    """(n,) int64: each query's best database row (k = 1 by argmax: the first of ties)."""
    if len(database) <= db_block:
        return similarities(queries, database, metric).argmax(1)
    return topk_block(queries, database, 1, metric, db_block=db_block)[1][:, 0]
