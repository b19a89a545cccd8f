"""Federated evaluation runs: several server methods × seeds on the same splits, with per-round
metrics, plots, a summary and exact resumption.

The engine owns client selection (the same clients for every method of a seed), local training
(FedAvg, FedProx, SCAFFOLD), differential privacy on the uploads (MrTF Sect. 5.5: each client's
update clipped to ``dp_clip`` in L2 norm, then N(0, σ²) added to every coordinate before the
server sees it), evaluation and checkpoints; the server logic is a strategy (methods.py).

Every random draw is seeded from (seed, round, client, purpose), so a run restarted from its
last checkpoint ends with exactly the metrics of an uninterrupted run (wall-clock columns
``seconds`` and ``elapsed`` aside).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mrtf.device import pick_device
from mrtf.errors import InputError, first_line
from mrtf.federated.fairness import (
    LOCAL_METRICS,
    client_accuracies,
    fairness_metrics,
    split_local_test,
)
from mrtf.federated.local import LocalConfig, accuracy, local_train
from mrtf.federated.methods import (
    METHODS,
    SCORES,
    ClientUpdate,
    MethodSettings,
    ServerContext,
    make_strategy,
    sub_seed,
)
from mrtf.federated.simulate import Federation, SimulationConfig, prepare_federation
from mrtf.io.atomic import atomic_path, is_temp_name
from mrtf.io.outputs import RUN_LOCK, locked_dir
from mrtf.progress import bar as progress_bar

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


# ---------------------------------------------------------------- data


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


# ---------------------------------------------------------------- DP


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


# ---------------------------------------------------------------- checkpoints


def _save_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save

    # bytes written by us into our temporary file: safetensors' save_file would keep a
    # temporary file of its own, which a killed run leaves behind
    data = save({k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()})
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def _write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def track_name(seed: int, method: str) -> str:
    return f"s{seed}-{method.replace('+', '_')}"


@dataclass
class TrackState:
    """A (seed, method) run in progress: what a checkpoint holds."""

    round: int  # rounds completed
    global_state: dict[str, torch.Tensor]
    control: dict[str, torch.Tensor] | None
    client_controls: dict[int, dict[str, torch.Tensor]]
    records: list[dict]
    elapsed: float
    done: bool = False


def save_checkpoint(ckdir: Path, name: str, ts: TrackState, strategy) -> None:
    """Tensors to ``NAME.rROUND.safetensors`` first, then the JSON that points to it (the
    commit point), then older tensor files are removed. No pickle anywhere."""
    tensors = {f"global.{k}": v for k, v in ts.global_state.items()}
    if ts.control is not None:
        tensors.update({f"control.{k}": v for k, v in ts.control.items()})
    for c, st in ts.client_controls.items():
        tensors.update({f"ccontrol.{c}.{k}": v for k, v in st.items()})
    tensors.update({f"strategy.{k}": v for k, v in strategy.state_tensors().items()})
    fname = f"{name}.r{ts.round}.safetensors"
    _save_tensors(ckdir / fname, tensors)
    meta = {"round": ts.round, "tensors": fname, "done": ts.done, "records": ts.records,
            "elapsed": ts.elapsed, "client_controls": sorted(ts.client_controls),
            "scaffold": ts.control is not None, "strategy": strategy.state_json()}
    _write_text(ckdir / f"{name}.json", json.dumps(meta, sort_keys=True))
    for old in ckdir.glob(f"{name}.r*.safetensors"):
        if old.name != fname:
            old.unlink(missing_ok=True)


def load_checkpoint(ckdir: Path, name: str, strategy) -> TrackState | None:
    meta_path = ckdir / f"{name}.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        tensors = _load_tensors(ckdir / meta["tensors"])
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"checkpoint {meta_path} is unreadable ({exc}); rerun with --force"
                         ) from None

    def part(prefix: str) -> dict[str, torch.Tensor]:
        return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}

    strategy.load_state_tensors(part("strategy."), meta.get("strategy", {}))
    return TrackState(round=meta["round"], global_state=part("global."),
                      control=part("control.") if meta["scaffold"] else None,
                      client_controls={int(c): part(f"ccontrol.{c}.")
                                       for c in meta["client_controls"]},
                      records=meta["records"], elapsed=meta["elapsed"], done=meta["done"])


# ---------------------------------------------------------------- the engine


@dataclass
class RunResult:
    out: Path
    records: list[dict]
    summary: dict[str, dict[str, float]]


def prepare_out(cfg: RunConfig, out: Path, resume: bool, force: bool) -> bool:
    """Check the run directory; returns True when resuming an existing run. A directory holding
    a different run (or other files) is refused unless ``force`` (which replaces our files)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    existing = out / "config.json"
    if resume and existing.is_file():
        try:
            old = json.loads(existing.read_text())
        except ValueError:
            raise InputError(f"{existing} is unreadable; rerun with --force") from None
        old.pop("out", None)
        # keys added in later versions read as their defaults, so older runs still resume
        old = {**{f.name: f.default for f in fields(RunConfig) if f.name in cfg.identity()
                  and f.default is not MISSING}, **old}
        if old != json.loads(json.dumps(cfg.identity())):
            diff = sorted(k for k in set(old) | set(cfg.identity())
                          if old.get(k) != json.loads(json.dumps(cfg.identity().get(k))))
            raise InputError(f"{out} holds a different run (differs in {', '.join(diff[:3])}); "
                             "use the same settings with --resume, or --force to replace it")
        return True
    if out.exists():
        # temporary files of a killed earlier run are ours: removed, never a reason to refuse
        for stray in out.iterdir():
            if is_temp_name(stray.name) and stray.is_file() and not stray.is_symlink():
                stray.unlink(missing_ok=True)
    if out.exists() and any(p.name != RUN_LOCK for p in out.iterdir()):
        if not force:
            raise InputError(f"{out} is not empty; choose a new directory, --resume a run "
                             "there, or pass --force to replace it")
        ours = set(RUN_FILES) | {"ckpt"}
        others = [p.name for p in out.iterdir() if p.name not in ours | {RUN_LOCK}]
        if others:
            raise InputError(f"{out} holds files that are not a run's ({others[0]}, ...); "
                             "refusing to replace it")
        for name in ours:
            p = out / name
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
    return False


def run(cfg: RunConfig, out: str | Path | None = None, resume: bool = False,
        force: bool = False, progress: bool = False, device: str | None = None,
        on_record: Callable[[dict], None] | None = None, halt_after: int | None = None,
        on_warning: Callable[[str], None] | None = None,
        on_updates: Callable[..., None] | None = None) -> RunResult:
    """Run every (seed, method) of ``cfg`` and write the run directory.

    on_record : called with each metrics row as it is written.
    on_warning : called with a strategy's first warning of each (seed, method) track.
    on_updates : called as ``(seed, method, round, start_state, updates, federation)`` with
        each round's client updates as the server sees them (after DP), e.g. to export what
        a pilot party receives.
    halt_after : stop (as if killed) after this many rounds in total have been checkpointed;
        for testing resumption.
    """

    cfg.validate()
    out = Path(out or cfg.out or "")
    if not str(out) or str(out) == ".":
        raise InputError("no output directory: give --out (or 'out' in the config file)")
    feds = {cfg.seeds[0]: prepare_run(cfg, cfg.seeds[0])}  # bad data fails before any write
    _check_target_fits(cfg, feds[cfg.seeds[0]])
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory; choose another --out")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        with locked_dir(out):
            return _run_locked(cfg, out, feds, resume, force, progress, device,
                               _Hooks(None, on_record, on_warning, on_updates), halt_after)
    finally:
        if made and [p.name for p in out.iterdir()] == [RUN_LOCK]:  # refused: leave nothing
            (out / RUN_LOCK).unlink(missing_ok=True)
            out.rmdir()


def _run_locked(cfg: RunConfig, out: Path, feds: dict, resume: bool, force: bool,
                progress: bool, device: str | None, given: _Hooks, halt_after: int | None
                ) -> RunResult:
    """:func:`run` once the run directory is locked."""
    from mrtf.federated.report import render

    resuming = prepare_out(cfg, out, resume, force)
    ckdir = out / "ckpt"
    ckdir.mkdir(exist_ok=True)
    if not resuming:
        _write_text(out / "config.json", json.dumps(cfg.to_dict(), indent=2, sort_keys=True))
        _write_text(out / "config.toml", to_toml(cfg.to_dict()))
    dev = pick_device(device)
    bar = None
    if progress:  # a bar on a terminal, plain lines in a log
        bar = progress_bar(len(cfg.seeds) * len(cfg.methods) * cfg.rounds, "simulate", "round")
    all_records: dict[str, list[dict]] = {}
    counter = {"rounds": 0}
    try:
        for seed in cfg.seeds:
            fed = feds.pop(seed, None) or prepare_run(cfg, seed)
            for method in cfg.methods:
                name = track_name(seed, method)
                hooks = _Hooks(bar, given.on_record, given.on_warning, given.on_updates)
                recs = _run_track(cfg, fed, seed, method, ckdir, name, dev, hooks, counter,
                                  halt_after, all_records, out)
                all_records[name] = recs
                if recs is None:
                    return RunResult(out, _flat(all_records), {})
    finally:
        if bar is not None:
            bar.close()
    records = _flat(all_records)
    _write_metrics_jsonl(out, records)
    summary = render(out, records)
    return RunResult(out, records, summary)


@dataclass
class _Hooks:
    """A track's ways to report: progress bar, metrics rows, the first strategy warning."""

    bar: Any = None
    on_record: Callable[[dict], None] | None = None
    on_warning: Callable[[str], None] | None = None
    on_updates: Callable[..., None] | None = None
    warned: bool = False

    def warn(self, lines: list[str], seed: int) -> None:
        if lines and self.on_warning and not self.warned:
            self.warned = True
            self.on_warning(f"seed {seed}, {lines[0]}")


def _flat(all_records: dict[str, list[dict] | None]) -> list[dict]:
    return [r for recs in all_records.values() if recs for r in recs]


def _write_metrics_jsonl(out: Path, records: list[dict]) -> None:
    _write_text(out / "metrics.jsonl", "".join(json.dumps(r, sort_keys=True) + "\n"
                                               for r in records))


def _check_target_fits(cfg: RunConfig, fed: Federation) -> None:
    from mrtf.models import build_model

    model = build_model(cfg.arch, fed.num_classes, **fed.arch_kwargs).eval()
    try:
        with torch.inference_mode():
            logits = model(fed.target_x[:1])
    except (RuntimeError, ValueError, IndexError, TypeError) as exc:
        raise InputError(f"target images of shape {tuple(fed.target_x.shape[1:])} do not fit "
                         f"the {cfg.arch} models ({first_line(exc)})") from None
    if logits.shape[-1] != fed.num_classes:
        raise InputError("the target does not fit the source's models")


def _train_clients(cfg: RunConfig, fed: Federation, ts: TrackState, strategy, model,
                   chosen: list[int], rnd: int, seed: int, dev: torch.device
                   ) -> list[ClientUpdate]:
    """One round's client updates (FedAvg/FedProx/SCAFFOLD or the strategy's own), with DP
    clipping and noise applied before the server sees them; updates SCAFFOLD's c in ``ts``."""
    local = cfg.local_config()
    scaffold = cfg.local_algorithm == "scaffold"
    updates: list[ClientUpdate] = []
    delta_c: list[dict[str, torch.Tensor]] = []
    for k in chosen:
        s = sub_seed(seed, rnd, k, "local")
        torch.manual_seed(s)  # dropout and anything else on the global RNG
        idx = torch.from_numpy(fed.parts[k])
        x, y = fed.x[idx], fed.y[idx]
        res = strategy.client_update(rnd, k, model, x, y, local, s)
        if res is None:
            ctrl = None
            if scaffold:
                ck = ts.client_controls.get(k)
                ctrl = {n: ts.control[n] - (ck[n] if ck else 0.0) for n in ts.control}
            res = local_train(model, x, y, fed.num_classes, local, seed=s, device=dev,
                              control=ctrl)
            if scaffold:
                delta_c.append(_scaffold_client(ts, k, model, res.model, local, len(x)))
        state = {n: v.detach().cpu().clone() for n, v in res.model.state_dict().items()}
        if cfg.dp_sigma > 0 or cfg.dp_clip > 0:
            gen = torch.Generator().manual_seed(sub_seed(seed, rnd, k, "dp"))
            state = privatize(ts.global_state, state, cfg.dp_sigma, cfg.dp_clip, gen)
        updates.append(ClientUpdate(k, state, res.n_samples, res.label_counts,
                                    res.train_loss))
    if scaffold and delta_c:
        for n in ts.control:  # c ← c + (1/N) Σ_{k∈S} Δc_k
            ts.control[n] = ts.control[n] + sum(d[n] for d in delta_c) / cfg.clients
    return updates


def _score(ctx, agg, fed: Federation, dev: torch.device) -> dict[str, float | None]:
    """Accuracy on the target of every model and prediction the strategy reports."""
    scores: dict[str, float | None] = dict.fromkeys(SCORES)
    local_tests = fed.test_parts is not None
    # a model is built only where it is used: target accuracy not given by predictions,
    # or the clients' local test parts
    models = {col: ctx.build(st) for col, st in agg.states.items()
              if col not in agg.probs or local_tests}
    for col, model in models.items():
        if col not in agg.probs:
            scores[col] = accuracy(model, fed.target_x, fed.target_y, device=dev)
    y_np = fed.target_y.numpy()
    for col, probs in agg.probs.items():
        scores[col] = float((np.asarray(probs).argmax(1) == y_np).mean())
    if local_tests:
        scores.update(_local_scores(models, agg.primary, fed, dev))
    return scores


def _local_scores(models: dict, primary: str, fed: Federation, dev: torch.device
                  ) -> dict[str, float | None]:
    """FedKF's AMP / FM / WLP of every model on the clients' local test parts: ``amp`` etc.
    for the method's own model, ``amp_<column>`` for each model scored (e.g. OCA and ACA)."""
    sizes = np.array([len(a) + len(b) for a, b in zip(fed.parts, fed.test_parts)])
    out: dict[str, float | None] = {}
    for col, model in models.items():
        accs = client_accuracies(model, fed.x, fed.y, fed.test_parts, dev)
        for name, value in fairness_metrics(accs, sizes).items():
            out[f"{name}_{col}"] = value
    for name in LOCAL_METRICS:
        out[name] = out.get(f"{name}_{primary}")
    return out


def _run_track(cfg: RunConfig, fed: Federation, seed: int, method: str, ckdir: Path,
               name: str, dev: torch.device, hooks: _Hooks, counter: dict,
               halt_after: int | None, all_records: dict, out: Path) -> list[dict] | None:
    from mrtf.io.hdf5 import ArraySource
    from mrtf.models import build_model

    c, h, w = fed.x.shape[1:]
    sizes = [len(p) for p in fed.parts]
    ctx = ServerContext(arch=cfg.arch, num_classes=fed.num_classes,
                        arch_kwargs=fed.arch_kwargs, image_shape=(int(c), int(h), int(w)),
                        target=ArraySource(fed.target_x.numpy()), client_sizes=sizes,
                        seed=seed, device=dev, settings=cfg.settings())
    strategy = make_strategy(method, ctx)
    sim = cfg.simulation(seed)
    scaffold = cfg.local_algorithm == "scaffold"
    torch.manual_seed(seed)  # the same initial model for every method of this seed
    model = build_model(cfg.arch, fed.num_classes, **fed.arch_kwargs)
    ts = load_checkpoint(ckdir, name, strategy)
    bar = hooks.bar
    if ts is None:
        init = {k: v.detach().clone() for k, v in model.state_dict().items()}
        strategy.initialize(init)
        control = {k: torch.zeros_like(p) for k, p in model.named_parameters()} \
            if scaffold else None
        ts = TrackState(0, init, control, {}, [], 0.0)
    if bar is not None:
        bar.update(ts.round)
        bar.set_description(f"seed {seed} {method}")
    if ts.done:
        return ts.records
    for rnd in range(ts.round, cfg.rounds):
        t0 = time.perf_counter()
        chosen = sorted(np.random.default_rng([seed, rnd, 17]).choice(
            cfg.clients, size=sim.per_round, replace=False).tolist())
        model.load_state_dict(ts.global_state)
        start_state = ts.global_state
        updates = _train_clients(cfg, fed, ts, strategy, model, chosen, rnd, seed, dev)
        if hooks.on_updates:
            hooks.on_updates(seed, method, rnd, start_state, updates, fed)
        evaluate = (rnd + 1) % cfg.eval_every == 0 or rnd == cfg.rounds - 1
        agg = strategy.aggregate(rnd, ts.global_state, updates, evaluate)
        hooks.warn(agg.warnings, seed)
        ts.global_state = {k: v.detach().cpu().clone() for k, v in agg.state.items()}
        ts.round = rnd + 1
        seconds = time.perf_counter() - t0
        ts.elapsed += seconds
        losses = [u.train_loss for u in updates if np.isfinite(u.train_loss)]
        if evaluate:
            scores = _score(ctx, agg, fed, dev)
            rec = {"seed": seed, "method": method, "round": rnd + 1,
                   "accuracy": scores[agg.primary], **scores,
                   "local_loss": float(np.mean(losses)) if losses else None,
                   "seconds": round(seconds, 4), "elapsed": round(ts.elapsed, 4)}
            ts.records.append(rec)
            ts.done = ts.round == cfg.rounds
            save_checkpoint(ckdir, name, ts, strategy)
            all_records[name] = ts.records
            _write_metrics_jsonl(out, _flat(all_records))
            if hooks.on_record:
                hooks.on_record(rec)
            if bar is not None:
                bar.set_postfix(round=rnd + 1, accuracy=f"{rec['accuracy']:.4f}", refresh=False)
        if bar is not None:
            bar.update(1)
        counter["rounds"] += 1
        if halt_after is not None and counter["rounds"] >= halt_after and not ts.done:
            return None
    return ts.records


def _scaffold_client(ts: TrackState, k: int, start: torch.nn.Module, trained: torch.nn.Module,
                     local: LocalConfig, n: int) -> dict[str, torch.Tensor]:
    """SCAFFOLD option II: c_k⁺ = c_k − c + (θ_t − θ_k)/(K_steps·η_eff); returns Δc_k.

    η_eff = lr / (1 − momentum): with heavy-ball momentum the local SGD moves about that far
    per unit gradient, and dividing by the bare lr overstates the gradient (×10 at 0.9), which
    makes the control variates blow up."""
    batch = min(local.batch_size, n)
    steps = local.steps or local.epochs * max(1, int(np.ceil(n / batch)))
    eff_lr = local.lr / (1.0 - local.momentum)
    start_p = dict(start.named_parameters())
    new_p = dict(trained.named_parameters())
    old = ts.client_controls.get(k) or {n_: torch.zeros_like(v) for n_, v in ts.control.items()}
    new = {n_: (old[n_] - ts.control[n_] + (start_p[n_].detach().cpu()
                                          - new_p[n_].detach().cpu()) / (steps * eff_lr))
           for n_ in ts.control}
    ts.client_controls[k] = new
    return {n_: new[n_] - old[n_] for n_ in new}
