"""Input alignment end to end on real digits: parties trained on MNIST (../shared/data),
USPS resized to fill its 28×28 frame as the target; ``mrtf refine --input-reading`` and the
refined model's reading carried to ``mrtf label``."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.data import load_standard
from mrtf.errors import InputError
from mrtf.federated import LocalConfig, local_train
from mrtf.io import BundleMeta, load_bundle, load_received, save_bundle, write_dataset
from mrtf.io.hdf5 import ArraySource, H5Dataset
from mrtf.io.reading import Reading, ReadSource
from mrtf.labeling import carried_reading, label
from mrtf.models import build_model
from mrtf.refinery import RefineConfig, predict_probs, refine
from mrtf.refinery.input_reading import align_input

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
KW = {"in_channels": 1, "image_size": 28}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="module")
def mnist_to_usps(tmp_path_factory):
    """Two LeNet parties trained briefly on 1,200 MNIST digits each; 300 USPS test digits."""
    if not (SHARED_DATA / "SHA256SUMS").is_file():
        pytest.fail(f"{SHARED_DATA.resolve()}: the standard datasets are missing")
    d = SHARED_DATA.resolve()
    root = tmp_path_factory.mktemp("zoom")
    mnist = load_standard("mnist", "train", data_dir=d)
    torch.manual_seed(0)
    init = build_model("lenet", 10, **KW)
    (root / "rx").mkdir()
    for k in range(2):
        rows = slice(1200 * k, 1200 * (k + 1))
        res = local_train(init, torch.from_numpy(mnist.x[rows]),
                          torch.from_numpy(mnist.y[rows]), 10,
                          LocalConfig(epochs=2, lr=0.05, batch_size=32), seed=k)
        save_bundle(root / "rx" / f"client-{k}.safetensors", res.model,
                    BundleMeta(arch="lenet", num_classes=10, arch_kwargs=KW,
                               n_samples=1200, train_loss=res.train_loss))
    usps = load_standard("usps", "test", size=28, data_dir=d)
    write_dataset(root / "usps.h5", usps.x[:300], usps.y[:300])
    return root


def test_refine_reads_usps_smaller_and_labels_it_better(mnist_to_usps, tmp_path):
    root = mnist_to_usps
    out = {}
    for mode in ("off", "search"):
        res = run("refine", root / "rx", "--data", root / "usps.h5", "--method", "fedavg",
                  "--input-reading", mode, "--labels", tmp_path / f"{mode}.h5", "--json")
        assert res.exit_code == 0, res.output
        out[mode] = json.loads(res.output)
    assert out["off"]["input_reading"] is None
    chosen = out["search"]["input_reading"]
    assert chosen["reason"] == "searched" and chosen["scale"] < 1.0
    assert any("× its size" in n for n in out["search"]["notes"])
    # y scores here only: reading the digits at MNIST's size labels more of them right
    assert out["search"]["accuracy"]["refined"] > out["off"]["accuracy"]["refined"] + 0.03


def test_the_refined_model_carries_its_reading_to_label(mnist_to_usps, tmp_path):
    root = mnist_to_usps
    labels, model = tmp_path / "l.h5", tmp_path / "m.safetensors"
    res = run("refine", root / "rx", "--data", root / "usps.h5", "--method", "feddf",
              "--steps", "20", "--input-reading", "fg:0.7", "--labels", labels, "--model",
              model, "--quiet")
    assert res.exit_code == 0, res.output
    bundle = load_bundle(model)
    assert bundle.meta.extra["mrtf.input_reading"] == "fg:0.7"
    assert carried_reading(bundle) == Reading(0.7, True)
    again = tmp_path / "again.h5"
    assert run("label", model, "--data", root / "usps.h5", "--labels", again).exit_code == 0
    with h5py.File(labels) as a, h5py.File(again) as b:
        assert np.array_equal(a["labels"][:], b["labels"][:])
    # the same model read as given labels differently: the reading is what made them agree
    with H5Dataset(root / "usps.h5") as data:
        plain = predict_probs(bundle.build(), data).argmax(1)
        with h5py.File(labels) as a:
            assert not np.array_equal(plain, a["labels"][:])


@pytest.mark.parametrize("value", ["9", "-1", "nan", "big", "fg:0.7:1"])
def test_a_wild_carried_reading_is_refused(mnist_to_usps, tmp_path, value):
    root = mnist_to_usps
    src = root / "rx" / "client-0.safetensors"
    bundle = load_bundle(src)
    meta = bundle.meta
    meta.extra["mrtf.input_reading"] = value
    bad = tmp_path / "bad.safetensors"
    save_bundle(bad, bundle.state_dict, meta)
    res = CliRunner().invoke(cli, ["label", str(bad), "--data", str(root / "usps.h5"),
                                   "--labels", str(tmp_path / "l.h5")])
    assert res.exit_code == 2 and "mrtf.input_reading:" in res.output
    assert not (tmp_path / "l.h5").exists() and "Traceback" not in res.output


def test_a_factor_on_vectors_is_refused():
    state = SimpleNamespace(config=RefineConfig(input_reading="0.8"), method=None,
                            source=ArraySource(np.zeros((20, 6), np.float32)), notes=[])
    with pytest.raises(InputError, match="applies to images"):
        align_input(state)
    state.config = RefineConfig(input_reading="search")
    state.plan = SimpleNamespace(locals_=[], locals_received=[])
    state.received = SimpleNamespace(num_classes=3)
    state.dev = "cpu"
    align_input(state)  # searching vectors is not an error: it says it did not search
    assert state.input_reading.reason == "not images" and state.source.x.shape == (20, 6)


def test_the_library_reads_the_same_way(mnist_to_usps):
    root = mnist_to_usps
    rs = load_received(root / "rx")
    with H5Dataset(root / "usps.h5") as data:
        res = refine(rs, data, RefineConfig(method="fedavg", input_reading="0.8",
                                            progress=False))
        assert res.reading == Reading(0.8) and res.input_reading.reason == "given"
        want = predict_probs(res.model, ReadSource(data, Reading(0.8)))
    np.testing.assert_allclose(res.probs, want, atol=1e-6)
    # label() on a bundle that carries no reading reads as given
    with H5Dataset(root / "usps.h5") as data:
        assert label(load_bundle(root / "rx" / "client-0.safetensors"), data).probs.shape \
            == (300, 10)
