"""DECISION's adapter (mrtf/refinery/decision.py): the loss and the weighted pseudo-labels
against hand computation, the settings' checks, and the learned source weights on a toy
problem on real data (scikit-learn digits: two trained sources and one untrained)."""

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.data import load_builtin
from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery.decision import (
    DecisionSettings,
    decision_adapt,
    decision_loss,
    weighted_pseudo_labels,
)
from mrtf.refinery.methods.decision import Decision
from mrtf.refinery.shot import shot_pseudo_labels


def _np_softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def _basis(f):
    """SHOT's feature basis, by hand: a 1 appended, rows L2-normalised."""
    f = np.concatenate([f, np.ones((len(f), 1))], 1)
    return f / np.linalg.norm(f, axis=1, keepdims=True)


def _hard_centroids(f, labels, c):
    b = _basis(f)
    out = np.zeros((c, b.shape[1]))
    for k in range(c):
        if (labels == k).any():
            out[k] = b[labels == k].mean(0)
    return out


def test_loss_is_entropy_minus_diversity_plus_beta_ce_of_the_weighted_logits():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 5, 3)) * 2
    alpha = np.array([0.3, 0.7])
    labels = np.array([0, 2, 1, 1, 0])
    z = 0.3 * logits[0] + 0.7 * logits[1]  # θ_T = Σ α_j θ_j on the logits
    p = _np_softmax(z)
    ent = -(p * np.log(p)).sum(1).mean()
    mean = p.mean(0)
    div = (mean * np.log(mean + 1e-5)).sum()
    ce = -np.log(p[np.arange(5), labels]).mean()
    s = DecisionSettings(beta=0.25, div_weight=0.5)
    t = torch.tensor(logits, dtype=torch.float64)
    a = torch.tensor(alpha)
    got = decision_loss(t, a, torch.tensor(labels), s)
    assert float(got) == pytest.approx(ent + 0.5 * div + 0.25 * ce, rel=1e-9)
    assert float(decision_loss(t, a, None, s)) == pytest.approx(ent + 0.5 * div, rel=1e-9)
    # one source with all the weight: its own logits (not an average of probabilities)
    one = decision_loss(t, torch.tensor([0.0, 1.0], dtype=torch.float64), None, s)
    p1 = F.softmax(t[1], 1)
    want = -(p1 * p1.log()).sum(1).mean() + 0.5 * (p1.mean(0) * (p1.mean(0) + 1e-5).log()).sum()
    assert float(one) == pytest.approx(float(want), rel=1e-9)


def test_the_diversity_term_aims_at_the_given_class_shares():
    """L_div with the target's shares π: Σ p̄ log(p̄ / π) = KL(p̄ ‖ π), 0 at p̄ = π (up to ε);
    the loss is today's when none are given."""
    prior = (0.5, 0.3, 0.2)
    z = torch.log(torch.tensor([prior] * 4, dtype=torch.float64))  # every row's softmax is π
    logits = torch.stack([z, z])
    alpha = torch.tensor([0.4, 0.6], dtype=torch.float64)
    ent = -sum(v * np.log(v) for v in prior)
    told = decision_loss(logits, alpha, None, DecisionSettings(class_prior=prior))
    assert float(told) == pytest.approx(ent, abs=1e-4)  # L_div = KL(π ‖ π) ≈ 0
    even = decision_loss(logits, alpha, None, DecisionSettings())
    assert float(even) == pytest.approx(0.0, abs=1e-4)  # L_ent + Σ π log π = H - H
    rng = np.random.default_rng(2)
    t = torch.tensor(rng.normal(size=(2, 5, 3)) * 2)
    p = F.softmax(torch.einsum("k,kbc->bc", alpha, t), 1)
    mean = p.mean(0)
    ent = -(p * p.log()).sum(1).mean()
    pi = torch.tensor(prior, dtype=torch.float64)
    want = ent + 0.5 * (mean * torch.log((mean + 1e-5) / pi)).sum()
    got = decision_loss(t, alpha, None, DecisionSettings(div_weight=0.5, class_prior=prior))
    assert float(got) == pytest.approx(float(want), rel=1e-9)


@pytest.mark.parametrize("prior", [(1.0,), (0.5, 0.6), (1.0, 0.0), (float("nan"), 1.0)])
def test_settings_refuse_bad_class_shares(prior):
    with pytest.raises(InputError, match="DECISION: class_prior must be"):
        DecisionSettings(class_prior=prior).validate()


def test_class_shares_must_match_the_models_classes():
    models = [nn.Sequential(nn.Flatten(), nn.Linear(4, 3)) for _ in range(2)]
    source = ArraySource(np.zeros((4, 4), np.float32))
    with pytest.raises(InputError, match="DECISION: 2 class shares for a model with 3 classes"):
        decision_adapt(models, source, DecisionSettings(class_prior=(0.5, 0.5)))


def _two_sources(widths=(4, 4), m=60, c=3, seed=1):
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, c, m)
    feats, probs = [], []
    for d in widths:
        centres = rng.normal(size=(c, d)) * 3
        f = (centres[truth] + rng.normal(size=(m, d))).astype(np.float32)
        feats.append(np.maximum(f, 0))  # ReLU-like features
        probs.append(_np_softmax(rng.normal(size=(m, c)) + 2 * np.eye(c)[truth]).astype(
            np.float32))
    return probs, feats, c


def test_pseudo_labels_of_one_source_are_its_nearest_hard_centroid():
    probs, feats, c = _two_sources()
    first = shot_pseudo_labels(probs[0], feats[0], iterations=1)  # SHOT Eq. 4-5
    cent = _hard_centroids(feats[0], first, c)
    d = ((_basis(feats[0])[:, None] - cent[None]) ** 2).sum(-1)
    d[:, [k for k in range(c) if not (first == k).any()]] = np.inf
    got = weighted_pseudo_labels(probs[:1], feats[:1], np.array([1.0]))
    np.testing.assert_array_equal(got, d.argmin(1))


def test_pseudo_labels_of_equal_widths_use_the_weighted_features_and_centroids():
    probs, feats, c = _two_sources((4, 4))
    alpha = np.array([0.8, 0.2])
    fsum = sum(w * _basis(f) for w, f in zip(alpha, feats))
    csum = sum(w * _hard_centroids(f, shot_pseudo_labels(p, f, 1), c)
               for w, p, f in zip(alpha, probs, feats))
    want = ((fsum[:, None] - csum[None]) ** 2).sum(-1).argmin(1)
    np.testing.assert_array_equal(weighted_pseudo_labels(probs, feats, alpha), want)


def test_pseudo_labels_of_different_widths_sum_the_weighted_distances():
    probs, feats, c = _two_sources((4, 6))
    alpha = np.array([0.4, 0.6])
    d = 0
    for w, p, f in zip(alpha, probs, feats):
        cent = _hard_centroids(f, shot_pseudo_labels(p, f, 1), c)
        d = d + w * ((_basis(f)[:, None] - cent[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(weighted_pseudo_labels(probs, feats, alpha), d.argmin(1))


def test_a_class_no_source_clusters_into_is_never_a_label():
    probs, feats, c = _two_sources((4, 4), c=4)
    for p in probs:  # class 3 is nobody's argmax
        p[:, 3] = 0.0
        p /= p.sum(1, keepdims=True)
    got = weighted_pseudo_labels(probs, feats, np.array([0.5, 0.5]))
    assert not (got == 3).any()
    with pytest.raises(InputError, match="as many"):
        weighted_pseudo_labels(probs, feats[:1], np.array([0.5, 0.5]))


@pytest.mark.parametrize("field,value", [("lr", 0.0), ("lr", float("nan")), ("beta", -1.0),
                                         ("div_weight", float("inf")), ("batch_size", 0),
                                         ("sample_budget", -1), ("max_epochs", 0)])
def test_settings_refuse_bad_values(field, value):
    with pytest.raises(InputError, match=f"DECISION: {field}"):
        DecisionSettings(**{field: value}).validate()


def test_the_sample_budget_sets_the_epochs():
    s = DecisionSettings()
    assert s.epochs(10_000) == 4 and s.epochs(2_007) == 15 and s.epochs(500_000) == 1
    assert s.steps_per_epoch(10_000) == 313
    with pytest.raises(AttributeError):
        s.lr = 1.0  # frozen


@pytest.fixture(scope="module")
def toy():
    """Two LeNets trained on halves of 1,000 digits and one untrained; 797 target digits.
    One thread: these small convolutions only lose from a second one on a loaded machine."""
    torch.set_num_threads(1)
    d = load_builtin("digits")
    perm = np.random.default_rng(0).permutation(len(d.x))
    train, test = perm[:1000], perm[1000:]

    def fit(rows, seed):
        torch.manual_seed(seed)
        m = build_model("lenet_shot", 10, in_channels=1, image_size=8)
        opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(seed)
        for _ in range(100):
            b = rows[torch.randint(len(rows), (32,), generator=g).numpy()]
            loss = F.cross_entropy(m(torch.from_numpy(d.x[b])), torch.from_numpy(d.y[b]))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return m.eval()

    torch.manual_seed(3)
    noise = build_model("lenet_shot", 10, in_channels=1, image_size=8).eval()
    return [fit(train[:500], 1), fit(train[500:], 2), noise], d.x[test], d.y[test]


def _accuracy(model, x, y):
    with torch.no_grad():
        return float((model(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_weights_sum_to_one_and_leave_the_untrained_source(toy):
    models, x, y = toy
    torch.set_num_threads(1)
    single = [_accuracy(m, x, y) for m in models]
    assert single[2] < 0.3 < 0.9 < min(single[:2])
    heads = [m.classifier.weight.detach().clone() for m in models]
    body = models[0].bottleneck[0].weight.detach().clone()
    s = DecisionSettings(sample_budget=5 * len(x))
    res = decision_adapt([m for m in models], ArraySource(x), s, seed=0)
    assert res.alpha.sum() == pytest.approx(1.0) and (res.alpha > 0).all()
    # uniform at the start (1/3 each): the untrained source loses weight, the others gain
    assert res.alpha[2] < 0.25 and min(res.alpha[:2]) > 1 / 3
    assert res.epochs == 5 and res.steps == 5 * 25
    ensemble = float((res.probs.argmax(1) == y).mean())
    assert ensemble >= max(single[:2])
    np.testing.assert_allclose(res.probs.sum(1), 1.0, rtol=1e-5)
    # heads frozen (and trainable again afterwards), feature extractors adapted
    for m, h in zip(res.models, heads):
        assert torch.equal(m.classifier.weight, h) and m.classifier.weight.requires_grad
    assert not torch.equal(res.models[0].bottleneck[0].weight, body)


def test_adaptation_is_deterministic_given_the_seed(toy):
    models, x, _ = toy
    torch.set_num_threads(1)
    s = DecisionSettings(sample_budget=len(x))
    a = decision_adapt(copy.deepcopy(models), ArraySource(x), s, seed=5)
    b = decision_adapt(copy.deepcopy(models), ArraySource(x), s, seed=5)
    np.testing.assert_array_equal(a.probs, b.probs)
    np.testing.assert_array_equal(a.alpha, b.alpha)


def test_the_method_refuses_a_party_it_cannot_adapt_before_the_data_pass():
    class NoLinear(nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :10]

    plan = SimpleNamespace(names=["alice", "bob"], locals_=[nn.Linear(4, 10), NoLinear()])
    with pytest.raises(InputError, match="bob has no trainable nn.Linear"):
        Decision().notes(SimpleNamespace(plan=plan))
    assert Decision().notes(SimpleNamespace(plan=SimpleNamespace(
        names=["alice"], locals_=[nn.Linear(4, 10)]))) == []


def test_sources_of_different_architectures_adapt_together(toy):
    """Each source adapts on its own, so a LeNet beside SHOT's LeNet (features 84 against 256
    wide: the pseudo-labels sum the weighted distances) is fine."""
    models, x, y = toy
    torch.set_num_threads(1)
    torch.manual_seed(4)
    other = build_model("lenet", 10, in_channels=1, image_size=8).eval()
    res = decision_adapt([copy.deepcopy(models[0]), other], ArraySource(x),
                         DecisionSettings(sample_budget=len(x)), seed=0)
    assert res.probs.shape == (len(x), 10) and res.alpha.sum() == pytest.approx(1.0)
    assert res.alpha[0] > 0.5  # the trained source outweighs the untrained one
