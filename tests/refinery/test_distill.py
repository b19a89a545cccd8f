"""refinery/distill.py: the optimizers of the refinery step one tensor at a time (foreach
off), on CUDA as on the CPU: the multi-tensor kernels' CUDA modules cost host memory
(docs/gpu.md, "Host memory")."""

import numpy as np
import torch
from sklearn.datasets import load_digits

from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery.distill import distill
from mrtf.schedule import shot_sgd


def test_distillation_steps_one_tensor_at_a_time(monkeypatch):
    made = []
    real = torch.optim.Adam

    def spy(params, **kw):
        opt = real(params, **kw)
        made.append(opt)
        return opt

    monkeypatch.setattr(torch.optim, "Adam", spy)
    x = (load_digits().images[:64, None] / 16.0).astype(np.float32)
    targets = np.full((64, 10), 0.1, np.float32)
    net = build_model("lenet", 10, in_channels=1, image_size=8)
    distill(net, ArraySource(x), targets, steps=2, batch_size=16, device="cpu")
    assert len(made) == 1 and made[0].defaults["foreach"] is False


def test_shots_sgd_steps_one_tensor_at_a_time():
    opt = shot_sgd([torch.nn.Parameter(torch.zeros(3))], lr=0.01)
    assert opt.defaults["foreach"] is False and opt.defaults["nesterov"] is True
