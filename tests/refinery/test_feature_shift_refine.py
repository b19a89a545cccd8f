"""The adaptive default reads the parties' BatchNorm feature shift (feature_shift.py, novelty.py)
on real data: SHOT's digit network (``lenet_shot``) on scikit-learn digits, three IID parties
that claim a loss as high as anything they could show on the target (so the claims alone would
say "familiar" and vote)."""

from pathlib import Path

import numpy as np
import pytest
import torch

from mrtf.data import load_builtin
from mrtf.federated import LocalConfig, local_train
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import RefineConfig, refine
from mrtf.refinery.adapt_start import label_information
from mrtf.refinery.branch_choice import MAX_SPREAD_LOSS
from mrtf.refinery.feature_shift import FEATURE_SHIFT
from mrtf.refinery.neighbour_vote import final_probs

KW = {"in_channels": 1, "image_size": 8}


@pytest.fixture(scope="module")
def parties():
    torch.set_num_threads(1)
    ds = load_builtin("digits")
    perm = np.random.default_rng(0).permutation(len(ds.y))
    train, target = perm[:1200], perm[1200:]
    x, y = torch.from_numpy(ds.x), torch.from_numpy(ds.y)
    torch.manual_seed(0)
    init = build_model("lenet_shot", 10, **KW)
    models = []
    for k, idx in enumerate(np.array_split(train, 3)):
        res = local_train(init, x[idx], y[idx], 10, LocalConfig(steps=120, lr=0.01,
                                                                 batch_size=32), seed=k)
        meta = BundleMeta(arch="lenet_shot", num_classes=10, arch_kwargs=dict(KW),
                          n_samples=res.n_samples, train_loss=5.0)  # a high claim
        models.append(ReceivedModel(Path(f"p{k}.safetensors"), meta, res.model.state_dict()))
    return ReceivedSet(models, []), ds.x[target], ds.y[target]


def _refine(received, x, reading: str = "auto"):
    return refine(received, ArraySource(x), RefineConfig(steps=15, batch_size=32,
                                                            progress=False, trust=False,
                                                            input_reading=reading))


def test_in_domain_target_votes(parties):
    received, x, _ = parties
    r = _refine(received, x)
    assert r.novelty.gap < 0.3 and r.novelty.feature_shift < FEATURE_SHIFT
    assert not r.novelty.adapt and r.branch.chosen == "vote"
    assert "BatchNorm feature shift" in r.novelty.line()


def test_a_new_domain_is_adapted_on_the_feature_shift_alone(parties):
    received, x, _ = parties
    greyed = np.clip(x + 0.3, 0.0, 1.0).astype(np.float32)  # a grey background: a new domain
    # read as given: the default's input reading would take the grey away (the next test)
    r = _refine(received, greyed, reading="off")
    assert r.novelty.gap < 0.3  # the claims alone would vote
    assert r.novelty.feature_shift > FEATURE_SHIFT and r.novelty.by == "feature shift"
    assert (r.branch.chosen, r.branch.by) == ("adapt", "novelty")
    # three parties: adapted from θ_{t+1} and from the vote's student, the one kept is said
    assert set(r.branch.start.information) == {"θ_{t+1}", "the vote's student"}
    assert r.branch.start.kept in r.branch.start.information
    assert "kept" in r.branch.line() and r.to_dict()["branch"]["start"]["kept"]
    # the kept adaptation spread its labels as far as the consensus: checked, and kept
    adapted, consensus = r.branch.spreads
    assert adapted >= consensus - MAX_SPREAD_LOSS
    # the labels are the kept model's own neighbour vote, the ones the choice scored
    assert label_information(r.probs) == pytest.approx(r.branch.start.information[
        r.branch.start.kept])
    again, _ = final_probs(r.model, ArraySource(greyed), r.config.vote_k)
    np.testing.assert_allclose(again, r.probs, atol=1e-5)
    d = r.to_dict()["novelty"]
    assert d["by"] == "feature shift" and d["feature_shift"] == r.novelty.feature_shift


def test_the_default_reads_a_grey_background_away(parties):
    received, x, _ = parties
    greyed = np.clip(x + 0.3, 0.0, 1.0).astype(np.float32)
    r = _refine(received, greyed)
    assert r.reading.foreground and r.input_reading.reason == "searched"
    # read as its foreground, the target is the parties' own domain again: they vote
    assert r.novelty.feature_shift < FEATURE_SHIFT and r.branch.chosen == "vote"


def test_a_kept_adaptation_that_merges_classes_gives_way_to_the_vote(parties, monkeypatch):
    """Both starts adapted, the kept one checked against the consensus' spread as the only
    start is (branch_choice.collapsed_adaptation): counted as merging classes here (the check
    made to fail on any spread), the result is the vote's student as distilled before SHOT,
    the very model the vote branch gives."""
    import mrtf.refinery.branch_choice as branch_choice
    import mrtf.refinery.methods.adaptive as adaptive

    received, x, _ = parties
    greyed = np.clip(x + 0.3, 0.0, 1.0).astype(np.float32)
    monkeypatch.setattr(branch_choice, "MAX_SPREAD_LOSS", -1.0)
    r = _refine(received, greyed, reading="off")
    assert r.novelty.adapt and (r.branch.chosen, r.branch.by) == ("vote", "collapsed adaptation")
    assert "SHOT merged classes" in r.branch.line() and r.branch.spreads is not None
    monkeypatch.setattr(adaptive, "choose_branch",
                        lambda *a, **k: branch_choice.BranchChoice("vote", "vote"))
    voted = _refine(received, greyed, reading="off")
    assert (voted.branch.chosen, voted.branch.by) == ("vote", "vote")
    np.testing.assert_array_equal(r.probs, voted.probs)
