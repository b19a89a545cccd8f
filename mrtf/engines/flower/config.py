"""The Flower run's settings: the ServerApp's run config (``[tool.flwr.app.config]`` of the app,
overridden with ``flwr run ... --run-config 'key=value ...'``), checked once, and what the
clients need of it sent with every train message.

Keys are Flower's kebab-case; each maps to the in-process engine's setting of the same meaning
(``RunConfig``), so one seed and one method give one federation in either engine.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from mrtf.errors import InputError
from mrtf.federated.local import LocalConfig
from mrtf.federated.methods import METHODS, MethodSettings
from mrtf.federated.run_config import RunConfig
from mrtf.refinery.config import RefineConfig
from mrtf.refinery.options import method_options
from mrtf.refinery.registry import MethodOptions
from mrtf.refinery.variants import VARIANTS

MODES = ("train", "pilot")
#: the defaults a Flower run shares with the in-process simulator (a run config holds no
#: None: 0 and "" stand for it), read from their one definition
_RUN, _METHOD, _REFINE = RunConfig(), MethodSettings(), RefineConfig()
MAX_ROUNDS = 100_000
MAX_PARTIES = 100_000


@dataclass
class FlowerConfig:
    """One Flower run. ``clients``: the parties expected, ``partition-id`` 0..clients-1 in
    their node config; ``fraction`` of them train each round (the in-process ``ratio``)."""

    mode: str = "train"
    method: str = _RUN.methods[0]
    num_rounds: int = _RUN.rounds
    seed: int = _RUN.seeds[0]
    clients: int = 3
    fraction: float = 1.0
    min_parties: int = 1
    round_timeout: float = 600.0
    wait_nodes: float = 60.0
    poll_interval: float = 0.2
    target: str = ""
    out: str = ""
    force: bool = False
    num_classes: int = 10
    arch: str = _RUN.arch
    norm: str = ""
    epochs: int = _RUN.epochs
    local_steps: int = 0
    lr: float = _RUN.lr
    batch_size: int = _RUN.batch_size
    mu: float = _RUN.mu
    eval_every: int = _RUN.eval_every
    threads: int = 0
    # server methods (MethodSettings)
    refine_steps: int = _METHOD.refine_steps
    refine_lr: float = 0.0
    variant: str = _METHOD.variant
    clr_min_round: int = _METHOD.clr_min_round
    keep_training_on_average: bool = _METHOD.keep_training_on_average
    fusion_iterations: int = _METHOD.fusion_iterations
    fusion_student_steps: int = _METHOD.fusion_student_steps
    fusion_batch: int = 0
    fedkf_kd_from_round: int = _METHOD.fedkf_kd_from_round
    fedkf_oca: str = _METHOD.fedkf_oca
    # pilot mode: the refinery's method and steps, as `mrtf refine --method --steps`
    pilot_method: str = _REFINE.method
    # pilot mode: the method's own settings, "KEY=VALUE ..." as `mrtf refine --option`
    pilot_options: str = ""

    @classmethod
    def from_run_config(cls, run_config: dict[str, Any]) -> FlowerConfig:
        """Flower's run config (kebab-case keys) → a checked config; unknown keys refused."""
        names = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for key, value in run_config.items():
            name = key.replace("-", "_")
            if name not in names:
                raise InputError(f"run config: unknown key {key!r}")
            values[name] = _coerce(key, value, names[name].type)
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        def bad(cond: bool, msg: str) -> None:
            if cond:
                raise InputError(f"run config: {msg}")

        bad(self.mode not in MODES, f"mode must be one of {', '.join(MODES)}, got "
            f"{self.mode!r}")
        bad(self.method not in METHODS, f"unknown method {self.method!r}; choose from "
            f"{', '.join(METHODS)}")
        bad(not 1 <= self.num_rounds <= MAX_ROUNDS, f"num-rounds must be in [1, {MAX_ROUNDS}]")
        bad(not 1 <= self.clients <= MAX_PARTIES, f"clients must be in [1, {MAX_PARTIES}]")
        bad(not 0 < self.fraction <= 1, f"fraction must be in (0, 1], got {self.fraction}")
        bad(not 1 <= self.min_parties <= self.clients,
            f"min-parties must be in [1, clients={self.clients}], got {self.min_parties}")
        for key in ("round_timeout", "wait_nodes", "poll_interval"):
            v = getattr(self, key)
            bad(not (math.isfinite(v) and v > 0), f"{key.replace('_', '-')} must be > 0 s")
        bad(not self.target, "target (the server's .h5 target set) is required")
        bad(not self.out, "out (the folder for the run's outputs) is required")
        bad(not 2 <= self.num_classes <= 100_000, "num-classes must be in [2, 100000]")
        bad(self.eval_every < 1, "eval-every must be >= 1")
        bad(self.threads < 0, "threads must be >= 0 (0: torch's default)")
        bad(self.refine_steps < 0, "refine-steps must be >= 0")
        bad(self.variant not in VARIANTS, "variant must be paper or reference")
        bad(self.fedkf_oca not in VARIANTS, "fedkf-oca must be paper or reference")
        self.local_config()  # its own checks
        self.method_options()

    def method_options(self) -> MethodOptions | None:
        """The pilot's ``RefineConfig.method_options``, from ``pilot-options``."""
        try:
            return method_options(self.pilot_method, self.pilot_options.split())
        except InputError as exc:
            raise InputError(f"run config: pilot-options: {exc}") from None

    @property
    def per_round(self) -> int:
        """Parties trained per round, as the in-process engine counts them."""
        return max(1, int(round(self.fraction * self.clients)))

    def local_config(self) -> LocalConfig:
        try:
            return LocalConfig(epochs=self.epochs, steps=self.local_steps or None, lr=self.lr,
                               batch_size=self.batch_size, mu=self.mu)
        except ValueError as exc:
            raise InputError(f"run config: {exc}") from None

    def settings(self) -> MethodSettings:
        own = asdict(self)
        s = {f.name: own[f.name] for f in fields(MethodSettings)}
        s["refine_lr"] = self.refine_lr or None
        s["fusion_batch"] = self.fusion_batch or None
        return MethodSettings(**s)

    def out_dir(self) -> Path:
        return Path(self.out).expanduser()

    def client_config(self) -> dict[str, Any]:
        """What every train message carries (flat scalars for a ConfigRecord)."""
        keys = ("method", "seed", "num_classes", "arch", "epochs", "local_steps", "lr",
                "batch_size", "mu", "threads", "fusion_batch", "fedkf_kd_from_round",
                "fedkf_oca")
        return {k: getattr(self, k) for k in keys}


def _coerce(key: str, value: Any, typ: Any) -> Any:
    """A TOML value as the field's type (ints given for floats are fine; nothing else is)."""
    typ = str(typ)
    if typ == "bool":
        if not isinstance(value, bool):
            raise InputError(f"run config: {key} must be true or false, got {value!r}")
        return value
    if typ == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InputError(f"run config: {key} must be an integer, got {value!r}")
        return value
    if typ == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InputError(f"run config: {key} must be a number, got {value!r}")
        return float(value)
    if not isinstance(value, str):
        raise InputError(f"run config: {key} must be a string, got {value!r}")
    return value


def client_settings(config: dict[str, Any]) -> dict[str, Any]:
    """The client's view of a train message's config (what :meth:`client_config` sent),
    checked like the server checks its own (the client does not trust the server either)."""
    known = {f.name: f for f in fields(FlowerConfig)}
    out = {}
    for key in FlowerConfig().client_config():
        if key not in config:
            raise InputError(f"the server's message lacks {key!r}")
        out[key] = _coerce(key, config[key], known[key].type)
    probe = FlowerConfig(**out, target="-", out="-")
    probe.validate()
    return json.loads(json.dumps(out))
