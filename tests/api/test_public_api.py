"""The public API (``from mrtf import ...``), ``python -m mrtf`` and the library label job."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import mrtf

PUBLIC = ["refine", "fuse", "label", "RefineConfig", "RefineResult", "FusionConfig",
          "FusionResult", "LabelResult", "load_received", "load_bundle", "ReceivedSet",
          "H5Dataset", "ArraySource", "InputError", "refine_files", "RefineJob", "Reporter",
          "RefinedFiles", "FusedFiles", "RefinePreview"]


def test_public_names_are_the_library_objects():
    from mrtf import (  # noqa: F401  (the import itself is the check)
        H5Dataset,
        InputError,
        RefineConfig,
        RefineResult,
        fuse,
        label,
        load_received,
        refine,
    )
    from mrtf.datafree.fuse import fuse as fuse_impl
    from mrtf.errors import InputError as input_error
    from mrtf.labeling import label as label_impl
    from mrtf.refinery.pipeline import refine as refine_impl

    assert refine is refine_impl and fuse is fuse_impl and label is label_impl
    assert InputError is input_error
    assert sorted(mrtf.__all__) == sorted(["__version__", *PUBLIC])
    for name in PUBLIC:
        assert getattr(mrtf, name).__doc__, f"mrtf.{name} has no docstring"
    with pytest.raises(AttributeError):
        _ = mrtf.no_such_name


def test_import_mrtf_is_light():
    """``import mrtf`` (and ``mrtf.errors``) must not pull in torch: the names load on use."""
    code = ("import sys, mrtf, mrtf.errors; "
            "print('torch' in sys.modules, 'mrtf.refinery' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def test_python_dash_m_mrtf_runs_the_cli():
    res = subprocess.run([sys.executable, "-m", "mrtf", "--help"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Usage: mrtf")
    for command in ("refine", "label", "simulate", "demo"):
        assert command in res.stdout
    bad = subprocess.run([sys.executable, "-m", "mrtf", "no-such-command"],
                         capture_output=True, text=True)
    assert bad.returncode == 2


def test_label_library_job_matches_the_model(digits_federation):
    """``mrtf.label`` on a received bundle: argmax of the model's softmax, the selection
    leaves the least confident unlabeled, and a model that does not fit is an InputError."""
    from mrtf import ArraySource, H5Dataset, InputError, label
    from mrtf.io.bundles import load_bundle

    received, target, _ = digits_federation
    bundle = load_bundle(received / "global-start.safetensors")
    with H5Dataset(target) as data:
        result = label(bundle, data, coverage=0.5)
        m = len(data)
    assert result.probs.shape == (m, bundle.meta.num_classes)
    kept = result.labels.labels >= 0
    assert kept.sum() == m // 2 and result.selection.abstained.sum() == m - m // 2
    assert np.array_equal(result.labels.labels[kept], result.probs.argmax(1)[kept])
    assert result.calibration.confidence[kept].min() >= result.calibration.confidence[~kept].max()
    with pytest.raises(InputError):
        label(bundle, ArraySource(np.zeros((4, 1, 5, 5), np.float32)))
    with pytest.raises(InputError):
        label(bundle, ArraySource(np.zeros((4, 1, 8, 8), np.float32)), coverage=1.5)
