"""Differential privacy on the uploads (MrTF Sect. 5.5) as a wrapper around any strategy, as
Flower's ``DifferentialPrivacyServerSideFixedClipping`` wraps one: each client's update is
clipped to ``clip`` in L2 norm, then N(0, σ²) noise is added to every coordinate, before the
wrapped strategy sees it."""

from __future__ import annotations

import math
from dataclasses import replace

import torch

from mrtf.federated.strategies.base import Aggregated, ClientUpdate, Strategy, sub_seed


def privatize(start: dict[str, torch.Tensor], state: dict[str, torch.Tensor], sigma: float,
              clip: float, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """θ_t + clip(θ_k − θ_t) + N(0, σ²): the update (all floating-point entries, BN statistics
    included) is scaled to L2 norm ≤ ``clip`` (when > 0), then Gaussian noise is added to every
    coordinate (MrTF Sect. 5.5). Integer buffers are passed through."""
    keys = [k for k, v in state.items() if v.is_floating_point()]
    delta = {k: state[k].double() - start[k].double() for k in keys}
    scale = 1.0
    if clip > 0:
        norm = math.sqrt(sum(float((d * d).sum()) for d in delta.values()))
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
    out = dict(state)
    for k in keys:
        noise = torch.randn(delta[k].shape, generator=gen, dtype=torch.float64) * sigma \
            if sigma > 0 else 0.0
        out[k] = (start[k].double() + delta[k] * scale + noise).to(state[k].dtype)
    return out


class DifferentialPrivacy(Strategy):
    """``inner`` with every client update privatized before its server step. Each client's
    noise is drawn from its own generator seeded by (seed, round, client), so it does not
    depend on which other clients took part. Everything else is ``inner``'s (its name, its
    client update, its checkpointed state)."""

    def __init__(self, inner: Strategy, sigma: float, clip: float = 0.0) -> None:
        if not (sigma >= 0 and clip >= 0):
            raise ValueError("DP sigma and clip must be >= 0")
        super().__init__(inner.ctx, inner.name)
        self.inner, self.sigma, self.clip = inner, sigma, clip

    def __getattr__(self, attr: str):
        # the wrapped strategy's own attributes (e.g. FedFTG's generator) stay reachable
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def privatize(self, rnd: int, start_state: dict[str, torch.Tensor],
                  updates: list[ClientUpdate]) -> list[ClientUpdate]:
        out = []
        for u in updates:
            gen = torch.Generator().manual_seed(sub_seed(self.ctx.seed, rnd, u.client, "dp"))
            out.append(replace(u, state=privatize(start_state, u.state, self.sigma, self.clip,
                                                  gen)))
        return out

    def initialize(self, init_state):
        self.inner.initialize(init_state)

    def client_update(self, rnd, k, model, x, y, local, seed):
        return self.inner.client_update(rnd, k, model, x, y, local, seed)

    def aggregate(self, rnd, start_state, updates, evaluate) -> Aggregated:
        noisy = self.privatize(rnd, start_state, updates)
        agg = self.inner.aggregate(rnd, start_state, noisy, evaluate)
        if agg.updates is None:  # what the server received is the noisy updates
            agg.updates = noisy
        return agg

    def state_tensors(self):
        return self.inner.state_tensors()

    def state_json(self):
        return self.inner.state_json()

    def load_state_tensors(self, tensors, extra):
        self.inner.load_state_tensors(tensors, extra)
