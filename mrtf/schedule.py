"""SHOT's learning-rate annealing (Liang et al. 2020, code ``lr_scheduler``; from Ganin &
Lempitsky's DANN, 2015): lr_i = lr_0 · (1 + γ·i/N)^(−p), γ = 10, p = 0.75, for step i = 1..N.
Used by a party's local training (``LocalConfig.lr_decay``) and by SHOT's target stage
(``ShotSettings.paper()``), so both decay the same way."""

from __future__ import annotations

GAMMA = 10.0
POWER = 0.75


def inverse_decay(step: int, total: int, gamma: float = GAMMA, power: float = POWER) -> float:
    """The factor on lr_0 for 0-based ``step`` of ``total``: SHOT calls its scheduler with the
    1-based iteration before each step, so step 0 already has (1 + γ/N)^(−p) and the last
    step (1 + γ)^(−p) (0.166 at the defaults)."""
    if total < 1 or step < 0:
        raise ValueError(f"need total >= 1 and step >= 0, got step {step} of {total}")
    return (1.0 + gamma * min(step + 1, total) / total) ** (-power)
