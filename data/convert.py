"""Import of ``.npz`` / ``.npy`` pairs and image folders into the HDF5 dataset format."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mrtf.errors import InputError
from mrtf.io.hdf5 import read_dataset, write_dataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff")


def load_arrays(x_path: str | os.PathLike, y_path: str | os.PathLike | None = None
                ) -> tuple[np.ndarray, np.ndarray | None]:
    """``x.npz`` with arrays ``x`` (and ``y``), or an ``x.npy`` (+ optional ``y.npy``).

    Never unpickles (``allow_pickle=False``).
    """
    p = Path(x_path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    try:
        if p.suffix == ".npz":
            with np.load(p, allow_pickle=False) as z:
                if "x" not in z:
                    raise InputError(f"{p}: needs an array named 'x' (found {list(z)})")
                x, y = z["x"], (z["y"] if "y" in z else None)
        else:
            x = np.load(p, allow_pickle=False)
            y = np.load(y_path, allow_pickle=False) if y_path is not None else None
    except (ValueError, OSError) as exc:
        raise InputError(f"{p}: unreadable array file ({str(exc).splitlines()[0][:120]})"
                         ) from None
    return _as_images(x, y, str(p))


def _as_images(x: np.ndarray, y: np.ndarray | None, source: str
               ) -> tuple[np.ndarray, np.ndarray | None]:
    if x.ndim == 3:  # (N, H, W) → (N, 1, H, W)
        x = x[:, None]
    if x.ndim == 4 and x.shape[-1] in (1, 3) and x.shape[1] not in (1, 3):  # NHWC → NCHW
        x = x.transpose(0, 3, 1, 2)
    if x.ndim < 2 or len(x) == 0:
        raise InputError(f"{source}: x must be (N, ...) with N > 0, got shape {x.shape}")
    if y is not None:
        y = np.asarray(y).astype(np.int64).reshape(-1)
        if len(y) != len(x):
            raise InputError(f"{source}: {len(x)} samples but {len(y)} labels")
    if x.dtype != np.uint8:
        x = x.astype(np.float32)
    return np.ascontiguousarray(x), y


def load_image_folder(folder: str | os.PathLike, image_size: int | None = None,
                      channels: int | None = None) -> tuple[np.ndarray, np.ndarray | None,
                                                            list[str]]:
    """Images from ``folder``: one sub-folder per class (labeled, classes sorted by name) or
    flat (unlabeled). Returns (x uint8 (N, C, H, W), y or None, class names)."""
    from PIL import Image, UnidentifiedImageError

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
        raise InputError(f"{root}: holds no images ({', '.join(IMAGE_SUFFIXES)})")
    mode = {1: "L", 3: "RGB", None: None}[channels]
    images = []
    for f, _ in files:
        try:
            with Image.open(f) as im:
                im = im.convert(mode or ("L" if im.mode in ("L", "1", "P") else "RGB"))
                if image_size is not None:
                    im = im.resize((image_size, image_size), Image.BILINEAR)
                images.append(np.asarray(im, dtype=np.uint8))
        except (UnidentifiedImageError, OSError) as exc:
            raise InputError(f"{f}: unreadable image ({exc})") from None
    shapes = {a.shape for a in images}
    if len(shapes) > 1:
        raise InputError(f"{root}: images differ in size {sorted(shapes)[:3]}; pass --image-size")
    x = np.stack(images)
    x = x[:, None] if x.ndim == 3 else x.transpose(0, 3, 1, 2)
    y = np.array([label for _, label in files], dtype=np.int64) if classes else None
    return np.ascontiguousarray(x), y, classes


def import_to_h5(source: str | os.PathLike, out: str | os.PathLike,
                 labels: str | os.PathLike | None = None, image_size: int | None = None,
                 channels: int | None = None) -> Path:
    """Convert an ``.npz``, ``.npy`` (+ labels ``.npy``) or image folder into ``out`` (.h5)."""
    src = Path(source)
    if src.is_dir():
        x, y, classes = load_image_folder(src, image_size, channels)
        attrs = {"classes": classes} if classes else {}
    else:
        x, y = load_arrays(src, labels)
        attrs = {}
    attrs["source"] = str(src)
    return write_dataset(out, x, y, attrs=attrs)


__all__ = ["import_to_h5", "load_arrays", "load_image_folder", "read_dataset"]
