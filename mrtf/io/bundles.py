"""Received-model bundles: one party = one ``.safetensors`` file with ``mrtf.*`` metadata.

A plain ``.pt`` state dict with a ``.json`` sidecar of the same keys is also read, with
``torch.load(weights_only=True)`` only. Received files are untrusted: nothing in them is
unpickled or executed, and a ``module:factory`` architecture named in a file is refused unless
the caller lists it in ``trusted_archs``.
"""

from __future__ import annotations

import json
import math
import os
import pickle
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from torch import nn

from mrtf.errors import InputError
from mrtf.io.atomic import atomic_path
from mrtf.models import build_model

ROLES = ("local", "global", "refined")
_META_KEYS = ("arch", "arch_kwargs", "num_classes", "party", "label_counts", "n_samples",
              "train_loss", "round", "role")


@dataclass
class BundleMeta:
    """What a party says about its model (the ``mrtf.*`` header keys)."""

    arch: str
    num_classes: int
    arch_kwargs: dict[str, Any] = field(default_factory=dict)
    party: str | None = None
    label_counts: list[int] | None = None
    n_samples: int | None = None
    train_loss: float | None = None
    round: int | None = None
    role: str = "local"
    extra: dict[str, str] = field(default_factory=dict)

    def to_header(self) -> dict[str, str]:
        """String-valued safetensors ``__metadata__``."""
        head = {"mrtf.arch": self.arch, "mrtf.num_classes": str(self.num_classes),
                "mrtf.arch_kwargs": json.dumps(self.arch_kwargs, sort_keys=True),
                "mrtf.role": self.role}
        for key in ("party", "n_samples", "train_loss", "round"):
            value = getattr(self, key)
            if value is not None:
                head[f"mrtf.{key}"] = repr(value) if isinstance(value, float) else str(value)
        if self.label_counts is not None:
            head["mrtf.label_counts"] = json.dumps([int(c) for c in self.label_counts])
        head.update({k if k.startswith("mrtf.") else f"mrtf.{k}": v
                     for k, v in self.extra.items()})
        return head

    @classmethod
    def from_header(cls, head: dict[str, str], source: str) -> BundleMeta:
        """Parse and type-check the header; raises InputError naming ``source``."""
        def bad(why: str) -> InputError:
            return InputError(f"{source}: {why}")

        if "mrtf.arch" not in head or "mrtf.num_classes" not in head:
            raise bad("metadata lacks mrtf.arch or mrtf.num_classes (not an mrtf bundle)")
        try:
            meta = cls(
                arch=str(head["mrtf.arch"]),
                num_classes=int(head["mrtf.num_classes"]),
                arch_kwargs=json.loads(head.get("mrtf.arch_kwargs", "{}")),
                party=head.get("mrtf.party"),
                label_counts=(json.loads(head["mrtf.label_counts"])
                              if "mrtf.label_counts" in head else None),
                n_samples=int(head["mrtf.n_samples"]) if "mrtf.n_samples" in head else None,
                train_loss=(float(head["mrtf.train_loss"])
                            if "mrtf.train_loss" in head else None),
                round=int(head["mrtf.round"]) if "mrtf.round" in head else None,
                role=head.get("mrtf.role", "local"),
                extra={k: str(v) for k, v in head.items()
                       if k.startswith("mrtf.") and k[5:] not in _META_KEYS},
            )
        except (ValueError, TypeError) as exc:
            raise bad(f"malformed metadata: {exc}") from None
        meta.validate(source)
        return meta

    def validate(self, source: str) -> None:
        if not isinstance(self.arch_kwargs, dict):
            raise InputError(f"{source}: mrtf.arch_kwargs must be a JSON object")
        if self.num_classes < 2:
            raise InputError(f"{source}: mrtf.num_classes must be >= 2, got {self.num_classes}")
        if self.role not in ROLES:
            raise InputError(f"{source}: mrtf.role must be one of {ROLES}, got {self.role!r}")
        if self.label_counts is not None:
            lc = self.label_counts
            if (not isinstance(lc, list) or len(lc) != self.num_classes
                    or not all(isinstance(c, int) and c >= 0 for c in lc)):
                raise InputError(
                    f"{source}: mrtf.label_counts must be {self.num_classes} non-negative "
                    f"integers (one per class), got {str(lc)[:80]}")
        if self.train_loss is not None and not math.isfinite(self.train_loss):
            raise InputError(f"{source}: mrtf.train_loss is not finite")
        if self.n_samples is not None and self.n_samples < 0:
            raise InputError(f"{source}: mrtf.n_samples is negative")


@dataclass
class ReceivedModel:
    """One validated party model: its metadata, its weights and where it came from."""

    path: Path
    meta: BundleMeta
    state_dict: dict[str, torch.Tensor]

    @property
    def name(self) -> str:
        return self.meta.party or self.path.stem

    def build(self, device: torch.device | str = "cpu") -> nn.Module:
        """A fresh module with these weights, in eval mode."""
        model = build_model(self.meta.arch, self.meta.num_classes, **self.meta.arch_kwargs)
        model.load_state_dict(self.state_dict)
        return model.to(device).eval()


def save_bundle(path: str | os.PathLike, model: nn.Module | dict[str, torch.Tensor],
                meta: BundleMeta) -> Path:
    """Write ``model`` (a module or a state dict) with ``meta`` as a ``.safetensors`` bundle.

    The file is written beside the target and renamed into place.
    """
    state = model.state_dict() if isinstance(model, nn.Module) else model
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    meta.validate(str(path))
    out = Path(path)
    with atomic_path(out) as tmp:
        save_file(tensors, str(tmp), metadata=meta.to_header())
    return out


def load_bundle(path: str | os.PathLike, trusted_archs: Collection[str] = ()) -> ReceivedModel:
    """Read and validate one bundle (``.safetensors`` or ``.pt`` + ``.json`` sidecar).

    Validation: known architecture (custom ``module:factory`` only if in ``trusted_archs``),
    state dict matches the architecture key for key and shape for shape, all values finite,
    label counts of the right length. Raises InputError naming the file and the reason.
    """
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if not p.is_file():
        raise InputError(f"{p}: not a file")
    if p.suffix == ".safetensors":
        head, state = _read_safetensors(p)
    elif p.suffix == ".pt":
        head, state = _read_pt(p)
    else:
        raise InputError(f"{p}: unknown model file type (expected .safetensors or .pt + .json)")
    meta = BundleMeta.from_header(head, str(p))
    if ":" in meta.arch and meta.arch not in trusted_archs:
        raise InputError(
            f"{p}: custom architecture {meta.arch!r} is code; received files may not run code "
            "(trust it explicitly with --trust-arch)")
    check_state(p, meta, state)
    return ReceivedModel(path=p, meta=meta, state_dict=state)


def check_state(p: Path, meta: BundleMeta, state: dict[str, torch.Tensor]) -> None:
    """State dict vs. architecture: same keys, same shapes, finite values."""
    try:
        ref = build_model(meta.arch, meta.num_classes, **meta.arch_kwargs).state_dict()
    except InputError as exc:
        raise InputError(f"{p}: {exc}") from None
    missing, unexpected = sorted(set(ref) - set(state)), sorted(set(state) - set(ref))
    if missing or unexpected:
        what = [f"missing {', '.join(missing[:3])}" if missing else "",
                f"unexpected {', '.join(unexpected[:3])}" if unexpected else ""]
        raise InputError(f"{p}: weights do not match {meta.arch!r}: "
                         + "; ".join(w for w in what if w))
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(ref[key].shape):
            raise InputError(f"{p}: {key} has shape {tuple(tensor.shape)}, {meta.arch!r} with "
                             f"{meta.num_classes} classes needs {tuple(ref[key].shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise InputError(f"{p}: {key} holds NaN or infinite values")


def _read_safetensors(p: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    try:
        with safe_open(str(p), framework="pt") as f:
            head = dict(f.metadata() or {})
        state = load_file(str(p))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise InputError(f"{p}: corrupt or truncated safetensors file ({_first_line(exc)})"
                         ) from None
    return head, state


def _read_pt(p: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    sidecar = p.with_suffix(".json")
    if not sidecar.exists():
        raise InputError(f"{p}: a .pt model needs a {sidecar.name} sidecar with its mrtf.* keys")
    try:
        raw = json.loads(sidecar.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{sidecar}: unreadable JSON ({_first_line(exc)})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{sidecar}: must hold a JSON object")
    head = {(k if k.startswith("mrtf.") else f"mrtf.{k}"):
            (v if isinstance(v, str) else json.dumps(v)) for k, v in raw.items()}
    try:
        # weights_only=True: the unpickler accepts tensors and plain containers only, so a
        # pickle carrying code is refused before anything in it runs.
        state = torch.load(str(p), map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError,
            AttributeError, TypeError) as exc:
        raise InputError(f"{p}: refused to load ({_first_line(exc)})") from None
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise InputError(f"{p}: not a state dict of named tensors")
    return head, state


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:160] if text else type(exc).__name__


@dataclass
class ReceivedSet:
    """All valid models of a received directory, and the files refused with reasons."""

    models: list[ReceivedModel]
    refused: list[tuple[Path, str]]

    @property
    def num_classes(self) -> int:
        return self.models[0].meta.num_classes

    def by_role(self, role: str) -> list[ReceivedModel]:
        return [m for m in self.models if m.meta.role == role]


def model_files(directory: str | os.PathLike) -> list[Path]:
    """The model files of a received directory, sorted by name."""
    d = Path(directory)
    if not d.exists():
        raise InputError(f"{d}: no such directory")
    if not d.is_dir():
        raise InputError(f"{d}: not a directory of received models")
    return sorted(f for f in d.iterdir() if f.suffix in (".safetensors", ".pt") and f.is_file())


def load_received(directory: str | os.PathLike, trusted_archs: Collection[str] = (),
                  strict: bool = True) -> ReceivedSet:
    """Load every model in ``directory``; check that all agree on the class count.

    ``strict`` (default) raises on the first bad file; otherwise bad files are listed in
    ``refused`` (what ``mrtf inspect`` shows).
    """
    files = model_files(directory)
    models: list[ReceivedModel] = []
    refused: list[tuple[Path, str]] = []
    for f in files:
        try:
            models.append(load_bundle(f, trusted_archs))
        except InputError as exc:
            if strict:
                raise
            refused.append((f, str(exc).removeprefix(f"{f}: ")))
    if strict and not models:
        raise InputError(f"{directory}: holds no received models (.safetensors or .pt)")
    classes = {m.meta.num_classes for m in models}
    if len(classes) > 1:
        detail = ", ".join(f"{m.path.name}={m.meta.num_classes}" for m in models)
        raise InputError(f"{directory}: parties disagree on the class count ({detail})")
    return ReceivedSet(models=models, refused=refused)


def check_same_classes(models: Sequence[ReceivedModel], num_classes: int, what: str) -> None:
    """Raise if any model's class count differs from ``num_classes`` (e.g. a --student file)."""
    for m in models:
        if m.meta.num_classes != num_classes:
            raise InputError(f"{what} has {num_classes} classes but {m.path.name} has "
                             f"{m.meta.num_classes}")
