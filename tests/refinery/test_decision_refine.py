"""``--method decision`` end to end on small real data (scikit-learn digits): through
``refine`` and through the real ``mrtf refine`` command, deterministic, the target's y never
read (the same labels with y permuted), the refined model written and received again."""

import json

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mrtf.cli.main import cli
from mrtf.io.bundles import load_bundle, load_received
from mrtf.io.hdf5 import H5Dataset
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.report import accuracy_of
from mrtf.refinery.teachers import newest_locals, predict_probs


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


# the CLI tests' federation (tests/test_cli.py): 3 exported LeNet parties of 2 rounds
SIM = ["simulate", "--dataset", "digits", "--clients", "6", "--split", "label:2", "--ratio",
       "0.5", "--rounds", "2", "--epochs", "1", "--arch", "lenet", "--target-size", "200",
       "--seed", "0"]


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    torch.set_num_threads(1)  # small LeNets only lose from a second thread on a loaded machine
    root = tmp_path_factory.mktemp("decision-cli")
    res = run(*SIM, "--export-received", root / "received", "--export-target",
              root / "target.h5", "--json")
    assert res.exit_code == 0, res.output
    return root


def test_refine_decision_in_memory(digits_oneshot):
    """On conftest's 6 parties trained well on digits (the CLI federation's are at chance)."""
    torch.set_num_threads(1)
    received = load_received(digits_oneshot[0])
    source = H5Dataset(digits_oneshot[1])
    cfg = RefineConfig(method="decision", steps=200, progress=False, seed=0)
    out = refine(received, source, cfg)
    y = source.labels()
    locals_ = [predict_probs(m.build(), source) for m in newest_locals(received)]
    assert out.config.method == "decision" and out.teachers == len(locals_) == 6
    assert any(n.startswith("decision: ") for n in out.notes)
    assert out.timings["decision"] > 0
    np.testing.assert_allclose(out.target_probs.sum(1), 1.0, rtol=1e-5)
    # the adapted, weighted ensemble labels better than any party alone, and better than
    # the plain average of their softmax (y only to score)
    ensemble = accuracy_of(out.target_probs, y)
    assert ensemble > max(accuracy_of(p, y) for p in locals_)
    assert ensemble > accuracy_of(np.mean(locals_, 0), y)
    # the labels are the distilled student's; it follows its targets
    agree = float((out.probs.argmax(1) == out.target_probs.argmax(1)).mean())
    assert agree > 0.95 and isinstance(out.model, torch.nn.Module)


def test_cli_refine_decision_writes_labels_and_a_model_and_never_reads_y(simulated, tmp_path):
    torch.set_num_threads(1)
    labels, model = tmp_path / "labels.h5", tmp_path / "refined.safetensors"
    res = run("refine", simulated / "received", "--data", simulated / "target.h5", "--method",
              "decision", "--steps", "30", "--labels", labels, "--model", model, "--json")
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["method"] == "decision" and 0.0 <= summary["accuracy"]["refined"] <= 1.0
    with h5py.File(labels) as f:
        probs = f["probs"][:]
        assert f["labels"].shape == (200,) and f.attrs["method"] == "decision"
    assert load_bundle(model).meta.arch == "lenet"
    # a copy of the target with y permuted: the same labels, bit for bit
    shuffled = tmp_path / "shuffled.h5"
    with h5py.File(simulated / "target.h5") as src, h5py.File(shuffled, "w") as dst:
        for key in src:
            data = src[key][:]
            dst[key] = np.random.default_rng(0).permutation(data) if key == "y" else data
    again = tmp_path / "again.h5"
    res = run("refine", simulated / "received", "--data", shuffled, "--method", "decision",
              "--steps", "30", "--labels", again, "--quiet")
    assert res.exit_code == 0, res.output
    with h5py.File(again) as f:
        np.testing.assert_array_equal(f["probs"][:], probs)
