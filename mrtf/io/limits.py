"""Bounds on what an untrusted file may ask for, checked before anything is built or loaded.

A received file's metadata decides how big a model mrtf builds and how much memory a load
takes; a hostile or broken file could ask for a model of billions of parameters or hide a
huge tensor in a deflated zip entry. Every bound here is checked from the header (or the zip's
directory, or ``os.stat``) before a byte of weights is materialised. The caps are generous for
the models mrtf is made for (the zoo at image sizes up to 512 px) and far below what would
exhaust a workstation.
"""

from __future__ import annotations

import functools
import json
import math
import os
import stat
import zipfile
from pathlib import Path
from typing import Any

import torch

from mrtf.errors import InputError, printable

MAX_FILE_BYTES = 1 << 30  # one received file, uncompressed (a 50M-parameter float32 model: 200 MB)
MAX_SIDECAR_BYTES = 1 << 20  # a .pt's .json sidecar
# A safetensors header (tensor names, shapes, metadata), read before anything is parsed: a
# 100-class model's header is ~2 KB, label counts of 100,000 classes ~1.3 MB.
MAX_HEADER_BYTES = 4 << 20
MAX_NAME_CHARS = 256  # mrtf.party, mrtf.arch: names printed in tables
# Model files in one received directory, counted (and their sizes summed) from the directory
# listing before any is opened; the environment variable raises the count.
MAX_RECEIVED_FILES = 1000
MAX_RECEIVED_ENV = "MRTF_MAX_RECEIVED"
MAX_PARAMS = 50_000_000  # parameters + buffers of one model
MAX_CLASSES = 100_000
MAX_COUNT = 10**12  # n_samples, each label count
MAX_ROUND = 10**6
MAX_LOSS = 1e6  # a cross-entropy above this is no training loss
MAX_ABS_WEIGHT = 1e6  # larger weights overflow float32 activations within a few layers
MAX_ABS_X = 1e6  # input values (after uint8 scaling); larger ones overflow the forward pass
# Architecture keyword bounds (inclusive) for the registry's models.
ARCH_INT_BOUNDS: dict[str, tuple[int, int]] = {
    "in_channels": (1, 64), "image_size": (1, 512), "vocab_size": (1, 1_000_000),
    "embed_dim": (1, 4096), "hidden": (1, 8192), "layers": (1, 16),
    "in_features": (1, 1_000_000), "feature_dim": (1, 8192),
}

# Weight dtypes: float32 as is; these are converted to float32 with a note; others refused.
CONVERTED_DTYPES = (torch.float16, torch.bfloat16, torch.float64)
F32_MAX = float(torch.finfo(torch.float32).max)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def check_regular_file(p: Path, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> int:
    """``p`` is an existing regular file (after following links) of at most ``max_bytes``.

    ``os.stat`` only, nothing opened: a FIFO would block a reader and a device such as
    ``/dev/zero`` never ends. Returns the size.
    """
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{p}: no such file") from None
    except OSError as exc:  # a symlink loop, a name too long, no permission
        raise InputError(f"{p}: cannot open ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{p}: not a regular {what} ({_kind(st.st_mode)})")
    if st.st_size > max_bytes:
        raise InputError(f"{p}: {human_bytes(st.st_size)}, more than the "
                         f"{human_bytes(max_bytes)} allowed for a {what}")
    return st.st_size


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a plain file"


def check_zip_sizes(p: Path, max_bytes: int = MAX_FILE_BYTES) -> None:
    """A torch zip archive whose entries would unpack to more than ``max_bytes`` is refused
    from its directory alone (a decompression bomb), before torch reads any entry."""
    if not zipfile.is_zipfile(p):
        return  # the legacy format is not compressed: the file size bounds it
    try:
        with zipfile.ZipFile(p) as z:
            total = sum(info.file_size for info in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise InputError(f"{p}: corrupt zip archive ({exc})") from None
    if total > max_bytes:
        raise InputError(f"{p}: unpacks to {human_bytes(total)}, more than the "
                         f"{human_bytes(max_bytes)} allowed for a received file")


def bounded_int(value: Any, name: str, low: int, high: int) -> int:
    """``value`` as an int in [low, high]; a bool, a float or a string is refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{name} must be an integer, got {str(value)[:40]!r}")
    if not low <= value <= high:
        raise InputError(f"{name} must be in [{low}, {high}], got {_short(value)}")
    return value


def check_name(value: str | None, key: str) -> None:
    """A name that is printed (party, architecture): at most :data:`MAX_NAME_CHARS`
    characters and no control characters, so that it can neither forge a line of output
    (``mrtf: error: ...``) nor drive a terminal."""
    if value is None:
        return
    if len(value) > MAX_NAME_CHARS:
        raise InputError(f"{key} is {len(value):,} characters long; at most {MAX_NAME_CHARS}")
    if not value.isprintable():
        raise InputError(f"{key} holds control characters (a newline, a terminal escape): "
                         f"{printable(value, 80)}")


def _short(value: int | float) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"a {len(text)}-digit number"


def check_arch_kwargs(arch: str, kwargs: dict[str, Any]) -> None:
    """Bound the sizes a registry architecture is asked for (custom ones are trusted code)."""
    if ":" in arch:
        return
    for key, value in kwargs.items():
        if key in ARCH_INT_BOUNDS:
            bounded_int(value, f"mrtf.arch_kwargs {key}", *ARCH_INT_BOUNDS[key])
        elif key == "dropout" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                   or not 0 <= value < 1):
            raise InputError(f"mrtf.arch_kwargs dropout must be in [0, 1), got {value!r}")


def reference_shapes(arch: str, num_classes: int, kwargs: dict[str, Any]
                     ) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Key → (shape, dtype) of the architecture's state dict, built on the meta device: no
    memory is allocated, so a file asking for a huge model costs nothing to refuse."""
    check_arch_kwargs(arch, kwargs)
    if ":" in arch:  # trusted local code may not run on the meta device: build it for real
        return dict(_shapes_of_built(arch, num_classes, kwargs))
    # the parties of one round share one zoo architecture: it is built once, not once per
    # bundle (docs/benchmarks/gpu.md, 2026-11-26: the meta builds were most of a load); user
    # code is built each time, since a module of the same name may change between calls
    return dict(_zoo_shapes(arch, num_classes, json.dumps(kwargs, sort_keys=True)))


@functools.lru_cache(maxsize=16)
def _zoo_shapes(arch: str, num_classes: int, kwargs_json: str
                ) -> tuple[tuple[str, tuple[tuple[int, ...], torch.dtype]], ...]:
    """A zoo architecture's shapes, built on the meta device (kwargs already checked, as
    JSON text: hashable)."""
    with torch.device("meta"):
        return _shapes_of_built(arch, num_classes, json.loads(kwargs_json))


def _shapes_of_built(arch: str, num_classes: int, kwargs: dict[str, Any]
                     ) -> tuple[tuple[str, tuple[tuple[int, ...], torch.dtype]], ...]:
    """The state dict's (key, (shape, dtype)) of the architecture built where the caller is
    (on the meta device or for real); too many parameters are refused."""
    from mrtf.models import build_model

    model = build_model(arch, num_classes, **kwargs)
    state = model.state_dict()
    total = sum(t.numel() for t in state.values())
    if total > MAX_PARAMS:
        raise InputError(f"{arch!r} with {kwargs} and {num_classes} classes has "
                         f"{total:,} parameters, more than the {MAX_PARAMS:,} allowed")
    return tuple((k, (tuple(t.shape), t.dtype)) for k, t in state.items())


def bounded_float(value: float, name: str, low: float, high: float) -> float:
    if not math.isfinite(value) or not low <= value <= high:
        raise InputError(f"{name} must be a finite number in [{low:g}, {high:g}], "
                         f"got {value:.6g}")
    return value


MAX_SAMPLE_VALUES = 64 * 512 * 512  # one sample of x: the largest input a zoo model may take


def available_memory() -> int:
    """Bytes this process may still allocate, roughly: the kernel's MemAvailable, capped by an
    address-space limit (RLIMIT_AS) when one is set."""
    import resource

    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError):
        pass
    if avail is None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            avail = 1 << 62
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        avail = min(avail, soft)
    return avail


def check_memory(needed: int, what: str) -> None:
    """Refuse, before the work, a job whose arrays cannot fit in memory."""
    avail = available_memory()
    if needed > avail:
        raise InputError(f"{what} needs about {human_bytes(needed)} of memory, more than the "
                         f"{human_bytes(avail)} available")


def labeling_bytes(m: int, c: int) -> int:
    """Memory to hold the (M, C) outputs of labeling ``m`` samples with ``c`` classes
    (probabilities and their working copies): what ``mrtf label`` checks first, and
    ``mrtf inspect --data`` with it, so that a set no command could label is refused at once."""
    return m * c * 4 * 4


def max_received_files() -> int:
    """:data:`MAX_RECEIVED_FILES`, or the positive integer in ``$MRTF_MAX_RECEIVED``."""
    raw = os.environ.get(MAX_RECEIVED_ENV)
    if raw is None or not raw.strip():
        return MAX_RECEIVED_FILES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise InputError(f"${MAX_RECEIVED_ENV} must be a positive integer, got {raw[:40]!r}")
    return value


def check_received_size(directory: Path, files: list[Path]) -> None:
    """A received directory's model files, from the listing and ``stat`` alone: at most
    :func:`max_received_files` of them, and their bytes (held in memory once loaded, twice
    while one is read) within the memory available."""
    limit = max_received_files()
    if len(files) > limit:
        raise InputError(f"{directory}: holds {len(files):,} model files, more than the "
                         f"{limit:,} mrtf loads at once (set {MAX_RECEIVED_ENV}={len(files)} "
                         "to raise the limit)")
    total = sum(os.stat(f, follow_symlinks=False).st_size for f in files)
    check_memory(2 * total, f"loading the {len(files):,} received model files "
                            f"({human_bytes(total)})")
