"""Unit tests of the data-free building blocks against hand computations."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mrtf.datafree import (
    ConditionalGenerator,
    FusionConfig,
    UnconditionalGenerator,
    aca_average,
    choose_method,
    class_ensemble_weights,
    cls_loss,
    default_noise_dim,
    discrepancy_loss,
    diversity_loss,
    ensemble_logits,
    information_entropy_loss,
    label_distribution,
    latest_per_party,
    oca_average,
    stratified_labels,
)
from mrtf.datafree.common import collapse_warning
from mrtf.errors import InputError
from mrtf.io.bundles import BundleMeta, ReceivedModel
from mrtf.models import build_model

COUNTS = [[2, 0, 3], [1, 4, 0]]


def test_label_distribution_is_normalised_class_totals():
    # Eq. 9: p(y) ∝ Σ_k n_k^y = (3, 4, 3) / 10
    assert label_distribution(COUNTS).tolist() == pytest.approx([0.3, 0.4, 0.3])


def test_stratified_labels_follow_quota_and_are_seeded():
    p = torch.tensor([0.3, 0.4, 0.3, 0.0], dtype=torch.float64)
    y = stratified_labels(p, 10, torch.Generator().manual_seed(0))
    assert torch.bincount(y, minlength=4).tolist() == [3, 4, 3, 0]
    y7 = stratified_labels(p, 7, torch.Generator().manual_seed(1))
    counts = torch.bincount(y7, minlength=4).tolist()
    assert sum(counts) == 7 and counts[3] == 0
    assert all(2 <= c <= 3 for c in counts[:3])  # ⌊7·p⌋ or one more
    again = stratified_labels(p, 7, torch.Generator().manual_seed(1))
    assert torch.equal(y7, again)


def test_class_ensemble_weights_by_hand():
    # Eq. 10: α_k^y = n_k^y / Σ_i n_i^y
    alpha = class_ensemble_weights(COUNTS)
    expected = torch.tensor([[2 / 3, 0.0, 1.0], [1 / 3, 1.0, 0.0]])
    assert torch.allclose(alpha, expected)
    unseen = class_ensemble_weights([[1, 0], [3, 0]])
    assert torch.allclose(unseen[:, 1], torch.tensor([0.5, 0.5]))


def test_label_counts_table_is_checked():
    with pytest.raises(InputError):
        label_distribution([[0, 0], [0, 0]])
    with pytest.raises(InputError):
        class_ensemble_weights([1, 2, 3])


def test_ensemble_and_cls_loss_by_hand():
    t = torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 2.0, 0.0]]])  # K=2, B=1, C=3
    alpha = class_ensemble_weights(COUNTS)
    y = torch.tensor([0])
    assert torch.allclose(ensemble_logits(t, y, alpha), torch.tensor([[2 / 3, 2 / 3, 0.0]]))
    ce0 = -math.log(math.e / (math.e + 2))
    ce1 = -math.log(1 / (1 + math.e ** 2 + 1))
    assert cls_loss(t, y, alpha).item() == pytest.approx(2 / 3 * ce0 + 1 / 3 * ce1, rel=1e-5)


def test_discrepancy_zero_when_student_matches_and_positive_otherwise():
    t = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 0])
    alpha = torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])  # one teacher per class
    match = ensemble_logits(t, y, alpha)
    for kind in ("kl", "kl_per_teacher", "l1"):
        assert discrepancy_loss(match, t, y, alpha, kind).item() == pytest.approx(0, abs=1e-6)
        assert discrepancy_loss(torch.zeros(4, 3), t, y, alpha, kind).item() > 1e-3


def test_diversity_loss_by_hand():
    z = torch.tensor([[0.0, 0.0], [1.0, 3.0]])
    x = torch.tensor([[[0.0, 0.0]], [[0.5, 0.1]]])
    # pairs (0,1),(1,0): mean((z_i-z_j)^2) = 5, mean|x_i-x_j| = 0.3; diagonal pairs 0
    assert diversity_loss(z, x).item() == pytest.approx(math.exp(-(2 * 5 * 0.3) / 4))
    lit = math.exp(-(2 * math.sqrt(10) * math.sqrt(0.26)) / 4)
    assert diversity_loss(z, x, "norm").item() == pytest.approx(lit, rel=1e-5)
    same = diversity_loss(torch.randn(5, 3), torch.ones(5, 1, 2, 2))
    assert same.item() == pytest.approx(1.0)  # identical samples: no diversity


@pytest.mark.parametrize("shape", [(1, 8, 8), (1, 28, 28), (3, 28, 28), (3, 32, 32)])
def test_generators_make_images_of_the_input_shape(shape):
    torch.manual_seed(0)
    g = ConditionalGenerator(10, shape)
    x = g(torch.randn(4, g.noise_dim), torch.tensor([0, 1, 2, 9]))
    assert tuple(x.shape) == (4, *shape) and 0 <= x.min() and x.max() <= 1
    u = UnconditionalGenerator(shape, activation="tanh")
    xu = u(torch.randn(3, 100))
    assert tuple(xu.shape) == (3, *shape) and xu.min() >= -1 and xu.min() < 0


def test_noise_dim_defaults():
    assert default_noise_dim(10) == 100 and default_noise_dim(100) == 256
    assert ConditionalGenerator(100, (3, 32, 32)).noise_dim == 256


def test_generator_rejects_bad_settings():
    with pytest.raises(InputError):
        ConditionalGenerator(10, (1, 8, 8), activation="relu")
    with pytest.raises(InputError):
        UnconditionalGenerator((1, 2, 2))


def _model(party, rnd, n, seed, counts=None, role="local"):
    torch.manual_seed(seed)
    net = build_model("lenet", 3, in_channels=1, image_size=8)
    meta = BundleMeta(arch="lenet", num_classes=3, arch_kwargs={"in_channels": 1,
                      "image_size": 8}, party=party, round=rnd, n_samples=n,
                      label_counts=counts, role=role)
    return ReceivedModel(Path(f"{party}-{rnd}.safetensors"), meta, net.state_dict())


def test_oca_keeps_latest_model_per_party_weighted_by_size():
    a1, a3 = _model("A", 1, 10, 0), _model("A", 3, 30, 1)
    b2, c = _model("B", 2, 10, 2), _model("C", None, 20, 3)
    models = [a1, b2, a3, c]
    assert [m.path.stem for m in latest_per_party(models)] == ["A-3", "B-2", "C-None"]
    oca, weights = oca_average(models)
    assert weights == pytest.approx([0.5, 1 / 6, 1 / 3])
    key = "classifier.0.weight"
    hand = (30 * a3.state_dict[key] + 10 * b2.state_dict[key] + 20 * c.state_dict[key]) / 60
    assert torch.allclose(oca.state_dict()[key], hand, atol=1e-6)
    aca, _ = aca_average(models)  # latest round present is 3: A's model only
    assert torch.allclose(aca.state_dict()[key], a3.state_dict[key])


def test_choose_method():
    full = [_model("A", 0, 5, 0, [1, 2, 2]), _model("B", 0, 5, 1, [0, 5, 0])]
    assert choose_method(full)[0] == "fedftg"
    assert choose_method(full, "fedkf")[0] == "fedkf"
    partial = [full[0], _model("B", 0, 5, 1)]
    method, reason = choose_method(partial)
    assert method == "fedkf" and "B" in reason
    with pytest.raises(InputError, match="B has no label counts: use --datafree fedkf or give"):
        choose_method(partial, "fedftg")
    with pytest.raises(InputError, match="no local models"):
        choose_method([_model("S", 0, 5, 2, role="global")])
    with pytest.raises(InputError):
        choose_method(full, "fedavg")


@pytest.mark.parametrize("bad", [dict(method="x"), dict(rounds=0), dict(batch_size=1),
                                 dict(gen_lr=0.0), dict(lambda_dis=-1.0), dict(lr_decay=0.0),
                                 dict(discrepancy="l2"), dict(momentum=1.0)])
def test_config_validation(bad):
    with pytest.raises(InputError):
        FusionConfig(**bad).validate()


def test_config_resolves_method_defaults():
    ftg = FusionConfig().resolved("fedftg")
    kf = FusionConfig(gen_lr=0.5).resolved("fedkf")
    assert (ftg.batch_size, ftg.gen_lr, ftg.student_lr) == (50, 0.01, 0.1)
    assert (kf.batch_size, kf.gen_lr, kf.student_lr) == (64, 0.5, 0.01)


def test_information_entropy_loss_bounds():
    uniform = torch.full((4, 5), 0.2)
    assert information_entropy_loss(uniform).item() == pytest.approx(0.0, abs=1e-6)
    one = torch.zeros(4, 5)
    one[:, 2] = 1
    assert information_entropy_loss(one).item() == pytest.approx(1.0, abs=1e-5)


def test_collapse_warning():
    assert collapse_warning(torch.ones(6, 1, 4, 4), 1e-3, "fedftg")
    assert not collapse_warning(torch.rand(6, 1, 4, 4), 1e-3, "fedftg")
