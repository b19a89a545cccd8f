"""mrtf: transductive inference for a pilot party that receives trained models.

The public API, the few names a notebook needs::

    from mrtf import H5Dataset, RefineConfig, load_received, refine

    received = load_received("runs/received")
    with H5Dataset("runs/target.h5") as target:
        result = refine(received, target, RefineConfig(seed=0))

``refine`` (MrTF and the adaptive default), ``fuse`` (data-free: FedFTG, FedKF), ``label`` (a
refined model labels new data), their configs and typed results, ``refine_files`` (the whole
``mrtf refine`` job on files: checks, selection, estimates, locked atomic outputs) with its
``RefineJob`` and ``Reporter``, ``load_received`` /
``load_bundle`` / ``H5Dataset`` / ``ArraySource`` (inputs) and ``InputError`` (bad input).
``import mrtf`` stays light: each name is imported on first use (PEP 562), so ``import
mrtf.errors`` does not pull in torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: public name -> the module that defines it
_PUBLIC = {
    "refine": "mrtf.refinery.pipeline",
    "RefineConfig": "mrtf.refinery.config",
    "RefineResult": "mrtf.refinery.pipeline",
    "fuse": "mrtf.datafree.fuse",
    "FusionConfig": "mrtf.datafree.config",
    "FusionResult": "mrtf.datafree.fuse",
    "label": "mrtf.labeling",
    "LabelResult": "mrtf.labeling",
    "refine_files": "mrtf.jobs.refine",
    "RefineJob": "mrtf.jobs.params",
    "Reporter": "mrtf.jobs.reporter",
    "RefinedFiles": "mrtf.jobs.reporter",
    "FusedFiles": "mrtf.jobs.reporter",
    "RefinePreview": "mrtf.refinery.preview",
    "load_received": "mrtf.io.bundles",
    "load_bundle": "mrtf.io.bundles",
    "ReceivedSet": "mrtf.io.bundles",
    "H5Dataset": "mrtf.io.hdf5",
    "ArraySource": "mrtf.io.hdf5",
    "InputError": "mrtf.errors",
}

__all__ = [
    "ArraySource", "FusedFiles", "FusionConfig", "FusionResult", "H5Dataset", "InputError",
    "LabelResult", "ReceivedSet", "RefineConfig", "RefineJob", "RefinePreview", "RefineResult",
    "RefinedFiles", "Reporter", "__version__", "fuse", "label", "load_bundle", "load_received",
    "refine", "refine_files",
]

if TYPE_CHECKING:  # for type checkers and the API reference; nothing is imported at run time
    from mrtf.datafree.config import FusionConfig
    from mrtf.datafree.fuse import FusionResult, fuse
    from mrtf.errors import InputError
    from mrtf.io.bundles import ReceivedSet, load_bundle, load_received
    from mrtf.io.hdf5 import ArraySource, H5Dataset
    from mrtf.jobs.params import RefineJob
    from mrtf.jobs.refine import refine_files
    from mrtf.jobs.reporter import FusedFiles, RefinedFiles, Reporter
    from mrtf.labeling import LabelResult, label
    from mrtf.refinery.config import RefineConfig
    from mrtf.refinery.pipeline import RefineResult, refine
    from mrtf.refinery.preview import RefinePreview


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mrtf' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
