"""Simulate a FedAvg federation on a labeled dataset and export what a pilot party receives.

The server holds an unlabeled target set (a held-out part of the same dataset, in-domain);
K clients hold non-IID splits of the rest. Each round a fraction R of clients trains E epochs
from the global model and the server averages them (weighted by sample counts, the same
average ``mrtf refine --method fedavg`` computes from the exported files).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from mrtf.data import BUILTIN, load_dataset, parse_split, split_clients, train_target_split
from mrtf.device import pick_device
from mrtf.errors import InputError
from mrtf.federated.aggregate import average_states
from mrtf.federated.local import LocalConfig, LocalResult, accuracy, local_train
from mrtf.io.bundles import BundleMeta, save_bundle
from mrtf.io.hdf5 import write_dataset
from mrtf.models import build_model, image_kwargs


@dataclass
class SimulationConfig:
    """One federation. ``dataset`` is a built-in name or an .h5 file with ``y``."""

    dataset: str = "mnist5k"
    clients: int = 20
    split: str = "dirichlet:0.1"
    ratio: float = 0.2
    rounds: int = 1
    arch: str = "lenet"
    norm: str | None = None
    target_size: int = 1000
    image_size: int | None = None
    channels: int | None = None
    seed: int = 0
    local: LocalConfig = field(default_factory=LocalConfig)

    def validate(self) -> None:
        parse_split(self.split)
        if self.dataset not in BUILTIN and not Path(self.dataset).is_file():
            raise InputError(f"unknown dataset {self.dataset!r}; built-in: "
                             f"{', '.join(BUILTIN)}, or a path to an .h5 file")
        if self.clients < 1:
            raise InputError(f"--clients must be >= 1, got {self.clients}")
        if not 0 < self.ratio <= 1:
            raise InputError(f"--ratio must be in (0, 1], got {self.ratio}")
        if self.ratio * self.clients < 1:
            raise InputError(f"--ratio {self.ratio} × --clients {self.clients} selects no "
                             "client per round (R·K < 1)")
        if self.rounds < 1:
            raise InputError(f"--rounds must be >= 1, got {self.rounds}")

    @property
    def per_round(self) -> int:
        return max(1, int(round(self.ratio * self.clients)))


@dataclass
class Federation:
    """Prepared data: client index sets into (x, y), and the server's target set."""

    x: torch.Tensor
    y: torch.Tensor
    parts: list[np.ndarray]
    target_x: torch.Tensor
    target_y: torch.Tensor
    num_classes: int
    arch_kwargs: dict
    # each client's local test part (indices into x, y), when the run holds one out
    test_parts: list[np.ndarray] | None = None


@dataclass
class RoundRecord:
    round: int
    accuracy: float  # averaged model on the target set
    train_loss: float  # mean local loss of the round's clients
    seconds: float


@dataclass
class LastRound:
    """What the server holds after the final round: θ_t, the local models, θ_{t+1}."""

    round: int
    start_state: dict[str, torch.Tensor]
    clients: list[int]
    results: list[LocalResult]
    global_state: dict[str, torch.Tensor]


@dataclass
class SimulationResult:
    config: SimulationConfig
    records: list[RoundRecord]
    last: LastRound
    federation: Federation
    # client → (round, update): each party's latest model, for FedKF's OCA (--export-history)
    latest: dict[int, tuple[int, LocalResult]] = field(default_factory=dict)


def prepare_federation(cfg: SimulationConfig) -> Federation:
    """Load the dataset, cut off the target set, split the rest over the clients."""
    cfg.validate()
    ds = load_dataset(cfg.dataset, cfg.image_size, cfg.channels)
    train_idx, target_idx = train_target_split(len(ds.y), cfg.target_size, cfg.seed)
    y_train = ds.y[train_idx]
    num_classes = ds.num_classes
    parts = split_clients(y_train, cfg.clients, cfg.split, cfg.seed, num_classes)
    c, s = ds.x.shape[1], ds.x.shape[-1]
    return Federation(
        x=torch.from_numpy(ds.x[train_idx]), y=torch.from_numpy(y_train),
        parts=parts, target_x=torch.from_numpy(ds.x[target_idx]),
        target_y=torch.from_numpy(ds.y[target_idx]), num_classes=num_classes,
        arch_kwargs=image_kwargs(cfg.arch, c, s, cfg.norm),
    )


def run_fedavg(cfg: SimulationConfig, fed: Federation | None = None,
               on_round: Callable[[RoundRecord], None] | None = None,
               device: torch.device | str | None = None) -> SimulationResult:
    """Run ``cfg.rounds`` rounds of FedAvg; ``on_round`` sees each round's record."""
    fed = fed or prepare_federation(cfg)
    dev = pick_device(device)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.arch, fed.num_classes, **fed.arch_kwargs)
    global_state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(cfg.seed + 1)
    records: list[RoundRecord] = []
    last: LastRound | None = None
    latest: dict[int, tuple[int, LocalResult]] = {}
    for rnd in range(cfg.rounds):
        t0 = time.perf_counter()
        chosen = sorted(rng.choice(cfg.clients, size=cfg.per_round, replace=False).tolist())
        model.load_state_dict(global_state)
        results = []
        for k in chosen:
            idx = torch.from_numpy(fed.parts[k])
            results.append(local_train(model, fed.x[idx], fed.y[idx], fed.num_classes,
                                       cfg.local, seed=cfg.seed * 100_003 + rnd * 1009 + k,
                                       device=dev))
        new_state = average_states([r.model.state_dict() for r in results],
                                   [r.n_samples for r in results])
        last = LastRound(rnd, global_state, chosen, results, new_state)
        latest.update({k: (rnd, res) for k, res in zip(chosen, results)})
        global_state = new_state
        model.load_state_dict(global_state)
        acc = accuracy(model, fed.target_x, fed.target_y, device=dev)
        rec = RoundRecord(rnd, acc, float(np.mean([r.train_loss for r in results])),
                          time.perf_counter() - t0)
        records.append(rec)
        if on_round:
            on_round(rec)
    assert last is not None
    return SimulationResult(cfg, records, last, fed, latest)


def export_received(result: SimulationResult, directory: str | Path, force: bool = False,
                    history: bool = False) -> list[Path]:
    """Write the last round's local models (role ``local``) and its starting global model θ_t
    (role ``global``) as bundles into ``directory``.

    With ``history``, also the latest model of every other client that trained in an earlier
    round (with its ``mrtf.round``), as FedKF's OCA aggregation uses; the refinery only takes
    the newest round's local models as S_t.

    The files are written into a temporary folder beside it and renamed into place, so an
    interrupted export leaves nothing half-written. An existing non-empty ``directory`` is
    refused unless ``force`` (and then only if it holds nothing but model files).
    """
    out = Path(directory)
    check_received_dir(out, force)
    cfg, last, fed = result.config, result.last, result.federation
    base = dict(arch=cfg.arch, num_classes=fed.num_classes, arch_kwargs=fed.arch_kwargs,
                round=last.round, extra={"mrtf.simulation": _config_json(cfg)})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        names = []
        updates = {k: (last.round, res) for k, res in zip(last.clients, last.results)}
        if history:
            updates = {**result.latest, **updates}
        for k, (rnd, res) in sorted(updates.items()):
            meta = BundleMeta(**{**base, "round": rnd}, party=f"client-{k:03d}",
                              label_counts=res.label_counts, n_samples=res.n_samples,
                              train_loss=res.train_loss, role="local")
            save_bundle(tmp / f"client-{k:03d}.safetensors", res.model, meta)
            names.append(f"client-{k:03d}.safetensors")
        save_bundle(tmp / "global-start.safetensors", last.start_state,
                    BundleMeta(**base, party="server", role="global"))
        names.append("global-start.safetensors")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [out / n for n in names]


def check_received_dir(out: Path, force: bool) -> None:
    """Refuse a non-empty output directory unless ``force``; never delete non-model files."""
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not force:
            raise InputError(f"{out} is not empty; choose a new directory or pass --force")
        others = [f.name for f in out.iterdir() if f.suffix not in (".safetensors", ".pt",
                                                                     ".json")]
        if others:
            raise InputError(f"{out} holds files other than models ({others[0]}, ...); "
                             "refusing to replace it")


def export_target(result: SimulationResult, path: str | Path) -> Path:
    """Write the server's target set: ``x`` and ``y`` (for scoring only)."""
    fed = result.federation
    return write_dataset(path, fed.target_x.numpy(), fed.target_y.numpy(),
                         ids=np.arange(len(fed.target_y)),
                         attrs={"source": result.config.dataset})


def _config_json(cfg: SimulationConfig) -> str:
    import json

    return json.dumps(asdict(cfg), sort_keys=True)
