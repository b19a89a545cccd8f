"""Inputs and outputs: received-model bundles (safetensors), HDF5 datasets and label files."""

from mrtf.io.atomic import atomic_path, check_output
from mrtf.io.bundles import (
    BundleMeta,
    ReceivedModel,
    ReceivedSet,
    load_bundle,
    load_received,
    save_bundle,
)
from mrtf.io.hdf5 import ArraySource, H5Dataset, describe_h5, read_dataset, write_dataset
from mrtf.io.labels import LabelSet, read_labels, write_labels

__all__ = [
    "ArraySource", "BundleMeta", "H5Dataset", "LabelSet", "ReceivedModel", "ReceivedSet",
    "atomic_path",
    "check_output", "describe_h5", "load_bundle", "load_received", "read_dataset", "read_labels",
    "save_bundle", "write_dataset", "write_labels",
]
