"""Import of ``.npz`` / ``.npy`` pairs and image folders into the HDF5 dataset format."""

from __future__ import annotations

import math
import os
import warnings
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mrtf.errors import InputError, first_line
from mrtf.io.hdf5 import read_dataset, write_dataset
from mrtf.io.limits import MAX_ABS_X, MAX_CLASSES, check_regular_file, human_bytes

MAX_CONVERT_BYTES = 8 << 30  # what one `mrtf convert` reads into memory
MAX_IMAGE_PIXELS = 8192 * 8192  # one image

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff")


def load_arrays(x_path: str | os.PathLike, y_path: str | os.PathLike | None = None
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """``x.npz`` with arrays ``x`` (and ``y``), or an ``x.npy`` (+ optional ``y.npy``).

    Never unpickles (``allow_pickle=False``).
    """
    p = Path(x_path)
    check_regular_file(p, "array file", MAX_CONVERT_BYTES)
    if p.suffix == ".npz":
        x, y = _load_npz(p)
    else:
        x = _load_npy(p)
        y = None
        if y_path is not None:
            check_regular_file(Path(y_path), "array file", MAX_CONVERT_BYTES)
            y = _load_npy(Path(y_path))
    return _as_images(x, y, str(p))


def _check_header(source: str, fp: BinaryIO, available: int) -> None:
    """An .npy header is read before its data: numeric dtype, and no more bytes than the file
    (or zip entry) holds, so a header claiming 10^12 values allocates nothing."""
    try:
        version = np.lib.format.read_magic(fp)
        read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                else np.lib.format.read_array_header_2_0)
        shape, _, dtype = read(fp)
    except (ValueError, OSError, EOFError, SyntaxError, TypeError) as exc:
        raise InputError(f"{source}: not a valid .npy array ({first_line(exc)})") from None
    if dtype.kind not in "biuf":
        raise InputError(f"{source}: holds {dtype} values; expected numbers")
    need = math.prod(shape) * dtype.itemsize
    have = available - fp.tell()
    if need > have:
        raise InputError(f"{source}: the header declares {human_bytes(need)} of data but the "
                         f"file holds {human_bytes(max(have, 0))} (truncated or corrupt)")


def _load_npy(p: Path) -> np.ndarray:
    try:
        with open(p, "rb") as fp:
            _check_header(str(p), fp, os.fstat(fp.fileno()).st_size)
            fp.seek(0)
            return np.load(fp, allow_pickle=False)
    except InputError:  # a ValueError too: ours, already one clear line
        raise
    except (ValueError, OSError, EOFError) as exc:
        raise InputError(f"{p}: unreadable array file ({first_line(exc)})") from None


def _load_npz(p: Path) -> tuple[np.ndarray, np.ndarray | None]:
    try:
        with zipfile.ZipFile(p) as z:
            members = {Path(i.filename).stem: i for i in z.infolist()
                       if i.filename.endswith(".npy")}
            if "x" not in members:
                raise InputError(f"{p}: needs an array named 'x' (found {sorted(members)})")
            total = sum(members[k].file_size for k in ("x", "y") if k in members)
            if total > MAX_CONVERT_BYTES:  # a deflated entry can unpack to anything
                raise InputError(f"{p}: unpacks to {human_bytes(total)}, more than the "
                                 f"{human_bytes(MAX_CONVERT_BYTES)} mrtf converts at once")
            arrays = {}
            for key in ("x", "y"):
                if key in members:
                    source = f"{p}[{key}]"
                    with z.open(members[key]) as fp:
                        _check_header(source, fp, members[key].file_size)
                    with z.open(members[key]) as fp:
                        arrays[key] = np.lib.format.read_array(fp, allow_pickle=False)
    except InputError:  # a ValueError too: ours, already one clear line
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError) as exc:
        raise InputError(f"{p}: not a readable .npz archive (truncated or corrupt: "
                         f"{first_line(exc)})") from None
    return arrays["x"], arrays.get("y")


def _as_images(x: np.ndarray, y: np.ndarray | None, source: str
               ) -> tuple[np.ndarray, np.ndarray | None]:
    if x.ndim == 3:  # (N, H, W) → (N, 1, H, W)
        x = x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):  # NHWC → NCHW
        x = x.transpose(0, 3, 1, 2)
    if x.ndim < 2 or len(x) == 0:
        raise InputError(f"{source}: x must be (N, ...) with N > 0, got shape {x.shape}")
    if x.dtype.kind in "biu" and x.dtype != np.uint8:
        raise InputError(f"{source}: x holds {x.dtype}; store float32, or uint8 pixels (scaled "
                         "by 1/255)")
    if y is not None:
        y = np.asarray(y).reshape(-1)
        if y.dtype.kind == "f" and np.isfinite(y).all() and (y == np.round(y)).all():
            y = y.astype(np.int64)  # whole numbers stored as floats
        if y.dtype.kind not in "iu" or (y.size and not 0 <= int(y.min()) <= int(y.max())
                                        < MAX_CLASSES):
            raise InputError(f"{source}: labels must be class numbers 0..{MAX_CLASSES - 1}, got "
                             f"{y.dtype} values")
        y = y.astype(np.int64)
        if len(y) != len(x):
            raise InputError(f"{source}: {len(x)} samples but {len(y)} labels")
    if x.dtype != np.uint8:
        with np.errstate(over="ignore"):
            x = x.astype(np.float32)
        if not np.isfinite(x).all() or (x.size and float(np.abs(x).max()) > MAX_ABS_X):
            raise InputError(f"{source}: x holds NaN, infinite or huge values (|x| must stay "
                             f"below {MAX_ABS_X:.0e})")
    return np.ascontiguousarray(x), y


def list_images(folder: str | os.PathLike) -> tuple[list[tuple[Path, int]], list[str]]:
    """The images of ``folder`` with their class index (-1 when flat), and the class names.

    One sub-folder per class (labeled, classes sorted by name) or flat (unlabeled)."""
    root = Path(folder)
    if not root.is_dir():
        raise InputError(f"{root}: not a directory")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    if classes:
        files = [(f, i) for i, c in enumerate(classes) for f in sorted((root / c).iterdir())
                 if f.suffix.lower() in IMAGE_SUFFIXES]
    else:
        files = [(f, -1) for f in sorted(root.iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise InputError(f"{root}: holds no images ({', '.join(IMAGE_SUFFIXES)}); give a "
                         "folder of images, or one sub-folder of images per class")
    return files, classes


def image_ids(folder: str | os.PathLike, files: list[tuple[Path, int]]) -> list[str]:
    """Each image's path relative to ``folder`` (``cat/001.png``, ``img_7.jpg``): the id a
    labels file carries, so labels can be joined back to the user's files."""
    root = Path(folder)
    return [f.relative_to(root).as_posix() for f, _ in files]


def load_image_folder(folder: str | os.PathLike, image_size: int | None = None,
                      channels: int | None = None) -> tuple[np.ndarray, np.ndarray | None,
                                                            list[str]]:
    """Images from ``folder``: one sub-folder per class (labeled, classes sorted by name) or
    flat (unlabeled). Returns (x uint8 (N, C, H, W), y or None, class names); the images
    are in :func:`list_images` order (see :func:`image_ids`)."""
    files, classes = list_images(folder)
    return _decode_images(Path(folder), files, classes, image_size, channels)


def _decode_images(root: Path, files: list[tuple[Path, int]], classes: list[str],
                   image_size: int | None, channels: int | None
                   ) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    from PIL import Image, UnidentifiedImageError

    mode = {1: "L", 3: "RGB", None: None}[channels]
    images = []
    total = 0
    for f, _ in files:
        try:
            check_regular_file(f, "image", MAX_CONVERT_BYTES)
            # a small file can declare a huge image (a decompression bomb): PIL checks the
            # declared size against this cap when opening, before decoding anything
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(f) as im:
                    w, h = im.size
                    if w * h > MAX_IMAGE_PIXELS:
                        raise InputError(f"{f}: image too large ({w}×{h} pixels declared; at "
                                         f"most {MAX_IMAGE_PIXELS:,})")
                    im = im.convert(mode or ("L" if im.mode in ("L", "1", "P") else "RGB"))
                    if image_size is not None:
                        im = im.resize((image_size, image_size), Image.BILINEAR)
                    images.append(np.asarray(im, dtype=np.uint8))
        except InputError:  # a ValueError too: ours, already one clear line
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            # PIL's own cap (checked when opening) is higher than ours but can fire first
            raise InputError(f"{f}: image too large (more than {MAX_IMAGE_PIXELS:,} pixels "
                             "declared; a decompression bomb?)") from None
        except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
            raise InputError(f"{f}: unreadable image ({first_line(exc)})") from None
        total += images[-1].nbytes
        if total > MAX_CONVERT_BYTES:
            raise InputError(f"{root}: the images take more than "
                             f"{human_bytes(MAX_CONVERT_BYTES)}; convert them in parts")
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise InputError(f"{root}: images differ in size {sorted(shapes)[:3]}; pass --image-size")
    x = np.stack(images)
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    y = np.array([label for _, label in files], dtype=np.int64) if classes else None
    return np.ascontiguousarray(x), y, classes


def import_to_h5(source: str | os.PathLike, out: str | os.PathLike,
                 labels: str | os.PathLike | None = None, image_size: int | None = None,
                 channels: int | None = None, atomic: bool = True) -> Path:
    """Convert an ``.npz``, ``.npy`` (+ labels ``.npy``) or image folder into ``out`` (.h5).

    ``atomic=False``: ``out`` is already a temporary file (see :mod:`mrtf.io.outputs`)."""
    src = Path(source)
    if src.is_dir():
        files, classes = list_images(src)
        x, y, classes = _decode_images(src, files, classes, image_size, channels)
        ids: Any = image_ids(src, files)
        attrs: dict[str, Any] = {"classes": classes} if classes else {}
    else:
        x, y = load_arrays(src, labels)
        ids, attrs = np.arange(len(x)), {}  # row numbers: still something to join on
    attrs["source"] = str(src)
    return write_dataset(out, x, y, ids=ids, attrs=attrs, atomic=atomic)


__all__ = ["image_ids", "import_to_h5", "list_images", "load_arrays", "load_image_folder",
           "read_dataset"]
