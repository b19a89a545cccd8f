"""SHOT's own target recipe (``ShotSettings.paper()``): SGD + schedule + epochs, head frozen."""

import numpy as np
import pytest
import torch

from mrtf.errors import InputError
from mrtf.federated import LocalConfig, local_train
from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery import ShotSettings, shot_adapt
from mrtf.refinery.shot import shot_settings


def test_paper_recipe_values_and_default_unchanged():
    p = ShotSettings.paper()
    assert (p.optimizer, p.lr, p.epochs, p.batch_size, p.beta, p.div_weight,
            p.cluster_iters, p.refresh_every) == ("sgd", 0.01, 30, 64, 0.1, 1.0, 2, 0)
    assert p.num_steps(1000) == 30 * 16 and p.num_steps(2007) == 30 * 32
    d = ShotSettings()
    assert (d.optimizer, d.lr, d.steps, d.epochs, d.beta) == ("adam", 3e-5, 500, 0, 0.3)
    assert d.num_steps(10_000) == 500
    assert shot_settings("paper") == p and shot_settings("mrtf") == d == shot_settings()
    with pytest.raises(InputError, match="unknown SHOT recipe"):
        shot_settings("fast")
    with pytest.raises(InputError, match="optimizer"):
        ShotSettings(optimizer="rmsprop").validate()
    with pytest.raises(InputError, match="epochs"):
        ShotSettings(epochs=-1).validate()


def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.images / 16.0).astype(np.float32)[:, None], d.target.astype(np.int64)


@pytest.fixture(scope="module")
def source():
    """A SHOT-recipe source model trained on the first 900 digits, and the digits."""
    x, y = _digits()
    torch.manual_seed(0)
    net = build_model("lenet_shot", 10, in_channels=1, image_size=8)
    cfg = LocalConfig(steps=60, batch_size=64, lr=0.01, label_smoothing=0.1, nesterov=True,
                      lr_decay="inverse", weight_decay=1e-3)
    model = local_train(net, torch.from_numpy(x[:900]), torch.from_numpy(y[:900]), 10, cfg,
                        seed=0).model
    return model, x, y


def _copy(model):
    m = build_model("lenet_shot", 10, in_channels=1, image_size=8)
    m.load_state_dict(model.state_dict())
    return m


def _acc(model, x, y):
    with torch.inference_mode():
        return float((model.eval()(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_sgd_schedule_and_frozen_head(monkeypatch, source):
    model, x, _ = source
    model = _copy(model)
    head = {k: v.clone() for k, v in model.classifier.state_dict().items()}
    body = model.body[0].weight.detach().clone()
    seen = []
    step = torch.optim.SGD.step

    def spy(self, *a, **kw):
        g = self.param_groups[0]
        seen.append((g["lr"], g["momentum"], g["nesterov"], g["weight_decay"]))
        return step(self, *a, **kw)

    monkeypatch.setattr(torch.optim.SGD, "step", spy)
    settings = ShotSettings(**{**ShotSettings.paper().__dict__, "epochs": 2, "batch_size": 50})
    shot_adapt(model, ArraySource(x[900:1100]), settings, seed=0)
    n = 2 * 4  # 2 epochs of ceil(200 / 50) steps
    assert [s[0] for s in seen] == pytest.approx([0.01 * (1 + 10 * i / n) ** -0.75
                                                  for i in range(1, n + 1)])
    assert {s[1:] for s in seen} == {(0.9, True, 1e-3)}
    for k, v in model.classifier.state_dict().items():  # SHOT keeps the hypothesis
        assert torch.equal(v, head[k]), k
    assert all(p.requires_grad for p in model.classifier.parameters())
    assert not torch.equal(model.body[0].weight, body)


def test_paper_recipe_adapts_real_digits_deterministically(source):
    """Target: 400 digits the source never saw, shifted in brightness and contrast (another
    domain). Two runs are identical; SHOT does not lose accuracy."""
    model, x, y = source
    xt = np.clip(0.35 + 0.6 * x[1100:1500], 0.0, 1.0).astype(np.float32)
    yt = y[1100:1500]
    before = _acc(model, xt, yt)
    settings = ShotSettings(**{**ShotSettings.paper().__dict__, "epochs": 3})
    runs = [shot_adapt(_copy(model), ArraySource(xt), settings, seed=3) for _ in range(2)]
    for p, q in zip(runs[0].state_dict().values(), runs[1].state_dict().values()):
        assert torch.equal(p, q)
    after = _acc(runs[0], xt, yt)
    assert after >= before - 0.01, (before, after)
