"""Settings of a data-free fusion run, with the papers' defaults.

``None`` means "the chosen method's default":

| setting | FedFTG (fedftg-cvpr Sect. 4.1, Alg. 2) | FedKF (fedkf Sect. IV; docs) |
|---|---|---|
| batch_size | 50 | 64 |
| gen_lr | Adam 0.01, ×0.998 per round | Adam 1e-3 |
| student_lr | SGD 0.1, ×0.998 per round, weight decay 1e-3 | SGD 0.01 (Sect. IV-D, LeNet) |
| noise_dim | 100 (256 for ≥ 100 classes) | 100 (256 for ≥ 100 classes) |

FedFTG runs ``rounds`` server updates of ``iterations`` (I = 10) outer iterations, each with
``gen_steps`` (I_g = 1) generator steps and ``student_steps`` (I_d = 5) student steps. The paper
runs one server update per communication round; a one-shot fusion of received models needs
more, so ``rounds`` defaults to 10 (100 generator and 500 student steps). FedKF runs ``steps``
alternating generator / student steps (Alg. 1, lines 18-19).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from mrtf.errors import InputError

METHODS = ("fedftg", "fedkf")
DISCREPANCIES = ("kl", "kl_per_teacher", "l1")
DIVERSITIES = ("mean", "norm")

_DEFAULTS = {
    "fedftg": {"batch_size": 50, "gen_lr": 0.01, "student_lr": 0.1, "weight_decay": 1e-3,
               "momentum": 0.0},
    "fedkf": {"batch_size": 64, "gen_lr": 1e-3, "student_lr": 0.01, "weight_decay": 0.0,
              "momentum": 0.9},
}


@dataclass
class FusionConfig:
    """One data-free fusion run. Validate with :meth:`validate` (raises InputError)."""

    method: str | None = None  # 'fedftg' | 'fedkf' | None = auto (choose_method)
    # FedFTG (Alg. 2)
    rounds: int = 10
    iterations: int = 10
    gen_steps: int = 1
    student_steps: int = 5
    lr_decay: float = 0.998
    lambda_cls: float = 1.0
    lambda_dis: float = 1.0
    discrepancy: str = "kl"  # 'kl' KL(ensemble‖student) | 'kl_per_teacher' Eq. 4 | 'l1'
    diversity: str = "mean"  # 'mean' authors' code | 'norm' Eq. 7 literally
    # FedKF (Alg. 1, Eq. 5-8)
    steps: int = 500
    lambda_oh: float = 0.1
    lambda_a: float = 0.1
    gamma: float = 1.0
    temperature: float = 1.0
    # both
    batch_size: int | None = None
    noise_dim: int | None = None
    gen_lr: float | None = None
    student_lr: float | None = None
    weight_decay: float | None = None
    momentum: float | None = None
    activation: str = "sigmoid"
    collapse_tol: float = 1e-3
    # FedKF when every party's latest model is from one round: OCA = ACA, the result is the
    # parameter average whatever the training does; skip the training (say so) unless False
    skip_futile: bool = True
    seed: int = 0
    device: str | None = None
    progress: bool = True

    def validate(self) -> FusionConfig:
        """Check every value; return self. Bad values raise one-line InputErrors."""
        if self.method not in (None, *METHODS):
            raise InputError(f"unknown data-free method {self.method!r}; choose fedftg or fedkf")
        if self.discrepancy not in DISCREPANCIES:
            raise InputError(f"discrepancy must be one of {', '.join(DISCREPANCIES)}, "
                             f"got {self.discrepancy!r}")
        if self.diversity not in DIVERSITIES:
            raise InputError(f"diversity must be one of {', '.join(DIVERSITIES)}, "
                             f"got {self.diversity!r}")
        for name in ("rounds", "iterations", "gen_steps", "student_steps", "steps"):
            if getattr(self, name) < 1:
                raise InputError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("batch_size", "noise_dim"):
            value = getattr(self, name)
            if value is not None and value < 2:
                raise InputError(f"{name} must be >= 2, got {value}")
        for name in ("gen_lr", "student_lr", "temperature"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise InputError(f"{name} must be positive, got {value}")
        for name in ("lambda_cls", "lambda_dis", "lambda_oh", "lambda_a", "gamma",
                     "weight_decay", "momentum", "collapse_tol"):
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise InputError(f"{name} must be >= 0, got {value}")
        if not 0 < self.lr_decay <= 1:
            raise InputError(f"lr_decay must be in (0, 1], got {self.lr_decay}")
        if self.momentum is not None and self.momentum >= 1:
            raise InputError(f"momentum must be < 1, got {self.momentum}")
        return self

    def with_total_steps(self, steps: int) -> FusionConfig:
        """A copy that trains the student ``steps`` times in all: FedKF's ``steps``, or
        FedFTG's ``rounds`` (each ``iterations`` × ``student_steps`` steps), rounded up."""
        if self.method == "fedftg":
            per_round = self.iterations * self.student_steps
            return replace(self, rounds=max(1, -(-steps // per_round)))
        return replace(self, steps=steps)

    def resolved(self, method: str) -> FusionConfig:
        """A copy with ``method`` set and every ``None`` replaced by that method's default."""
        fill = {k: v for k, v in _DEFAULTS[method].items() if getattr(self, k) is None}
        return replace(self, method=method, **fill)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
