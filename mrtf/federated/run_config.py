"""One evaluation run's settings (``mrtf simulate --config run.toml``), their TOML form, and
each seed's federation (``prepare_run``: in-domain or cross-domain target)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrtf.errors import InputError
from mrtf.federated.fairness import split_local_test
from mrtf.federated.local import LocalConfig
from mrtf.federated.methods import METHODS, MethodSettings
from mrtf.federated.simulate import Federation, SimulationConfig, prepare_federation

LOCAL_ALGORITHMS = ("fedavg", "fedprox", "scaffold")
VARIANTS = ("paper", "reference")
RUN_FILES = ("config.json", "config.toml", "metrics.jsonl", "metrics.h5", "accuracy.png",
             "summary.md")


@dataclass
class RunConfig:
    """One comparison run (``mrtf simulate --config run.toml``); every field is a TOML key."""

    dataset: str = "mnist5k"
    target: str | None = None  # None / same as dataset: held-out part (in-domain)
    clients: int = 20
    split: str = "dirichlet:0.1"
    ratio: float = 0.2
    rounds: int = 1
    epochs: int = 2
    local_steps: int | None = None
    lr: float = 0.05
    batch_size: int = 16  # measured: docs/results.md ("Defaults")
    local_algorithm: str = "fedavg"
    mu: float = 0.0  # FedProx μ: needs local_algorithm = fedprox and μ > 0 (e.g. 0.01)
    arch: str = "lenet"
    norm: str | None = None
    target_size: int = 1000
    image_size: int | None = None
    channels: int | None = None
    methods: list[str] = field(default_factory=lambda: ["fedavg"])
    seeds: list[int] = field(default_factory=lambda: [0])
    dp_sigma: float = 0.0
    dp_clip: float = 0.0  # 0 = no clipping
    eval_every: int = 1
    local_test: float = 0.0  # fraction of each client's data held out (FedKF's AMP/FM/WLP)
    out: str | None = None
    # server methods
    refine_steps: int = 500
    refine_lr: float | None = None
    variant: str = "paper"
    clr_min_round: int = 5
    keep_training_on_average: bool = False
    fusion_iterations: int = 10
    fusion_student_steps: int = 5
    fusion_batch: int | None = None
    fedkf_kd_from_round: int = 0
    fedkf_oca: str = "paper"

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "config") -> RunConfig:
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InputError(f"{where}: unknown key {unknown[0]!r} (known: "
                             f"{', '.join(sorted(names))})")
        data = dict(data)
        for key in ("methods", "seeds"):
            if key in data:
                data[key] = _as_list(data[key], key)
        try:
            data["seeds"] = [int(s) for s in data.get("seeds", [0])]
        except (TypeError, ValueError):
            raise InputError(f"{where}: seeds must be integers, got {data['seeds']!r}") from None
        cfg = cls(**data)
        for f in fields(cls):  # light type check of scalars
            v = getattr(cfg, f.name)
            if isinstance(v, str) and f.type in ("int", "float", "bool"):
                raise InputError(f"{where}: {f.name} must be a number, got {v!r}")
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run (``out`` aside)."""
        d = self.to_dict()
        d.pop("out")
        return d

    def local_config(self) -> LocalConfig:
        try:
            return LocalConfig(epochs=self.epochs, steps=self.local_steps, lr=self.lr,
                               batch_size=self.batch_size,
                               mu=self.mu if self.local_algorithm == "fedprox" else 0.0)
        except ValueError as exc:
            raise InputError(str(exc)) from None

    def simulation(self, seed: int) -> SimulationConfig:
        return SimulationConfig(dataset=self.dataset, clients=self.clients, split=self.split,
                                ratio=self.ratio, rounds=self.rounds, arch=self.arch,
                                norm=self.norm, target_size=self.target_size,
                                image_size=self.image_size, channels=self.channels, seed=seed,
                                local=self.local_config())

    def settings(self) -> MethodSettings:
        return MethodSettings(**{f.name: getattr(self, f.name) for f in
                                 fields(MethodSettings)})

    def validate(self) -> None:
        from mrtf.data import BUILTIN
        from mrtf.models import available_archs

        def bad(cond: bool, msg: str) -> None:
            if cond:
                raise InputError(msg)

        bad(not self.methods, "no methods given")
        for m in self.methods:
            bad(m not in METHODS, f"unknown method {m!r}; choose from {', '.join(METHODS)}")
        bad(len(set(self.methods)) != len(self.methods), "a method is listed twice")
        bad(not self.seeds, "no seeds given")
        bad(len(set(self.seeds)) != len(self.seeds), "a seed is listed twice")
        bad(self.local_algorithm not in LOCAL_ALGORITHMS, f"unknown local algorithm "
            f"{self.local_algorithm!r}; choose from {', '.join(LOCAL_ALGORITHMS)}")
        bad(self.local_algorithm == "fedprox" and not self.mu > 0,
            f"fedprox needs mu > 0, got {self.mu}; give --mu (e.g. --mu 0.01)")
        bad(not (self.dp_sigma >= 0 and math.isfinite(self.dp_sigma)),
            f"dp_sigma (σ) must be >= 0, got {self.dp_sigma}")
        bad(not (self.dp_clip >= 0 and math.isfinite(self.dp_clip)),
            f"dp_clip must be >= 0, got {self.dp_clip}")
        bad(self.eval_every < 1, f"eval_every must be >= 1, got {self.eval_every}")
        bad(not 0.0 <= self.local_test < 1.0,
            f"local_test must be a fraction in [0, 1), got {self.local_test}")
        bad(self.refine_steps < 0, f"refine_steps must be >= 0, got {self.refine_steps}")
        bad(self.variant not in VARIANTS, f"variant must be paper or reference, got "
            f"{self.variant!r}")
        bad(self.fedkf_oca not in VARIANTS, f"fedkf_oca must be paper or reference, got "
            f"{self.fedkf_oca!r}")
        bad(self.fusion_iterations < 1 or self.fusion_student_steps < 1,
            "fusion_iterations and fusion_student_steps must be >= 1")
        bad(":" not in self.arch and self.arch not in available_archs(),
            f"unknown architecture {self.arch!r}; choose from {', '.join(available_archs())}")
        if self.target is not None and self.target != self.dataset:
            bad(self.target not in BUILTIN and not Path(self.target).is_file(),
                f"unknown target dataset {self.target!r}; built-in: {', '.join(BUILTIN)}, "
                "or a path to an .h5 file")
        self.simulation(self.seeds[0]).validate()

    @property
    def cross_domain(self) -> bool:
        return self.target is not None and self.target != self.dataset


def _as_list(value: Any, key: str) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, int | float):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise InputError(f"{key} must be a list or a comma-separated string, got {value!r}")


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a run config file (TOML); errors become one-line InputErrors."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    p = Path(path)
    if not p.is_file():
        raise InputError(f"config file {p} not found")
    try:
        with p.open("rb") as f:
            data = tomllib.load(f)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: not valid TOML ({str(exc).splitlines()[0]})") from None
    return data


def to_toml(data: dict[str, Any]) -> str:
    """Flat dict of scalars/lists → TOML text (None values are left out)."""
    def val(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(val(x) for x in v) + "]"
        return json.dumps(str(v))

    return "".join(f"{k} = {val(v)}\n" for k, v in data.items() if v is not None)


def prepare_run(cfg: RunConfig, seed: int) -> Federation:
    """The seed's federation; for a cross-domain run the target set is replaced by held-out
    samples of ``cfg.target``, resized and channel-converted to the source's shape."""
    fed = prepare_federation(cfg.simulation(seed))
    if cfg.local_test > 0:
        fed.parts, fed.test_parts = split_local_test(fed.parts, cfg.local_test, seed)
    if not cfg.cross_domain:
        return fed
    from mrtf.data import adapt_images, load_dataset, train_target_split

    c, h, w = fed.x.shape[1:]
    ds = load_dataset(cfg.target)
    if ds.x.ndim != 4 or ds.x.shape[-1] != ds.x.shape[-2] or h != w:
        raise InputError(f"target {cfg.target!r} images {tuple(ds.x.shape[1:])} do not fit the "
                         f"source's models ({c}×{h}×{w}): only square images can be resized")
    if ds.num_classes > fed.num_classes:
        raise InputError(f"target {cfg.target!r} has {ds.num_classes} classes but the source's "
                         f"models predict {fed.num_classes}")
    x = adapt_images(ds.x, h, c)
    n = len(ds.y)
    _, idx = train_target_split(n, min(cfg.target_size, n - 1), seed)
    fed.target_x = torch.from_numpy(np.ascontiguousarray(x[idx]))
    fed.target_y = torch.from_numpy(ds.y[idx].astype(np.int64))
    return fed


