"""SHOT baseline (mrtf.refinery.shot): pseudo-labels (Eq. 4-6) and source-free adaptation."""

import numpy as np
import pytest
import torch
from torch import nn

from mrtf.errors import FusionError, InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import ShotSettings, shot_adapt, shot_pseudo_labels

FAST = ShotSettings(steps=12, batch_size=16, refresh_every=4)


def _clusters(seed=0, per=40, c=4, d=8):
    """``c`` well-separated clusters (distinct directions, as cosine distance needs) and
    confident probs of which 30% point to a wrong class."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(c), per)
    centers = np.eye(c, d) * 5.0
    feats = (centers[y] + rng.normal(0, 0.3, (len(y), d))).astype(np.float32)
    noisy = y.copy()
    wrong = rng.random(len(y)) < 0.3
    noisy[wrong] = (y[wrong] + rng.integers(1, c, wrong.sum())) % c
    probs = np.full((len(y), c), 0.1 / (c - 1), np.float32)
    probs[np.arange(len(y)), noisy] = 0.9
    return probs, feats, y


def _lenet(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model("lenet", 10, in_channels=1, image_size=28, **kw)


def _images(n=48, seed=0):
    return ArraySource(np.random.default_rng(seed).random((n, 1, 28, 28), dtype=np.float32))


def test_pseudo_labels_recover_clusters_from_noisy_probs():
    probs, feats, y = _clusters()
    assert (probs.argmax(1) != y).mean() > 0.2  # the model's own labels are quite wrong
    np.testing.assert_array_equal(shot_pseudo_labels(probs, feats), y)
    np.testing.assert_array_equal(shot_pseudo_labels(probs, feats, iterations=1), y)
    np.testing.assert_array_equal(shot_pseudo_labels(probs, feats, 0), probs.argmax(1))


def test_pseudo_labels_pure_int64_in_range():
    probs, feats, _ = _clusters(seed=1)
    p0, f0 = probs.copy(), feats.copy()
    a, b = shot_pseudo_labels(probs, feats), shot_pseudo_labels(probs, feats)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(probs, p0)
    np.testing.assert_array_equal(feats, f0)
    assert a.dtype == np.int64 and a.shape == (len(probs),)
    assert a.min() >= 0 and a.max() < probs.shape[1]


def test_pseudo_labels_only_predicted_classes_and_zero_features():
    """SHOT's code: a class nobody predicts gets no centroid; all-zero ReLU features (dead
    units) get a defined label thanks to the appended constant."""
    probs, feats, _ = _clusters(seed=2)
    probs = np.concatenate([probs, np.full((len(probs), 1), 0.05, np.float32)], 1)
    feats[:5] = 0.0
    labels = shot_pseudo_labels(probs, feats)
    assert labels.max() < probs.shape[1] - 1
    with pytest.raises(InputError):
        shot_pseudo_labels(probs[:-1], feats)


def test_adapt_freezes_last_linear_trains_the_rest():
    model = _lenet()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    head = model.classifier[-1]
    out = shot_adapt(model, _images(), FAST)
    assert out is model and not model.training
    assert head.weight.requires_grad and head.bias.requires_grad
    after = model.state_dict()
    for k in before:
        if k.startswith("classifier.4."):
            assert torch.equal(before[k], after[k]), k
        else:
            assert not torch.equal(before[k], after[k]), k


def test_adapt_restores_a_head_frozen_by_the_caller():
    model = _lenet()
    model.classifier[-1].bias.requires_grad_(False)
    shot_adapt(model, _images(), ShotSettings(steps=2, batch_size=16, beta=0.0))
    assert model.classifier[-1].weight.requires_grad
    assert not model.classifier[-1].bias.requires_grad


def test_adapt_deterministic_and_seed_matters():
    src = _images()
    runs = [shot_adapt(_lenet(), src, FAST, seed=s).state_dict() for s in (3, 3, 4)]
    for k in runs[0]:
        assert torch.equal(runs[0][k], runs[1][k]), k
    assert any(not torch.equal(runs[0][k], runs[2][k]) for k in runs[0])


def test_pseudo_labels_by_blocks_from_a_spill_equal_in_memory(tmp_path, monkeypatch):
    """The streaming refinery's features are a scratch file read by row blocks (blocks that
    do not divide M here): the same labels as from the array."""
    import mrtf.refinery.shot as shot
    from mrtf.refinery.spill import Scratch

    probs, feats, _ = _clusters(seed=3, per=50)
    want = shot_pseudo_labels(probs, feats)
    monkeypatch.setattr(shot, "_LABEL_BLOCK", 37)
    np.testing.assert_array_equal(shot_pseudo_labels(probs, feats), want)
    with Scratch(tmp_path) as sc:
        spill = sc.array("f", feats.shape)
        spill.write(0, feats)
        np.testing.assert_array_equal(shot_pseudo_labels(probs, spill), want)


def test_adapt_with_spilled_features_equals_in_memory(tmp_path):
    src = _images()
    a = shot_adapt(_lenet(), src, FAST, seed=3).state_dict()
    b = shot_adapt(_lenet(), src, FAST, seed=3, spill=True, scratch_dir=str(tmp_path))
    for k, v in b.state_dict().items():
        assert torch.equal(a[k], v), k
    assert list(tmp_path.iterdir()) == []  # the scratch folder is gone


def test_adapt_any_module_via_hook():
    """A plain nn.Sequential (no forward_features): the hook on the last Linear finds features."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 5))
    w_head, w_body = net[3].weight.clone(), net[1].weight.clone()
    src = ArraySource(np.random.default_rng(0).random((40, 1, 8, 8), dtype=np.float32))
    shot_adapt(net, src, FAST)
    assert torch.equal(net[3].weight, w_head) and not torch.equal(net[1].weight, w_body)
    with pytest.raises(InputError, match="nn.Linear"):
        shot_adapt(nn.Sequential(nn.Flatten()), src, FAST)


def test_adapt_batchnorm_single_sample_is_skipped():
    torch.manual_seed(0)
    model = build_model("convnet", 10, in_channels=1, image_size=8, norm="batch")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    src = ArraySource(np.random.default_rng(0).random((1, 1, 8, 8), dtype=np.float32))
    shot_adapt(model, src, FAST)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not model.training


@pytest.mark.parametrize("beta", [0.0, 0.3])
def test_non_finite_loss_raises_fusion_error(beta):
    model = _lenet()
    with torch.no_grad():
        model.body[0].weight[0, 0, 0, 0] = float("nan")
    with pytest.raises(FusionError):
        shot_adapt(model, _images(), ShotSettings(steps=3, batch_size=16, beta=beta))
    assert model.classifier[-1].weight.requires_grad


@pytest.mark.parametrize("bad", [
    {"steps": -1}, {"batch_size": 0}, {"lr": 0.0}, {"lr": float("nan")}, {"lr": float("inf")},
    {"beta": -0.1}, {"beta": float("nan")}, {"div_weight": -1.0}, {"refresh_every": -1},
    {"cluster_iters": -1},
])
def test_validate_rejects_bad_settings(bad):
    with pytest.raises(InputError, match=next(iter(bad))):
        ShotSettings(**bad).validate()
    with pytest.raises(InputError):
        shot_adapt(_lenet(), _images(4), ShotSettings(**bad))


def test_validate_accepts_defaults():
    ShotSettings().validate()
    ShotSettings(beta=0.0, div_weight=0.0, refresh_every=0, cluster_iters=0, steps=0).validate()


def test_the_diversity_term_aims_at_the_given_class_shares():
    """SHOT's Eq. 3 with π: the loss minus the entropy term is KL(p̄ ‖ π), which is 0 where
    the mean prediction is π; without π it is Σ p̄ log p̄ (KL to an even spread − log C)."""
    from mrtf.refinery.shot import _loss

    prior = (0.5, 0.3, 0.2)
    logits = torch.log(torch.tensor([prior, prior]))  # p̄ = π exactly
    ent = -(torch.tensor(prior) * torch.log(torch.tensor(prior))).sum()
    told = _loss(logits, None, ShotSettings(class_prior=prior))
    assert float(told - ent) == pytest.approx(0.0, abs=1e-4)
    even = _loss(logits, None, ShotSettings())
    assert float(even - ent) == pytest.approx(-float(ent), abs=1e-4)


def test_adapting_with_class_shares_moves_the_mean_prediction_to_them():
    images = _images(64)
    skew = (0.55,) + (0.05,) * 9
    cfg = ShotSettings(steps=40, batch_size=32, lr=1e-3, beta=0.0, div_weight=5.0)
    shares = []
    for settings in (cfg, ShotSettings(**{**cfg.__dict__, "class_prior": skew})):
        model = shot_adapt(_lenet(), images, settings, seed=0)
        with torch.no_grad():
            shares.append(float(torch.softmax(model(torch.from_numpy(images.x)), 1)
                                .mean(0)[0]))
    assert shares[1] > shares[0] + 0.1


@pytest.mark.parametrize("prior", [(1.0,), (0.5, 0.6), (1.0, 0.0), (float("nan"), 1.0)])
def test_validate_rejects_bad_class_shares(prior):
    with pytest.raises(InputError, match="class_prior"):
        ShotSettings(class_prior=prior).validate()


def test_class_shares_must_match_the_models_classes():
    with pytest.raises(InputError, match="3 class shares for a model with 10 classes"):
        shot_adapt(_lenet(), _images(8), ShotSettings(steps=2, class_prior=(0.2, 0.3, 0.5)))
