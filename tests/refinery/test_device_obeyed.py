"""``--device cpu`` keeps every stage on the CPU even where CUDA is present (issue 36).

CUDA's presence is faked: ``torch.cuda.is_available`` says True, picking CUDA sets nothing
process-wide (``reproducible_cuda`` stubbed), faiss-gpu is absent, and every torch-on-device
entry point (CLR, the k-means view, the target neighbourhoods, the consensus' EM, the
calibration's temperature fit and signal tallies, the novelty's entropies and agreement, Eq. 6's
softmax, std and per-source statistics) raises instead of running, so no CUDA call can happen. With
the refine's device "cpu" each call site must take the CPU path; given the device "cuda"
(or nothing: CUDA when present) the same call reaches the device, which shows the fake is
seen."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits

import mrtf.compute.backend as bk
import mrtf.device
import mrtf.refinery.cluster_torch as ct
import mrtf.refinery.consensus_torch as cth
import mrtf.refinery.ensemble as ensemble
import mrtf.refinery.novelty as novelty
import mrtf.trust.calibration as cal
import mrtf.trust.neighbours as tn
from mrtf.compute.backend import Backend
from mrtf.io import H5Dataset, load_received
from mrtf.io.hdf5 import ArraySource
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.adaptive import ConsensusInputs, consensus_targets
from mrtf.refinery.cluster import prototype_targets
from mrtf.refinery.methods.mrtf import MrTF
from mrtf.refinery.methods.st_rd import STRD
from mrtf.refinery.trusted import calibrated, local_signals
from mrtf.refinery.votes import MemoryProbs, SourceStats

CUDA = torch.device("cuda")


class MovedToDevice(Exception):
    """A stage tried to compute on the (fake) CUDA device."""


def _refuse(*args, **kwargs):
    raise MovedToDevice


@pytest.fixture
def cuda_present(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(mrtf.device, "reproducible_cuda", lambda: None)
    monkeypatch.setattr(bk, "faiss_gpu_available", lambda: False)
    for name in ("prototype_targets", "kmeans_centroids", "assign_nearest"):
        monkeypatch.setattr(ct, name, _refuse)
    monkeypatch.setattr(tn, "_device_neighbours", _refuse)
    monkeypatch.setattr(cth, "em_torch", _refuse)
    monkeypatch.setattr(cal, "temperature_torch", _refuse)
    monkeypatch.setattr(cal, "tallies_torch", _refuse)
    for name in ("entropy_sums", "agreeing_pairs"):
        monkeypatch.setattr(novelty, name, _refuse)
    for name in ("stabilized_softmax", "teacher_stds"):
        monkeypatch.setattr(ensemble, name, _refuse)
    monkeypatch.setattr(SourceStats, "_add_on_device", _refuse)
    assert bk.choose_backend(None) == Backend("torch", CUDA)  # the fake is seen


@pytest.fixture(scope="module")
def digits():
    """Digits pixels (as features and as the target), targets 70 % right, and three
    sources' softmax around them."""
    d = load_digits()
    rng = np.random.default_rng(0)
    m = 600
    noisy = np.where(rng.random(m) < 0.7, d.target[:m], rng.integers(0, 10, m))
    targets = np.full((m, 10), 0.02, np.float32)
    targets[np.arange(m), noisy] = 0.82
    probs = np.stack([np.roll(targets, i, axis=0) * 0.2 + targets * 0.8 for i in range(3)])
    return d.data[:m].astype(np.float32), targets, probs.astype(np.float32)


def _mrtf_state(feats, targets, dev):
    config = SimpleNamespace(tau=4.0, clr_iterations=1, variant="paper", clr_min_round=5)
    return SimpleNamespace(config=config, features=feats, dev=dev, timings={},
                           received=SimpleNamespace(models=[]))


def test_clr_follows_the_refine_device(cuda_present, digits, monkeypatch):
    feats, targets, _ = digits
    monkeypatch.setattr(STRD, "targets", lambda self, state: targets)
    got = MrTF().targets(_mrtf_state(feats, targets, torch.device("cpu")))
    np.testing.assert_array_equal(
        got, prototype_targets(targets, feats, backend=Backend("faiss-cpu", torch.device("cpu"))))
    with pytest.raises(MovedToDevice):
        MrTF().targets(_mrtf_state(feats, targets, CUDA))


def _consensus(probs, feats, device):
    stats = SourceStats(*probs.shape[::2])
    stats.add(probs)
    return consensus_targets(MemoryProbs(probs), stats, ConsensusInputs(
        ["a", "b", "c"], probs[-1], feats, 0, 1, "learned", None, None, device))


def test_the_kmeans_view_follows_the_refine_device(cuda_present, digits):
    """Weak sources (the cluster view counts: λ > 0), its k-means on the CPU."""
    feats, _, probs = digits
    flat = (probs * 0.1 + 0.09).astype(np.float32)  # unsure sources: the clusters count
    out = _consensus(flat, feats, "cpu")
    assert out.cluster_weight > 0 and out.sources[-1].name == "clusters"
    with pytest.raises(MovedToDevice):
        _consensus(flat, feats, "cuda")
    with pytest.raises(MovedToDevice):
        _consensus(flat, feats, None)


def _signals_state(x, probs, dev):
    logits = np.log(probs[:2])
    return SimpleNamespace(num_local=2, logits=SimpleNamespace(view=logits),
                           before=probs[-1], storage=SimpleNamespace(signals_block=None),
                           source=ArraySource(x), dev=dev,
                           config=SimpleNamespace(class_frequencies=None))


def test_target_neighbourhoods_follow_the_refine_device(cuda_present, digits):
    feats, _, probs = digits
    x = feats.reshape(-1, 1, 8, 8) / 16.0
    signals = local_signals(_signals_state(x, probs, torch.device("cpu")))
    np.testing.assert_array_equal(signals.neighbours,
                                  tn.target_neighbours(ArraySource(x), device="cpu"))
    with pytest.raises(MovedToDevice):
        local_signals(_signals_state(x, probs, CUDA))


@pytest.fixture(scope="module")
def numpy_consensus(digits):
    """The consensus of the three sources (no cluster view) on the CPU, CUDA not faked."""
    return _consensus(digits[2], None, "cpu")


def test_the_consensus_em_follows_the_refine_device(numpy_consensus, cuda_present, digits):
    """No cluster view (no features): only the EM could move."""
    _, _, probs = digits
    out = _consensus(probs, None, "cpu")
    assert out.consensus.iterations > 1
    np.testing.assert_array_equal(out.targets, numpy_consensus.targets)
    with pytest.raises(MovedToDevice):
        _consensus(probs, None, "cuda")


def test_the_calibration_follows_the_refine_device(cuda_present, digits):
    feats, _, probs = digits
    x = feats.reshape(-1, 1, 8, 8) / 16.0
    signals = local_signals(_signals_state(x, probs, torch.device("cpu")))
    got, _ = calibrated(probs[0], probs[-1], signals, None, torch.device("cpu"))
    assert got.temperature == cal.temperature_for(probs[0], got.estimated_accuracy)
    with pytest.raises(MovedToDevice):
        calibrated(probs[0], probs[-1], signals, None, CUDA)


def test_the_default_refine_stays_on_the_cpu(cuda_present, digits_federation):
    """The whole default (adaptive: its k-means view, EM, neighbourhoods, calibration) with
    ``device="cpu"`` reaches no device entry point although CUDA looks present."""
    received, target, _ = digits_federation
    with H5Dataset(target) as src:
        res = refine(load_received(received), src,
                     RefineConfig(steps=5, seed=0, progress=False, device="cpu"))
    assert res.probs.shape == (len(res.probs), 10) and res.consensus is not None


def test_the_novelty_and_eq6_softmax_follow_the_refine_device(cuda_present, digits):
    """The logit reads the issue moved to the device: numpy for "cpu", the device for CUDA."""
    logits = np.log(digits[2] + 1e-6)
    paper = RefineConfig(variant="paper")
    cpu = torch.device("cpu")
    assert novelty.target_novelty(logits, [0.5, 0.5, 0.5], device=cpu).target_entropy > 0
    assert len(list(ensemble.stabilized_blocks(logits, paper, cpu))) == 1
    with pytest.raises(MovedToDevice):
        novelty.target_novelty(logits, [0.5, 0.5, 0.5], device=CUDA)
    with pytest.raises(MovedToDevice):
        next(ensemble.stabilized_blocks(logits, paper, CUDA))
