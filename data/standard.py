"""The standard digit benchmarks as built-ins: ``mnist``, ``usps``, ``mnistm``.

Read from the data directory (mrtf.data.registry: ``data_dir``, else ``$MRTF_DATA``, else
``~/.cache/mrtf/data``), every file verified by sha256 first; ``mrtf data fetch NAME``
downloads them. Splits: ``mnist`` train (60,000) / test (10,000); ``usps`` train (7,291) /
test (2,007); ``mnistm`` test only (9,001). Wherever a dataset name is accepted
(``mrtf simulate --dataset``, ``--target``, ``mrtf convert``), ``NAME[:SPLIT][:framed]``:
``SPLIT`` picks a split (a bare ``NAME`` means its test split, as :func:`load_standard`'s
default does) and ``:framed`` (USPS only) is ``frame="mnist"``.

Native forms, all returned as ``x`` float32 (N, C, H, W) in [0, 1] and ``y`` int64:

* MNIST 1×28×28 (IDX bytes / 255); USPS 1×16×16 (the h5's [0, 1] pixels, row-major);
  MNIST-M 3×32×32 (RGB bytes / 255).

Conversion between domains (``size=``, ``channels=``), following the papers:

* MNIST↔USPS: SHOT (Liang et al. 2020) resizes USPS 16×16 to MNIST's 28×28. Resizing here
  is ``torch.nn.functional.interpolate``, bilinear, ``align_corners=False``, antialias off,
  clamped to [0, 1] (upsampling: antialias would change nothing anyway).
* USPS framing (``frame=``): ``"resize"`` (the default, SHOT's rule) resizes the whole 16×16
  frame, so the digit, which fills its frame, ends ~40 % larger than MNIST's. ``"mnist"``
  frames USPS as MNIST frames its digits (LeCun et al. 1998: size-normalised to a 20×20 box
  in a 28×28 image): the 16×16 image resized to 20×20 (the rule above) inside a 4-pixel zero
  border, a 1×28×28 image, which ``size`` then resizes as it resizes MNIST's 28×28. Not
  centred by centre of mass as MNIST is: the 16×16 frame is centred.
* MNIST→MNIST-M: DANN (Ganin & Lempitsky 2015) resizes MNIST to 32×32 and replicates it to
  3 channels: ``size=32, channels=3`` (the whole 28×28 image, its border included; MNIST and
  MNIST-M are already in MNIST's frame, so ``frame="mnist"`` is refused for them).
* channels 1→3 replicates the grey channel (after resizing; the order does not change the
  values); 3→1 is the luminance 0.299 R + 0.587 G + 0.114 B (before resizing).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np

from mrtf.data.builtin import ArrayDataset, adapt_images
from mrtf.data.registry import file_named, read_verified_gz, require, resolve_data_dir
from mrtf.errors import InputError

SPLITS: dict[str, tuple[str, ...]] = {"mnist": ("train", "test"), "usps": ("train", "test"),
                                      "mnistm": ("test",)}
STANDARD = tuple(SPLITS)

_IDX_IMAGES, _IDX_LABELS = 0x00000803, 0x00000801  # ubyte, 3 dims / ubyte, 1 dim
_MNIST_FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
                "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}
_MAX_SAMPLES = 100_000
#: "resize": the whole image is resized (SHOT's rule); "mnist": USPS in MNIST's frame
FRAMES = ("resize", "mnist")
FRAMED = "framed"  # the name suffix for frame="mnist": usps:test:framed
_MNIST_SIDE, _MNIST_BOX = 28, 20  # MNIST: digits size-normalised to 20×20 inside 28×28


class StandardName(NamedTuple):
    """A parsed ``NAME[:SPLIT][:framed]``: the arguments of :func:`load_standard`."""

    name: str
    split: str
    frame: str = "resize"


def parse_standard_name(text: str) -> StandardName | None:
    """``"usps:train"`` → (usps, train, resize); a bare name → its test split; a last field
    ``framed`` → frame "mnist" (``usps:framed`` is usps:test framed); None when ``text`` is not
    a standard dataset (an unknown split or qualifier of a standard name is an InputError)."""
    name, *fields = str(text).split(":")
    if name not in SPLITS:
        return None
    frame = "resize"
    if fields and fields[-1] == FRAMED:
        frame, fields = "mnist", fields[:-1]
    if len(fields) > 1:
        raise InputError(f"{text!r}: expected NAME[:SPLIT][:{FRAMED}], e.g. usps:test:{FRAMED} "
                         f"or usps:{FRAMED} (the test split)")
    split = fields[0] if fields else "test"
    _check_split(name, split)
    _check_frame(name, frame)
    return StandardName(name, split, frame)


def is_standard_name(text: str) -> bool:
    name = str(text).partition(":")[0]
    return name in SPLITS


def _check_split(name: str, split: str) -> None:
    if name not in SPLITS:
        raise InputError(f"unknown standard dataset {name!r}; choose from "
                         f"{', '.join(STANDARD)}")
    if split not in SPLITS[name]:
        if name == "mnistm" and split == "train":
            raise InputError("mnistm has only its test split (9,001 images) here: the "
                             "MNIST-M train split is not distributed; use mnistm:test")
        raise InputError(f"{name} has no split {split!r}; choose from "
                         f"{', '.join(SPLITS[name])}")


def _check_frame(name: str, frame: str) -> None:
    if frame not in FRAMES:
        raise InputError(f"frame must be one of {', '.join(FRAMES)}, got {frame!r}")
    if frame == "mnist" and name != "usps":
        raise InputError(f"{name}: its digits are already in MNIST's frame; framing "
                         f"(frame='mnist', :{FRAMED}) applies to usps only")


def load_standard(name: str, split: str = "test", *, size: int | None = None,
                  channels: int | None = None, frame: str = "resize",
                  data_dir: str | os.PathLike | None = None) -> ArrayDataset:
    """A standard dataset's split, verified, optionally framed, resized and channel-converted.

    E.g. ``load_standard("usps", "train", size=28)`` pairs with MNIST (SHOT's digit
    protocol), ``load_standard("mnist", "train", size=32, channels=3)`` with MNIST-M (DANN's).
    ``frame="mnist"`` (USPS only) first puts the 16×16 digits in MNIST's frame (20×20 inside
    28×28, see the module's docstring); ``size`` then resizes that 28×28 image (None: 28).
    The dataset's ``name`` is ``"NAME:SPLIT"``, ``"usps:SPLIT:framed"`` when framed.
    """
    _check_split(name, split)
    _check_frame(name, frame)
    if size is not None and not 4 <= size <= 256:
        raise InputError(f"image size must be within 4..256, got {size}")
    if channels not in (None, 1, 3):
        raise InputError(f"channels must be 1 or 3, got {channels}")
    root = resolve_data_dir(data_dir)
    reader = {"mnist": _read_mnist, "usps": _read_usps, "mnistm": _read_mnistm}[name]
    x, y = reader(root, split)
    if frame == "mnist":
        x = frame_like_mnist(x)
    if channels == 3 and x.shape[1] == 1:  # replicate after resizing: same values, less memory
        x = adapt_images(adapt_images(x, size, antialias=False), channels=3)
    else:
        x = adapt_images(x, size, channels, antialias=False)
    suffix = f":{FRAMED}" if frame == "mnist" else ""
    return ArrayDataset(name=f"{name}:{split}{suffix}", y=y, x=x)


def frame_like_mnist(x: np.ndarray) -> np.ndarray:
    """N×C×H×W images that fill their frame → N×C×28×28 in MNIST's frame: resized to 20×20
    (bilinear, antialias off, clamped) inside a 4-pixel zero border."""
    border = (_MNIST_SIDE - _MNIST_BOX) // 2
    inner = adapt_images(x, _MNIST_BOX, antialias=False)
    return np.pad(inner, ((0, 0), (0, 0), (border, border), (border, border)))


def parse_idx(data: bytes, magic: int, shape: tuple[int, ...], source: str) -> np.ndarray:
    """An IDX array (LeCun's format: big-endian magic, big-endian int32 sizes, then ubyte
    values) of known magic and per-item ``shape``; the count comes from the header."""
    dims = magic & 0xFF
    header = 4 + 4 * dims
    if len(data) < header:
        raise InputError(f"{source}: too short for an IDX header")
    got = int.from_bytes(data[:4], "big")
    if got != magic:
        raise InputError(f"{source}: IDX magic {got:#010x}, expected {magic:#010x}")
    sizes = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    if sizes[1:] != shape or not 0 < sizes[0] <= _MAX_SAMPLES:
        raise InputError(f"{source}: IDX sizes {sizes}, expected (N, {', '.join(map(str, shape))})"
                         f" with N <= {_MAX_SAMPLES}")
    if len(data) != header + int(np.prod(sizes)):
        raise InputError(f"{source}: {len(data) - header} bytes of values, header says "
                         f"{int(np.prod(sizes))}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(sizes)


def _read_mnist(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = (file_named(f"mnist/{f}") for f in _MNIST_FILES[split])
    x = parse_idx(read_verified_gz(root, images), _IDX_IMAGES, (28, 28), images.path)
    y = parse_idx(read_verified_gz(root, labels), _IDX_LABELS, (), labels.path)
    _check_labels(y, len(x), labels.path)
    return (x[:, None] / np.float32(255.0)).astype(np.float32), y.astype(np.int64)


def _read_usps(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    (path,) = require("usps", root)
    with h5py.File(path, "r") as fh:
        data, target = fh.get(f"{split}/data"), fh.get(f"{split}/target")
        if not isinstance(data, h5py.Dataset) or not isinstance(target, h5py.Dataset):
            raise InputError(f"{path}: no {split}/data and {split}/target arrays")
        x, y = data[()], target[()]
    if x.ndim != 2 or x.shape[1] != 256:
        raise InputError(f"{path}: {split}/data has shape {x.shape}, expected (N, 256)")
    _check_labels(y, len(x), f"{path}: {split}/target")
    x = np.asarray(x, dtype=np.float32).reshape(-1, 1, 16, 16)  # 16×16 row-major
    if not (np.isfinite(x).all() and x.min() >= 0.0 and x.max() <= 1.0):
        raise InputError(f"{path}: {split}/data values outside [0, 1]")
    return x, y.astype(np.int64)


def _read_mnistm(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    (path,) = require("mnistm", root)
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not {"x", "y"} <= set(npz.files):
                raise InputError(f"{path}: needs arrays 'x' and 'y', has {npz.files}")
            x, y = npz["x"], npz["y"]
    except (OSError, ValueError) as exc:
        raise InputError(f"{path}: not a readable .npz ({exc})") from None
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1:] != (32, 32, 3):
        raise InputError(f"{path}: x is {x.dtype} {x.shape}, expected uint8 (N, 32, 32, 3)")
    _check_labels(y, len(x), f"{path}: y")
    x = np.ascontiguousarray(x.transpose(0, 3, 1, 2))  # N×32×32×3 RGB → N×3×32×32
    return (x / np.float32(255.0)).astype(np.float32), y.astype(np.int64)


def _check_labels(y: np.ndarray, n: int, source: str) -> None:
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer) or n == 0:
        raise InputError(f"{source}: {y.shape} labels for {n} images")
    if y.min() < 0 or y.max() > 9:
        raise InputError(f"{source}: labels outside 0..9")
