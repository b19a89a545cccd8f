"""Dataset sources: built-in real datasets, converters to HDF5, non-IID splits.

Installed as ``mrtf.data`` (the folder is ``data/`` at the top of the repository).
"""

from __future__ import annotations

import os
from pathlib import Path

from mrtf.data.builtin import (
    BUILTIN,
    ArrayDataset,
    adapt_images,
    load_builtin,
    train_target_split,
)
from mrtf.data.convert import import_to_h5, load_arrays, load_image_folder
from mrtf.data.splits import SplitSpec, client_class_counts, parse_split, split_clients
from mrtf.data.standard import (
    STANDARD,
    StandardName,
    is_standard_name,
    load_standard,
    parse_standard_name,
)
from mrtf.errors import InputError

DATASET_NAMES = (f"built-in: {', '.join(BUILTIN)}; standard (mrtf data fetch NAME): "
                 "mnist[:train|:test], usps[:train|:test][:framed], mnistm[:test]")


def is_dataset_name(text: str) -> bool:
    """Whether ``text`` names a built-in or standard dataset (not a file); a standard name
    with an unknown split is an InputError."""
    return str(text) in BUILTIN or parse_standard_name(str(text)) is not None


def load_dataset(source: str | os.PathLike, image_size: int | None = None,
                 channels: int | None = None, need_labels: bool = True) -> ArrayDataset:
    """A built-in name (``digits``, ``mnist5k``, ``mnistm5k``), a standard one (``mnist``,
    ``usps``, ``mnistm``, optionally ``NAME:SPLIT``, ``usps[:SPLIT]:framed`` for USPS in
    MNIST's frame, read from the data directory: $MRTF_DATA or ~/.cache/mrtf/data) or an HDF5
    dataset file."""
    text = str(source)
    if text in BUILTIN:
        return load_builtin(text, image_size, channels)
    standard = parse_standard_name(text)
    if standard is not None:
        return load_standard(standard.name, standard.split, size=image_size, channels=channels,
                             frame=standard.frame)
    if not text.endswith((".h5", ".hdf5")) and not Path(text).exists():
        raise InputError(f"unknown dataset {text!r}; {DATASET_NAMES}, or a path to an .h5 file")
    from mrtf.io.hdf5 import read_dataset

    x, y = read_dataset(text)
    if need_labels and y is None:
        raise InputError(f"{text}: has no 'y'; simulating clients needs labels")
    if x.ndim != 4:
        raise InputError(f"{text}: 'x' must be images (M, C, H, W), got shape {x.shape}")
    return ArrayDataset(name=Path(text).stem, x=adapt_images(x, image_size, channels), y=y)


__all__ = [
    "BUILTIN", "DATASET_NAMES", "STANDARD", "ArrayDataset", "InputError", "SplitSpec",
    "StandardName",
    "adapt_images", "client_class_counts", "import_to_h5", "is_dataset_name",
    "is_standard_name", "load_arrays", "load_builtin", "load_dataset", "load_image_folder",
    "load_standard", "parse_split", "parse_standard_name", "split_clients",
    "train_target_split",
]
