"""mrtf.models.zoo on the meta device (io.limits.reference_shapes builds every received
architecture there): the flattened size from the layers' arithmetic equals a real forward's,
the state dict's shapes equal a real build's, and nothing imports torch's compiler stack."""

import subprocess
import sys

import pytest
import torch

from mrtf.io.limits import reference_shapes
from mrtf.models import build_model
from mrtf.models.zoo import _flat_dim, _sized

IMAGE_ARCHS = ["lenet", "lenet_shot", "convnet", "vgg8", "resnet8", "resnet20", "mlp"]


@pytest.mark.parametrize("arch", IMAGE_ARCHS)
@pytest.mark.parametrize("channels,size", [(1, 8), (1, 16), (1, 28), (3, 32), (2, 45)])
def test_meta_build_has_the_real_build_shapes(arch, channels, size):
    kwargs = {"in_channels": channels, "image_size": size}
    real = build_model(arch, 10, **kwargs).state_dict()
    assert reference_shapes(arch, 10, kwargs) == {k: (tuple(v.shape), v.dtype)
                                                  for k, v in real.items()}


@pytest.mark.parametrize("size", range(10, 40))
@pytest.mark.parametrize("ceil", [False, True])
def test_layer_arithmetic_equals_a_forward(size, ceil):
    nn = torch.nn
    body = nn.Sequential(nn.Conv2d(3, 4, 5, padding=2), nn.MaxPool2d(2, ceil_mode=ceil),
                         nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, dilation=2, padding=1),
                         nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=ceil), nn.Flatten())
    assert _sized(body, 3, size) == _flat_dim(body, 3, size)


def test_an_unknown_layer_falls_back_to_a_forward():
    body = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.AdaptiveAvgPool2d(4))
    assert _sized(body, 1, 12) is None
    assert _flat_dim(body, 1, 12) == 32


def test_meta_shapes_do_not_import_the_compiler_stack():
    """A meta-device init or norm imports torch._dynamo and sympy (1-2 s of every refine's
    start-up before the guards in zoo.py)."""
    code = ("import sys; from mrtf.io.limits import reference_shapes\n"
            "for a in ('lenet', 'lenet_shot', 'convnet', 'resnet8'):\n"
            "    reference_shapes(a, 10, {'in_channels': 1, 'image_size': 28})\n"
            "print(sorted(m for m in ('torch._dynamo', 'sympy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
