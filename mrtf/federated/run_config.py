"""The one config of a simulated federation (``mrtf simulate``, ``--config run.toml``) and its
TOML form. The server methods' knobs are inherited from :class:`MethodSettings` (the strategies
read them from this object); the client update's :class:`LocalConfig` is derived from it."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from mrtf.errors import InputError
from mrtf.federated.clients import LOCAL_ALGORITHMS
from mrtf.federated.federation import Federation, prepare_federation
from mrtf.federated.local import SHOT_JITTER, LocalConfig
from mrtf.federated.methods import METHODS, MethodSettings
from mrtf.refinery.variants import VARIANTS

#: the client update's defaults, read from their one definition (LocalConfig)
_LOCAL = LocalConfig()
RUN_FILES = ("config.json", "config.toml", "metrics.jsonl", "metrics.h5", "accuracy.png",
             "summary.md")


@dataclass
class RunConfig(MethodSettings):
    """One simulated federation run: K clients, R·K of them per round for T rounds, one track
    per (seed, method); every field is a TOML key."""

    dataset: str = "mnist5k"
    target: str | None = None  # None / same as dataset: held-out part (in-domain)
    clients: int = 20
    split: str = "dirichlet:0.1"
    ratio: float = 0.2
    rounds: int = 1
    epochs: int = _LOCAL.epochs
    local_steps: int | None = _LOCAL.steps
    lr: float = _LOCAL.lr
    batch_size: int = _LOCAL.batch_size  # LOCAL_BATCH_SIZE, measured (its comment)
    local_algorithm: str = "fedavg"
    mu: float = _LOCAL.mu  # FedProx μ: needs local_algorithm = fedprox and μ > 0 (e.g. 0.01)
    # the party recipe's knobs (LocalConfig; recipes.py, docs/party-recipe.md)
    weight_decay: float = _LOCAL.weight_decay
    label_smoothing: float = _LOCAL.label_smoothing
    nesterov: bool = _LOCAL.nesterov
    lr_decay: str = _LOCAL.lr_decay  # or "inverse": SHOT's lr·(1 + 10·i/N)^−0.75
    local_augment: bool = False  # SHOT's USPS augmentation (shift ≤ 4/28, rotation ≤ 10°)
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
    # the server methods' knobs (refine_steps, ..., fedkf_oca) are MethodSettings' fields

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
        """Every key, the run's own first and the server methods' after them."""
        d = asdict(self)
        server = {f.name for f in fields(MethodSettings)}
        return {**{k: v for k, v in d.items() if k not in server},
                **{k: v for k, v in d.items() if k in server}}

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same run (``out`` aside)."""
        d = self.to_dict()
        d.pop("out")
        return d

    def local_config(self) -> LocalConfig:
        try:
            return LocalConfig(epochs=self.epochs, steps=self.local_steps, lr=self.lr,
                               batch_size=self.batch_size,
                               mu=self.mu if self.local_algorithm == "fedprox" else 0.0,
                               weight_decay=self.weight_decay,
                               label_smoothing=self.label_smoothing, nesterov=self.nesterov,
                               lr_decay=self.lr_decay,
                               augment=SHOT_JITTER if self.local_augment else None)
        except ValueError as exc:
            raise InputError(str(exc)) from None

    @property
    def per_round(self) -> int:
        """R·K: the clients selected each round."""
        return max(1, int(round(self.ratio * self.clients)))

    def validate(self) -> None:
        from mrtf.data import DATASET_NAMES, is_dataset_name, parse_split
        from mrtf.models import available_archs

        def bad(cond: bool, msg: str) -> None:
            if cond:
                raise InputError(msg)

        parse_split(self.split)
        bad(not is_dataset_name(self.dataset) and not Path(self.dataset).is_file(),
            f"unknown dataset {self.dataset!r}; {DATASET_NAMES}, or a path to an .h5 file")
        bad(self.clients < 1, f"--clients must be >= 1, got {self.clients}")
        bad(not 0 < self.ratio <= 1, f"--ratio must be in (0, 1], got {self.ratio}")
        bad(self.ratio * self.clients < 1, f"--ratio {self.ratio} × --clients {self.clients} "
            "selects no client per round (R·K < 1)")
        bad(self.rounds < 1, f"--rounds must be >= 1, got {self.rounds}")
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
            bad(not is_dataset_name(self.target) and not Path(self.target).is_file(),
                f"unknown target dataset {self.target!r}; {DATASET_NAMES}, or a path to an "
                ".h5 file")
        self.local_config()

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
    """The seed's federation (:func:`~mrtf.federated.federation.prepare_federation`)."""
    return prepare_federation(cfg, seed)
