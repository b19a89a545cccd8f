"""Checkpoints of an evaluation run's tracks: a killed run resumes with the same metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mrtf.errors import InputError
from mrtf.io.atomic import atomic_path

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
    records: list[dict] = field(default_factory=list)
    elapsed: float = 0.0
    done: bool = False


def save_checkpoint(ckdir: Path, name: str, ts: TrackState, strategy, client) -> None:
    """Tensors to ``NAME.rROUND.safetensors`` first, then the JSON that points to it (the
    commit point), then older tensor files are removed. No pickle anywhere. ``strategy`` and
    ``client`` (the client algorithm: SCAFFOLD's control variates) add their own state."""
    tensors = {f"global.{k}": v for k, v in ts.global_state.items()}
    tensors.update(client.state_tensors())
    tensors.update({f"strategy.{k}": v for k, v in strategy.state_tensors().items()})
    fname = f"{name}.r{ts.round}.safetensors"
    _save_tensors(ckdir / fname, tensors)
    meta = {"round": ts.round, "tensors": fname, "done": ts.done, "records": ts.records,
            "elapsed": ts.elapsed, "scaffold": False, "client_controls": [],
            **client.state_json(), "strategy": strategy.state_json()}
    _write_text(ckdir / f"{name}.json", json.dumps(meta, sort_keys=True))
    for old in ckdir.glob(f"{name}.r*.safetensors"):
        if old.name != fname:
            old.unlink(missing_ok=True)


def load_checkpoint(ckdir: Path, name: str, strategy, client) -> TrackState | None:
    """The track's last checkpoint (restoring ``strategy``'s and ``client``'s state into
    them), or None when it has none."""
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
    if meta.get("scaffold"):
        client.load_state(tensors, meta)
    return TrackState(round=meta["round"], global_state=part("global."),
                      records=meta["records"], elapsed=meta["elapsed"], done=meta["done"])


