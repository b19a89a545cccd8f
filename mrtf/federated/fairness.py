"""FedKF's client-level metrics on each client's local test part (fedkf Sect. III, Def. 1-3).

FedKF (Sect. VI) and both reference codes hold out 20 % of each client's data as its local test
part. A model's accuracy a_k on client k's part gives

- AMP (Def. 1) = Σ_k |D_k| / |D| · a_k, the data-weighted average model performance;
- FM (Def. 2) = (1/K) Σ_k (a_k − ā)², the variance across clients (smaller is fairer);
- WLP (Def. 3) = min_k a_k, the worst-case local performance.

Clients whose local test part is empty (too few samples) are left out of all three.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mrtf.federated.local import correct_mask

LOCAL_METRICS = ("amp", "fm", "wlp")


def split_local_test(parts: list[np.ndarray], fraction: float, seed: int
                     ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Random ``fraction`` of each client's indices as its local test part.

    parts : index arrays, one per client. Returns (train parts, test parts); a client keeps at
    least one training sample, and its test part has ⌊fraction · n_k⌋ samples. Deterministic
    in ``seed``.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"local test fraction must be in [0, 1), got {fraction}")
    train, test = [], []
    for k, idx in enumerate(parts):
        idx = np.asarray(idx)
        n_test = min(int(fraction * len(idx)), max(0, len(idx) - 1))
        order = np.random.default_rng([seed, k, 29]).permutation(len(idx))
        test.append(np.sort(idx[order[:n_test]]))
        train.append(np.sort(idx[order[n_test:]]))
    return train, test


def client_accuracies(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                      test_parts: list[np.ndarray], device: torch.device | str = "cpu",
                      batch_size: int = 1024) -> np.ndarray:
    """a_k: accuracy of ``model`` on each client's local test part (NaN where it is empty).

    x (N, C, H, W), y (N,) hold every client's samples; test_parts index into them. All parts
    are predicted in one batched pass.
    """
    rows = torch.from_numpy(np.concatenate([p for p in test_parts if len(p)]
                                           or [np.empty(0, np.int64)]))
    correct = correct_mask(model, x[rows], y[rows], batch_size, device)
    accs, start = np.full(len(test_parts), np.nan), 0
    for k, p in enumerate(test_parts):
        if len(p):
            accs[k] = correct[start:start + len(p)].mean()
            start += len(p)
    return accs


def fairness_metrics(accs: np.ndarray, sizes: np.ndarray) -> dict[str, float | None]:
    """AMP, FM and WLP (Def. 1-3) from per-client accuracies ``accs`` (K,) and local dataset
    sizes |D_k| ``sizes`` (K,); NaN accuracies (no local test part) are left out."""
    accs, sizes = np.asarray(accs, float), np.asarray(sizes, float)
    keep = np.isfinite(accs)
    if not keep.any():
        return dict.fromkeys(LOCAL_METRICS)
    a, w = accs[keep], sizes[keep]
    return {"amp": float((w * a).sum() / w.sum()), "fm": float(a.var()), "wlp": float(a.min())}
