"""The streaming refinery (streaming.py) gives the in-memory path's labels."""

import numpy as np
import pytest

from mrtf.data import load_builtin
from mrtf.io.bundles import load_received
from mrtf.io.hdf5 import ArraySource
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery import pipeline as pl
from mrtf.refinery import streaming_adaptive as sa
from mrtf.refinery import teachers as tm


@pytest.fixture(scope="module")
def setup(digits_federation):
    received = load_received(digits_federation[0])
    return received, ArraySource(load_builtin("digits").x)  # 1,797 samples


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    # blocks that do not divide M, so every block-wise sum has several uneven parts
    monkeypatch.setattr(tm, "STD_BLOCK", 700)
    monkeypatch.setattr(pl, "TARGET_CHUNK", 1024)
    monkeypatch.setattr(sa, "BLOCK", 500)


def _both(received, source, tmp_path, **kw):
    base = dict(steps=20, batch_size=32, progress=False, inference_batch=256, clr_min_round=0)
    base.update(kw)
    mem = refine(received, source, RefineConfig(stream="off", **base))
    out = refine(received, source, RefineConfig(stream="on", scratch_dir=str(tmp_path), **base))
    assert out.info.get("streaming") and not mem.info.get("streaming")
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone
    return mem, out


@pytest.mark.parametrize("method", ["adaptive", "mrtf"])
def test_streaming_labels_equal_in_memory(setup, tmp_path, method):
    mem, out = _both(*setup, tmp_path, method=method)
    np.testing.assert_array_equal(out.target_probs.argmax(1), mem.target_probs.argmax(1))
    np.testing.assert_array_equal(out.probs.argmax(1), mem.probs.argmax(1))
    np.testing.assert_allclose(out.target_probs, mem.target_probs, atol=1e-6)
    np.testing.assert_array_equal(out.averaged_probs, mem.averaged_probs)
    if method == "adaptive":
        assert out.info["cluster_weight"] == pytest.approx(mem.info["cluster_weight"])
        assert [s["name"] for s in out.info["sources"]] == \
            [s["name"] for s in mem.info["sources"]]
        for a, b in zip(out.info["sources"], mem.info["sources"]):
            assert a["estimated_accuracy"] == pytest.approx(b["estimated_accuracy"], abs=1e-9)
    # the calibrated confidence: the same evidence, read from the spill by blocks
    assert out.calibration.method == mem.calibration.method
    np.testing.assert_allclose(out.calibration.confidence, mem.calibration.confidence,
                               atol=1e-5)
    assert out.info["estimated_accuracy"]["refined"] == \
        pytest.approx(mem.info["estimated_accuracy"]["refined"], abs=1e-5)
    if method != "adaptive":  # the paper's methods: every block-wise step is the in-memory one
        np.testing.assert_array_equal(out.target_probs, mem.target_probs)
        np.testing.assert_array_equal(out.probs, mem.probs)


@pytest.mark.parametrize("method,variant", [("feddf", "paper"), ("st+rd", "paper"),
                                            ("mrtf", "reference"), ("fedavg", "paper")])
def test_streaming_paper_methods_bitwise(setup, tmp_path, method, variant):
    mem, out = _both(*setup, tmp_path, method=method, variant=variant, steps=5)
    np.testing.assert_array_equal(out.target_probs, mem.target_probs)
    np.testing.assert_array_equal(out.probs, mem.probs)


def test_cli_stream_on_writes_the_same_labels(digits_federation, tmp_path):
    from click.testing import CliRunner

    from mrtf.cli.main import cli
    from mrtf.io.labels import read_labels

    received, target, _ = digits_federation
    out = {}
    for mode in ("off", "on"):
        folder = tmp_path / mode
        res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target),
                                       "--labels", str(folder / "l.h5"), "--steps", "10",
                                       "--stream", mode, "--quiet"], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert [p.name for p in folder.iterdir()] == ["l.h5"]  # no scratch left
        out[mode] = read_labels(folder / "l.h5")
    np.testing.assert_array_equal(out["on"].labels, out["off"].labels)
    assert out["on"].attrs["method"] == out["off"].attrs["method"]


@pytest.mark.parametrize("extra", [["--class-prior", "uniform"], ["--aggregate", "median"],
                                   ["--trust"]])
def test_cli_stream_on_refuses_what_it_does_not_do(digits_federation, tmp_path, extra):
    from click.testing import CliRunner

    from mrtf.cli.main import cli

    received, target, _ = digits_federation
    res = CliRunner().invoke(cli, ["refine", str(received), "--data", str(target), "--labels",
                                   str(tmp_path / "l.h5"), "--stream", "on", *extra])
    assert res.exit_code == 2, res.output
    assert "not available on the streaming path" in res.output
    assert list(tmp_path.iterdir()) == []


def test_streaming_measures_novelty_but_distils_the_vote(setup, tmp_path):
    """A target new to the parties (they claim loss 0): in memory θ_{t+1} is adapted (SHOT);
    the streaming path measures the same gap, distils the vote and says so."""
    from dataclasses import replace

    from mrtf.io.bundles import ReceivedModel, ReceivedSet

    received, source = setup
    new = ReceivedSet([ReceivedModel(m.path, replace(m.meta, train_loss=0.0)
                                     if m.meta.role == "local" else m.meta, m.state_dict)
                       for m in received.models], [])
    mem, out = _both(new, source, tmp_path, method="adaptive", trust=False, steps=5)
    assert mem.info["novelty"]["adapt"]
    assert any("streaming path cannot adapt" in n for n in out.info["notes"])
