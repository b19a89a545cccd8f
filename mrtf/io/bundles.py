"""Received-model bundles: one party = one ``.safetensors`` file with ``mrtf.*`` metadata.

A plain ``.pt`` state dict with a ``.json`` sidecar of the same keys is also read, with
``torch.load(weights_only=True)`` only; an ``.onnx`` graph teaches (mrtf/io/onnx_files.py).
Received files are untrusted: nothing in them is unpickled or executed, and a
``module:factory`` architecture named in a file is refused unless the caller lists it in
``trusted_archs``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save
from torch import nn

from mrtf.errors import InputError, clip, printable
from mrtf.io.atomic import atomic_path
from mrtf.io.limits import (
    MAX_CLASSES,
    MAX_COUNT,
    MAX_LOSS,
    MAX_ROUND,
    bounded_float,
    bounded_int,
    check_name,
    check_received_size,
    check_regular_file,
    reference_shapes,
)
from mrtf.io.onnx_files import CheckedOnnx, read_onnx
from mrtf.io.readers import first_line, load_safetensors, peek_safetensors, read_pt
from mrtf.io.weights import check_against_reference, normalise_weights
from mrtf.models import build_model

ROLES = ("local", "global", "refined")
_META_KEYS = ("arch", "arch_kwargs", "num_classes", "party", "label_counts", "n_samples",
              "train_loss", "round", "role", "round_base")
#: files count rounds from 1, as the papers and the console do (``mrtf.round_base = 1``);
#: files without the key are older, 0-based ones. In memory ``BundleMeta.round`` stays
#: 0-based (what the refinery and the fusion compare); :attr:`BundleMeta.round_number` is
#: the round as printed.
ROUND_BASE = 1


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
    round: int | None = None  # 0-based in memory; files say round + 1 (see ROUND_BASE)
    role: str = "local"
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def round_number(self) -> int | None:
        """The round as people count it (1 = the first round), as printed everywhere."""
        return None if self.round is None else self.round + ROUND_BASE

    def to_header(self) -> dict[str, str]:
        """String-valued safetensors ``__metadata__``."""
        head = {"mrtf.arch": self.arch, "mrtf.num_classes": str(self.num_classes),
                "mrtf.arch_kwargs": json.dumps(self.arch_kwargs, sort_keys=True),
                "mrtf.role": self.role}
        for key in ("party", "n_samples", "train_loss"):
            value = getattr(self, key)
            if value is not None:
                head[f"mrtf.{key}"] = repr(value) if isinstance(value, float) else str(value)
        if self.round is not None:
            head["mrtf.round"] = str(self.round_number)
            head["mrtf.round_base"] = str(ROUND_BASE)
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
                num_classes=_int(head["mrtf.num_classes"]),
                arch_kwargs=json.loads(head.get("mrtf.arch_kwargs", "{}")),
                party=head.get("mrtf.party"),
                label_counts=(json.loads(head["mrtf.label_counts"])
                              if "mrtf.label_counts" in head else None),
                n_samples=_int(head["mrtf.n_samples"]) if "mrtf.n_samples" in head else None,
                train_loss=(float(head["mrtf.train_loss"])
                            if "mrtf.train_loss" in head else None),
                round=_read_round(head),
                role=head.get("mrtf.role", "local"),
                extra={k: str(v) for k, v in head.items()
                       if k.startswith("mrtf.") and k[5:] not in _META_KEYS},
            )
        except (ValueError, TypeError, RecursionError) as exc:
            raise bad(f"malformed metadata: {first_line(exc)}") from None
        meta.validate(source)
        return meta

    def validate(self, source: str) -> None:
        """Types and bounds of every field; raises InputError naming ``source``."""
        try:
            self._validate()
        except InputError as exc:
            raise InputError(f"{source}: {exc}") from None

    def _validate(self) -> None:
        for key in ("party", "arch"):
            check_name(getattr(self, key), f"mrtf.{key}")
        if not isinstance(self.arch_kwargs, dict):
            raise InputError("mrtf.arch_kwargs must be a JSON object")
        bounded_int(self.num_classes, "mrtf.num_classes", 2, MAX_CLASSES)
        if self.role not in ROLES:
            raise InputError(f"mrtf.role must be one of {ROLES}, got {str(self.role)[:40]!r}")
        if self.label_counts is not None:
            lc = self.label_counts
            if (not isinstance(lc, list) or len(lc) != self.num_classes
                    or not all(isinstance(c, int) and not isinstance(c, bool)
                               and 0 <= c <= MAX_COUNT for c in lc)):
                raise InputError(
                    f"mrtf.label_counts must be {self.num_classes} integers in [0, "
                    f"{MAX_COUNT:.0e}] (one per class), got {clip(str(lc), 80)}")
            if sum(lc) == 0:
                raise InputError("mrtf.label_counts are all zero (a party that trained on "
                                 "no samples)")
        if self.n_samples is not None:
            bounded_int(self.n_samples, "mrtf.n_samples", 1, MAX_COUNT)
            if self.label_counts is not None and sum(self.label_counts) != self.n_samples:
                raise InputError(f"mrtf.n_samples ({self.n_samples}) disagrees with the sum of "
                                 f"mrtf.label_counts ({sum(self.label_counts)})")
        if self.train_loss is not None:
            bounded_float(self.train_loss, "mrtf.train_loss", 0.0, MAX_LOSS)
        if self.round is not None:
            bounded_int(self.round, "mrtf.round", 0, MAX_ROUND)


def _read_round(head: dict[str, str]) -> int | None:
    """``mrtf.round`` as the 0-based round in memory: files with ``mrtf.round_base = 1``
    count from 1; older files without the key counted from 0."""
    if "mrtf.round" not in head:
        return None
    base = _int(head.get("mrtf.round_base", "0"))
    if base not in (0, 1):
        raise ValueError(f"mrtf.round_base must be 0 or 1, got {base}")
    value = _int(head["mrtf.round"])
    if value < base:
        raise ValueError(f"mrtf.round must be >= {base} (rounds counted from {base}), got "
                         f"{value}")
    return value - base


def _int(text: str) -> int:
    """An integer header value; at most 30 digits (Python's int() of a 10^400 string works,
    and then overflows as soon as it meets a float)."""
    text = str(text).strip()
    if len(text) > 30:
        raise ValueError(f"integer of {len(text)} characters is out of range")
    return int(text)


@dataclass
class ReceivedModel:
    """One validated party model: its metadata, its weights and where it came from.

    ``notes`` says what was converted on load (e.g. float16 weights to float32).
    """

    path: Path
    meta: BundleMeta
    state_dict: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)
    onnx: CheckedOnnx | None = None  # an .onnx file's graph: it only teaches, no state_dict

    @property
    def name(self) -> str:
        return self.meta.party or self.path.stem

    def build(self, device: torch.device | str = "cpu") -> nn.Module:
        """A fresh module with these weights, in eval mode (ONNX: its onnxruntime teacher)."""
        if self.onnx is not None:
            return self.onnx.teacher(self.meta.num_classes)
        model = build_model(self.meta.arch, self.meta.num_classes, **self.meta.arch_kwargs)
        model.load_state_dict(self.state_dict)
        return model.to(device).eval()


def save_bundle(path: str | os.PathLike, model: nn.Module | dict[str, torch.Tensor],
                meta: BundleMeta, atomic: bool = True, require_finite: bool = False) -> Path:
    """Write ``model`` (a module or a state dict) with ``meta`` as a ``.safetensors`` bundle.

    The file is written beside the target and renamed into place (``atomic=False``: ``path``
    is already a temporary file). With ``require_finite`` (the CLI's outputs), weights that
    are not finite are refused: such a model could not be received again. (Tests write
    broken bundles on purpose, hence the default.)
    """
    state = model.state_dict() if isinstance(model, nn.Module) else model
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state.items()}
    meta.validate(str(path))
    for key, t in tensors.items() if require_finite else ():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise InputError(f"{path}: the model to write has NaN or infinite weights "
                             f"({key}); not written")
    # serialise in memory and write the bytes ourselves: safetensors' save_file keeps its
    # own temporary file, which a killed run would leave behind
    data = save(tensors, metadata=meta.to_header())
    out = Path(path)
    with atomic_path(out, atomic) as tmp:
        tmp.write_bytes(data)
    return out


def load_bundle(path: str | os.PathLike, trusted_archs: Collection[str] = ()) -> ReceivedModel:
    """Read and validate one bundle (``.safetensors`` or ``.pt`` + ``.json`` sidecar).

    Validation, in this order so that nothing big is built or read for a bad file: a regular
    file within the size cap; metadata types and bounds; known architecture (custom
    ``module:factory`` only if in ``trusted_archs``) of bounded size, built on the meta device;
    the file's keys, shapes and dtypes against it (from the safetensors header, before the
    weights are read); then the values (finite, bounded). Raises InputError naming the file.
    """
    p = Path(path)
    check_regular_file(p, "model file")
    if p.suffix == ".onnx":
        head, graph = read_onnx(p)
        return ReceivedModel(p, BundleMeta.from_header(head, str(p)), {}, graph.notes, graph)
    if p.suffix == ".safetensors":
        head, found = peek_safetensors(p)
        state = None
    elif p.suffix == ".pt":
        head, state = read_pt(p)
        found = {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    else:
        raise InputError(f"{p}: unknown model file type (not .safetensors, .pt+.json or .onnx)")
    meta = BundleMeta.from_header(head, str(p))
    if ":" in meta.arch and meta.arch not in trusted_archs:
        raise InputError(
            f"{p}: custom architecture {meta.arch!r} is code; received files may not run code "
            f"(your own model code? trust it explicitly with --trust-arch {meta.arch})")
    try:
        ref = reference_shapes(meta.arch, meta.num_classes, meta.arch_kwargs)
    except InputError as exc:
        raise InputError(f"{p}: {exc}") from None
    check_against_reference(p, meta.arch, meta.num_classes, found, ref)
    if state is None:
        state = load_safetensors(p)
    state, notes = normalise_weights(p, state, ref)
    return ReceivedModel(path=p, meta=meta, state_dict=state, notes=notes)


@dataclass
class ReceivedSet:
    """All valid models of a received directory, the files refused with reasons, and notes
    (entries skipped, conversions made) the caller should show."""

    models: list[ReceivedModel]
    refused: list[tuple[Path, str]]
    notes: list[str] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return self.models[0].meta.num_classes

    def by_role(self, role: str) -> list[ReceivedModel]:
        return [m for m in self.models if m.meta.role == role]


MODEL_SUFFIXES = (".safetensors", ".pt", ".onnx")


def scan_received(directory: str | os.PathLike
                  ) -> tuple[list[Path], list[tuple[Path, str]], list[str]]:
    """The entries of a received directory: (model files, refused entries, notes), by name.

    Links are never followed (a link could point at ``/dev/zero``, loop, or leave the
    directory and load another party's file twice) and only regular files are opened: a
    model-named entry that is a link, a FIFO, a device or a directory is refused. Hidden
    entries (temporary files of an interrupted copy) and ``.pt`` sidecars are ignored; any
    other entry is skipped with a note. Sub-directories are not searched.
    """
    d = Path(directory)
    if not d.exists():
        raise InputError(f"{d}: no such directory")
    if not d.is_dir():
        raise InputError(f"{d}: not a directory of received models")
    try:
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError as exc:
        raise InputError(f"{d}: cannot list ({exc.strerror})") from None
    names = {e.name for e in entries}
    files: list[Path] = []
    refused: list[tuple[Path, str]] = []
    notes: list[str] = []
    for e in entries:
        path, suffix = d / e.name, Path(e.name).suffix
        if e.name.startswith("."):
            continue
        if suffix == ".json" and names & {f"{Path(e.name).stem}{s}" for s in (".pt", ".onnx")}:
            continue  # a .pt's or .onnx's sidecar, read with it
        if e.is_symlink():
            why = "a symbolic link; received models must be regular files in the directory " \
                  "(links are not followed)"
        elif not e.name.isprintable():
            why = "its name holds control characters (a newline, a terminal escape)"
        elif e.is_file(follow_symlinks=False):
            if suffix in MODEL_SUFFIXES:
                files.append(path)
            else:
                notes.append(f"skipped {printable(e.name)} (not a .safetensors/.pt/.onnx model)")
            continue
        elif e.is_dir(follow_symlinks=False):
            why = "a directory (received directories are not searched recursively)"
        else:
            why = "not a regular file (a FIFO, socket or device)"
        if suffix in MODEL_SUFFIXES:
            refused.append((path, why))
        else:
            notes.append(f"skipped {printable(e.name)}: {why}")
    check_received_size(d, files)
    return files, refused, notes


def model_files(directory: str | os.PathLike) -> list[Path]:
    """The regular model files of a received directory, sorted by name."""
    return scan_received(directory)[0]


def headers_first(files: list[Path], refused: list[tuple[Path, str]], strict: bool) -> list:
    """The files whose safetensors header and claims pass, all read before any weights; the
    others go to ``refused``, or the first raises when ``strict``."""
    passed = []
    for f in files:
        try:
            if f.suffix == ".safetensors":
                BundleMeta.from_header(peek_safetensors(f)[0], str(f))
            passed.append(f)
        except InputError as exc:
            if strict:
                raise
            refused.append((f, str(exc).removeprefix(f"{f}: ")))
    return passed


def load_received(directory: str | os.PathLike, trusted_archs: Collection[str] = (),
                  strict: bool = True) -> ReceivedSet:
    """Load every model in ``directory``; check that all agree on the class count.

    ``strict`` (default) raises on the first bad file or entry; otherwise bad ones are listed
    in ``refused`` (what ``mrtf inspect`` shows).
    """
    files, refused, notes = scan_received(directory)
    if strict and refused:
        path, why = refused[0]
        raise InputError(f"{printable(path, 1000)}: {why}")
    models: list[ReceivedModel] = []
    for f in headers_first(files, refused, strict):
        try:
            models.append(load_bundle(f, trusted_archs))
        except InputError as exc:
            if strict:
                raise
            refused.append((f, str(exc).removeprefix(f"{f}: ")))
    refused.sort(key=lambda r: r[0].name)
    if strict and not models:
        raise InputError(f"{directory}: holds no received models (.safetensors, .pt, .onnx)")
    classes = {m.meta.num_classes for m in models}
    if len(classes) > 1:
        detail = ", ".join(f"{m.path.name}={m.meta.num_classes}" for m in models)
        raise InputError(f"{directory}: parties disagree on the class count ({detail})")
    notes += [f"{m.path.name}: {n}" for m in models for n in m.notes]
    return ReceivedSet(models=models, refused=refused, notes=notes)

