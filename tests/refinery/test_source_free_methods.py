"""The source-free methods shot, aad and nrc (mrtf/refinery/methods/): θ_{t+1} adapted by the
method's adapter and recipe without teachers, its argmax the labels, through ``refine()`` and
through the real ``mrtf refine --method`` command on small real data (scikit-learn digits)."""

import copy
import json

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.io.bundles import load_received
from mrtf.io.hdf5 import H5Dataset
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.aad import AadSettings, aad_adapt
from mrtf.refinery.config import METHOD_SPECS
from mrtf.refinery.methods.aad import Aad
from mrtf.refinery.nrc import NrcSettings, nrc_adapt
from mrtf.refinery.registry import register_method, unregister_method
from mrtf.refinery.shot import ShotSettings, shot_adapt
from mrtf.refinery.teachers import predict_probs

ADAPTERS = {"shot": (shot_adapt, ShotSettings.paper()), "aad": (aad_adapt, AadSettings()),
            "nrc": (nrc_adapt, NrcSettings())}


def _cfg(method, **kw):
    # on the CPU, as the by-hand adaptations below (a GPU's sums differ from the 6th digit)
    return RefineConfig(method=method, progress=False, inference_batch=256, device="cpu",
                        **kw)


def test_the_methods_are_registered_with_their_papers_recipes():
    for name, (_, settings) in ADAPTERS.items():
        spec = METHOD_SPECS[name]
        assert spec.teachers == "none" and not spec.vote and not spec.trust_default
        assert spec.settings == settings
    assert ShotSettings.paper().optimizer == "sgd" and ShotSettings.paper().epochs == 30


@pytest.mark.parametrize("method", sorted(ADAPTERS))
def test_refine_adapts_the_average_and_labels_with_its_argmax(method, digits_federation):
    torch.set_num_threads(1)  # LeNet on 8×8 digits: many tiny steps (tests/refinery/sfda_toy.py)
    received = load_received(digits_federation[0])
    with H5Dataset(digits_federation[1]) as target:
        average = refine(received, target, _cfg("fedavg")).model
        r = refine(received, target, _cfg(method, seed=3))
        adapter, settings = ADAPTERS[method]
        by_hand = adapter(copy.deepcopy(average), target, settings, 3, "cpu")
        np.testing.assert_allclose(r.probs, predict_probs(by_hand, target, 256, "cpu"),
                                   atol=1e-6)
        np.testing.assert_allclose(r.probs, predict_probs(r.model, target, 256, "cpu"),
                                   atol=1e-6)
    assert not np.array_equal(r.probs.argmax(1), r.averaged_probs.argmax(1))  # it moved
    assert r.config.method == method and r.model_probs is None and r.timings["distill"] > 0
    assert any(line.startswith(f"{method}: {type(settings).__name__}(")
               for line in r.notes)


def test_a_variant_is_one_more_registered_instance(digits_federation):
    torch.set_num_threads(1)
    variant = register_method(Aad(AadSettings(k=2, epochs=1), name="aad-k2-e1"))
    try:
        assert METHOD_SPECS["aad-k2-e1"].settings.k == 2 and METHOD_SPECS["aad"].settings.k == 5
        received = load_received(digits_federation[0])
        with H5Dataset(digits_federation[1]) as target:
            r = refine(received, target, _cfg(variant.name))
        assert r.config.method == "aad-k2-e1"
    finally:
        unregister_method("aad-k2-e1")


@pytest.mark.parametrize("method", sorted(ADAPTERS))
def test_the_cli_refines_with_each_method_end_to_end(method, digits_federation, tmp_path):
    torch.set_num_threads(1)
    received, target = digits_federation[:2]
    labels = tmp_path / "labels.h5"
    res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target), "--labels",
                                   str(labels), "--method", method, "--json"],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["method"] == method and summary["samples"] == 300
    assert 0.0 <= summary["accuracy"]["refined"] <= 1.0
    with h5py.File(labels) as f:
        assert f["labels"].shape == (300,) and f.attrs["method"] == method
        np.testing.assert_array_equal(f["labels"][:], f["probs"][:].argmax(1))


@pytest.mark.parametrize("method", sorted(ADAPTERS))
def test_streaming_gives_the_same_labels(method, digits_federation, tmp_path):
    torch.set_num_threads(1)
    received = load_received(digits_federation[0])
    with H5Dataset(digits_federation[1]) as target:
        mem = refine(received, target, _cfg(method, stream="off"))
        out = refine(received, target, _cfg(method, stream="on", scratch_dir=str(tmp_path)))
    assert out.streaming and not mem.streaming
    np.testing.assert_array_equal(out.probs, mem.probs)
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone


@pytest.mark.parametrize("method", ["shot", "nrc"])
def test_the_diversity_term_aims_at_the_given_class_frequencies(method, digits_federation,
                                                                monkeypatch):
    """--method shot / nrc with --class-frequencies: the adapter runs with the frequencies as
    its class shares (the rest of its recipe as registered), and without them as registered."""
    import importlib

    module = importlib.import_module(f"mrtf.refinery.methods.{method}")
    seen = []
    monkeypatch.setattr(module, f"{method}_adapt",
                        lambda model, source, settings, *a: seen.append(settings) or model)
    received = load_received(digits_federation[0])
    counts = (2.0,) * 5 + (1.0,) * 5
    with H5Dataset(digits_federation[1]) as target:
        refine(received, target, _cfg(method, class_frequencies=counts))
        refine(received, target, _cfg(method))
    told, plain = seen
    assert told.class_prior == pytest.approx((2 / 15,) * 5 + (1 / 15,) * 5)
    assert told.epochs == METHOD_SPECS[method].settings.epochs
    assert plain == METHOD_SPECS[method].settings and plain.class_prior is None
