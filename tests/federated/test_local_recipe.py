"""The party recipe's knobs of the local update (LocalConfig) and ``mrtf simulate --recipe``."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mrtf.errors import InputError
from mrtf.federated import LocalConfig, RunConfig, local_train
from mrtf.federated.recipes import party_recipe
from mrtf.models import build_model
from mrtf.schedule import inverse_decay


def _digits(n=256):
    from sklearn.datasets import load_digits

    d = load_digits()
    x = torch.from_numpy((d.images[:n] / 16.0).astype(np.float32)[:, None])
    return x, torch.from_numpy(d.target[:n].astype(np.int64))


def _lenet(seed=0):
    torch.manual_seed(seed)
    return build_model("lenet", 10, in_channels=1, image_size=8)


def test_label_smoothing_is_shots_smoothed_cross_entropy():
    """SHOT's CrossEntropyLabelSmooth: targets (1 − ε)·onehot + ε/C (its digit/loss.py)."""
    logits, y = torch.randn(6, 10), torch.tensor([0, 3, 9, 1, 1, 4])
    target = 0.9 * F.one_hot(y, 10) + 0.1 / 10
    manual = -(target * F.log_softmax(logits, 1)).sum(1).mean()
    torch.testing.assert_close(F.cross_entropy(logits, y, label_smoothing=0.1), manual)


def test_label_smoothing_changes_training_and_default_is_unchanged():
    x, y = _digits()
    base = LocalConfig(steps=4, batch_size=32, lr=0.05)
    a = local_train(_lenet(), x, y, 10, base, seed=0)
    b = local_train(_lenet(), x, y, 10, LocalConfig(steps=4, batch_size=32, lr=0.05,
                                                     label_smoothing=0.0), seed=0)
    c = local_train(_lenet(), x, y, 10, LocalConfig(steps=4, batch_size=32, lr=0.05,
                                                     label_smoothing=0.1), seed=0)
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert any(not torch.equal(p, q) for p, q in zip(a.model.parameters(),
                                                     c.model.parameters()))


def test_inverse_decay_values():
    assert inverse_decay(0, 100) == pytest.approx(1.1 ** -0.75)
    assert inverse_decay(99, 100) == pytest.approx(11 ** -0.75)
    assert inverse_decay(49, 100) == pytest.approx(6 ** -0.75)
    with pytest.raises(ValueError):
        inverse_decay(0, 0)


def test_lr_decay_sets_the_optimiser_lr(monkeypatch):
    seen = []
    step = torch.optim.SGD.step

    def spy(self, *a, **kw):
        seen.append(self.param_groups[0]["lr"])
        assert self.param_groups[0]["nesterov"]
        return step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    x, y = _digits(64)
    cfg = LocalConfig(steps=4, batch_size=16, lr=0.01, lr_decay="inverse", nesterov=True)
    local_train(_lenet(), x, y, 10, cfg, seed=0)
    assert seen == pytest.approx([0.01 * (1 + 10 * i / 4) ** -0.75 for i in (1, 2, 3, 4)])


@pytest.mark.parametrize("kw", [{"label_smoothing": 1.0}, {"label_smoothing": -0.1},
                                {"lr_decay": "cosine"}, {"weight_decay": -1.0},
                                {"nesterov": True, "momentum": 0.0}])
def test_bad_recipe_knobs_are_refused(kw):
    with pytest.raises(ValueError):
        LocalConfig(**kw)


def test_shot_recipe_reaches_the_local_config():
    cfg = RunConfig(**party_recipe("shot"), local_augment=True)
    local = cfg.local_config()
    assert (cfg.arch, cfg.epochs, cfg.batch_size) == ("lenet_shot", 30, 64)
    assert (local.lr, local.label_smoothing, local.nesterov, local.lr_decay,
            local.weight_decay) == (0.01, 0.1, True, "inverse", 1e-3)
    assert local.augment is not None and local.augment.rotate == 10.0
    assert RunConfig().local_config() == LocalConfig(epochs=2, lr=0.05, batch_size=16)
    with pytest.raises(InputError, match="unknown party recipe"):
        party_recipe("fast")
