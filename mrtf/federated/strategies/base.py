"""What every server strategy shares: its context, what clients send, what it returns, and the
hooks an engine calls (Flower-style: narrow hooks, the engine elsewhere).

A strategy sees one round at a time:

* ``initialize(init_state)``: θ_0, once before the first round (not on resume).
* ``client_update(rnd, k, model, x, y, local, seed)``: the client's training, or ``None`` for
  the engine's client algorithm (FedAvg / FedProx / SCAFFOLD local SGD). Only FedKF overrides it.
* ``aggregate(rnd, start_state, updates, evaluate) -> Aggregated``: the server step; returns the
  state the next round's clients receive and what to score on the target set.
* ``state_tensors()`` / ``state_json()`` / ``load_state_tensors(tensors, extra)``: persistent
  server state for checkpoints (tensors only; small JSON extras).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from mrtf.averaging import average_states
from mrtf.federated.local import LocalConfig, LocalResult
from mrtf.models import build_model
from mrtf.refinery.config import CLR_MIN_ROUND
from mrtf.refinery.distill import STEPS

#: columns every metrics row carries (None where a method has no such model)
SCORES = ("averaged", "ensemble", "refined", "aca", "oca")


def sub_seed(*parts: int | str) -> int:
    """A deterministic 31-bit seed from integers/strings (same on every machine)."""
    ints = [p if isinstance(p, int) else int.from_bytes(p.encode(), "little") % (2 ** 31)
            for p in parts]
    return int(np.random.SeedSequence(ints).generate_state(1)[0] % (2 ** 31))


@dataclass
class MethodSettings:
    """Server-side knobs shared by the strategies (defaults: the papers)."""

    refine_steps: int = STEPS
    refine_lr: float | None = None
    variant: str = "paper"
    clr_min_round: int = CLR_MIN_ROUND
    keep_training_on_average: bool = False
    fusion_iterations: int = 10  # FedFTG I per communication round
    fusion_student_steps: int = 5  # FedFTG I_d
    fusion_batch: int | None = None  # FedFTG 50, FedKF 64
    fedkf_kd_from_round: int = 0  # Alg. 1: KD from the first round; the authors' code: 1
    fedkf_oca: str = "paper"  # 'paper': all K cache slots start at w^0; 'reference': trained only


@dataclass
class ServerContext:
    """What every strategy may use. ``target`` holds no labels (never read for training)."""

    arch: str
    num_classes: int
    arch_kwargs: dict
    image_shape: tuple[int, int, int]
    target: Any  # ArraySource without y
    client_sizes: list[int]
    seed: int
    device: torch.device
    settings: MethodSettings

    def build(self, state: dict[str, torch.Tensor]) -> nn.Module:
        model = build_model(self.arch, self.num_classes, **self.arch_kwargs)
        model.load_state_dict(state)
        return model.to(self.device).eval()


@dataclass
class ClientUpdate:
    """What the server receives from one client."""

    client: int
    state: dict[str, torch.Tensor]
    n_samples: int
    label_counts: list[int]
    train_loss: float


@dataclass
class Aggregated:
    """state: what the next round's clients receive. states / probs: models (state dicts) and
    target-set predictions (M, C) to score, by column name (SCORES); a column with both is
    scored on the target from its predictions, and its model is used for the clients' local
    test parts. primary: the column that is the method's own output ("accuracy"). warnings:
    one line each, for the user (the engine shows the first one of each run track).
    updates: the client updates as the server used them, when a wrapper changed them (DP
    noise); None means the updates the engine passed in (what a pilot party would receive)."""

    state: dict[str, torch.Tensor]
    primary: str
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    probs: dict[str, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    updates: list[ClientUpdate] | None = None


def cpu_state(model_or_state: nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A detached CPU copy of a module's (or a state dict's) tensors."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) \
        else model_or_state
    return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}


def average_updates(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
    """θ_{t+1}: the sample-weighted parameter average of the round's client states."""
    return average_states([u.state for u in updates], [u.n_samples for u in updates])


class Strategy:
    """The hooks every strategy has. The default server step is FedAvg's sample-weighted
    average, so a strategy overrides only what it changes."""

    name = "fedavg"

    def __init__(self, ctx: ServerContext, name: str | None = None) -> None:
        self.ctx = ctx
        if name is not None:
            self.name = name

    def initialize(self, init_state: dict[str, torch.Tensor]) -> None:
        """Called once with θ_0 before the first round (not on resume)."""

    def client_update(self, rnd: int, k: int, model: nn.Module, x: torch.Tensor,
                      y: torch.Tensor, local: LocalConfig, seed: int) -> LocalResult | None:
        return None

    def aggregate(self, rnd: int, start_state: dict[str, torch.Tensor],
                  updates: list[ClientUpdate], evaluate: bool) -> Aggregated:
        avg = average_updates(updates)
        return Aggregated(avg, "averaged", states={"averaged": avg})

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_json(self) -> dict:
        return {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], extra: dict) -> None:
        pass
