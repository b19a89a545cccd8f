"""Reading one received file without trusting it: the safetensors header before the
weights, a ``.pt`` only through torch's weights-only unpickler after a zip-size check."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import safe_open

from mrtf.errors import InputError, first_line, printable
from mrtf.io.limits import (
    MAX_HEADER_BYTES,
    MAX_SIDECAR_BYTES,
    check_regular_file,
    check_zip_sizes,
)
from mrtf.io.weights import ST_DTYPES

_SAFETENSORS_ERRORS = (SafetensorError, OSError, ValueError, RuntimeError, TypeError)


def check_safetensors_header(p: Path) -> None:
    """The safetensors header checked before the safetensors library parses it: its declared
    length within :data:`MAX_HEADER_BYTES` (read from the first 8 bytes, so a 90 MB party
    name is refused before it is read), JSON objects with no key given twice (at any depth:
    the library keeps one of two tensors of one name, silently) and string metadata."""
    try:
        with open(p, "rb") as fh:
            prefix = fh.read(8)
            size = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if size > MAX_HEADER_BYTES:
                raise InputError(
                    f"{p}: corrupt or truncated safetensors file, or its metadata is too large "
                    f"(the header declares {size:,} bytes; at most {MAX_HEADER_BYTES:,})")
            if size < 2:
                raise InputError(f"{p}: corrupt or truncated safetensors file (no header)")
            raw = fh.read(size)
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    if len(raw) != size:
        raise InputError(f"{p}: corrupt or truncated safetensors file (a header of "
                         f"{size:,} bytes, {len(raw):,} present)")
    head = strict_json(p, raw, "safetensors header")
    if not isinstance(head, dict):
        raise InputError(f"{p}: the safetensors header is not a JSON object")
    meta = head.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InputError(f"{p}: the safetensors __metadata__ must map names to strings")


def strict_json(p: Path, raw: bytes, what: str) -> object:
    """``raw`` parsed as UTF-8 JSON, refusing a key given twice in one object (Python's json
    keeps the last one; another reader may keep the first)."""
    def no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
        out: dict[str, object] = {}
        for key, value in pairs:
            if key in out:
                raise _Duplicate(key)
            out[key] = value
        return out

    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except _Duplicate as dup:
        raise InputError(f"{p}: the {what} names {printable(dup.key, 80)!r} twice") from None
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise InputError(f"{p}: the {what} is not valid JSON ({first_line(exc)})") from None


class _Duplicate(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def peek_safetensors(p: Path) -> tuple[dict[str, str], dict[str, tuple]]:
    """Metadata and (shape, dtype) of every tensor, from the header alone (checked first by
    :func:`check_safetensors_header`)."""
    check_safetensors_header(p)
    try:
        with safe_open(str(p), framework="pt") as f:
            head = dict(f.metadata() or {})
            found = {}
            for key in f.keys():
                sl = f.get_slice(key)
                found[key] = (tuple(sl.get_shape()), ST_DTYPES.get(sl.get_dtype()))
    except _SAFETENSORS_ERRORS as exc:
        raise InputError(f"{p}: corrupt or truncated safetensors file ({first_line(exc)})"
                         ) from None
    return head, found


def load_safetensors(p: Path) -> dict[str, torch.Tensor]:
    """The file's tensors, from one read of its bytes (at most the per-file cap, checked
    before): no mmap of a file another process may change after it was checked, and no
    mmap failure under memory pressure (seen once as "could not determine the shape of
    object type 'torch.storage.UntypedStorage'" in a loaded test run)."""
    try:
        tensors = load_bytes(p.read_bytes())
    except _SAFETENSORS_ERRORS as exc:
        raise InputError(f"{p}: corrupt or truncated safetensors file ({first_line(exc)})"
                         ) from None
    return {k: tensors[k] for k in sorted(tensors)}  # the name order safe_open gives


def read_pt(p: Path) -> tuple[dict[str, str], dict[str, torch.Tensor]]:
    sidecar = p.with_suffix(".json")
    if not sidecar.exists() and not sidecar.is_symlink():
        raise InputError(f"{p}: a .pt model needs a {sidecar.name} sidecar with its mrtf.* keys")
    head = read_sidecar(sidecar)
    return head, _read_pt_state(p)


def read_sidecar(sidecar: Path) -> dict[str, str]:
    """A model's ``.json`` sidecar as string-valued ``mrtf.*`` header keys (a key without
    the prefix gets it; non-string values are kept as JSON text)."""
    if sidecar.is_symlink():  # as for the models: links beside received files are not followed
        raise InputError(f"{sidecar}: a symbolic link; a sidecar must be a regular file")
    check_regular_file(sidecar, "sidecar", MAX_SIDECAR_BYTES)
    try:
        raw = strict_json(sidecar, sidecar.read_bytes(), "sidecar")
    except OSError as exc:
        raise InputError(f"{sidecar}: unreadable JSON ({first_line(exc)})") from None
    if not isinstance(raw, dict):
        raise InputError(f"{sidecar}: must hold a JSON object")
    try:
        head = {(k if k.startswith("mrtf.") else f"mrtf.{k}"):
                (v if isinstance(v, str) else json.dumps(v)) for k, v in raw.items()}
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{sidecar}: unusable JSON values ({first_line(exc)})") from None
    return head


def _read_pt_state(p: Path) -> dict[str, torch.Tensor]:
    # A zip whose entries unpack to more than the cap is a decompression bomb: refused from
    # the zip's directory before torch inflates anything.
    check_zip_sizes(p)
    try:
        # weights_only=True: the unpickler accepts tensors and plain containers only, so a
        # pickle carrying code is refused before anything in it runs.
        state = torch.load(str(p), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message advises weights_only=False, the wrong advice for an untrusted
        # file: say why it is refused instead.
        raise InputError(f"{p}: refused to load: the pickle holds objects other than tensors "
                         "and plain containers (possibly code); received files may hold "
                         "tensors only (use a .safetensors file)") from None
    except (RuntimeError, EOFError, OSError, ValueError, AttributeError, TypeError,
            MemoryError) as exc:
        raise InputError(f"{p}: refused to load (not a readable torch file: "
                         f"{first_line(exc)})") from None
    if not isinstance(state, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise InputError(f"{p}: not a state dict of named tensors")
    return state


