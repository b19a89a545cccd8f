"""SHOT's digit network in the zoo (``lenet_shot``): shapes, features, weight-normalised head."""

import torch
from torch import nn

from mrtf.models import LeNetShot, WeightNormLinear, build_model
from mrtf.refinery.shot import shot_adapt  # noqa: F401  (the hypothesis rule it relies on)


def _net(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model("lenet_shot", 10, **({"in_channels": 1, "image_size": 28} | kw))


def test_shapes_and_features_are_the_heads_input():
    net = _net().eval()
    x = torch.rand(5, 1, 28, 28)
    h, logits = net.forward_features(x)
    assert isinstance(net, LeNetShot) and net.feature_dim == 256
    assert h.shape == (5, 256) and logits.shape == (5, 10)
    torch.testing.assert_close(net.classifier(h), logits)
    torch.testing.assert_close(net(x), logits)
    # SHOT's 800-d conv features (50 × 4 × 4 at 28 px) feed the 256-d bottleneck
    assert net.bottleneck[0].in_features == 800
    assert [type(m) for m in net.bottleneck] == [nn.Linear, nn.BatchNorm1d, nn.Dropout]


def test_other_input_shapes():
    assert _net(in_channels=3, image_size=32).eval()(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    assert _net(image_size=16).eval()(torch.rand(2, 1, 16, 16)).shape == (2, 10)


def test_head_is_weight_normalised_and_the_last_linear():
    net = _net().eval()
    head = net.classifier
    assert isinstance(head, WeightNormLinear) and isinstance(head, nn.Linear)
    assert [m for m in net.modules() if isinstance(m, nn.Linear)][-1] is head
    h = torch.randn(4, 256)
    before = head(h)
    torch.testing.assert_close(before, nn.functional.linear(h, head.weight, head.bias))
    with torch.no_grad():
        head.weight.mul_(3.0)  # the direction's scale does not matter ...
    torch.testing.assert_close(head(h), before)
    with torch.no_grad():
        head.weight_g.mul_(2.0)  # ... the norms g do
    torch.testing.assert_close(head(h) - head.bias, 2 * (before - head.bias))


def test_inputs_are_normalised_inside_and_state_round_trips():
    a, b = _net(seed=1).eval(), _net(seed=2).eval()
    assert "classifier.weight_g" in a.state_dict()
    b.load_state_dict(a.state_dict())
    x = torch.rand(3, 1, 28, 28)
    torch.testing.assert_close(a(x), b(x))
    # (x − 0.5) / 0.5 inside: the first conv sees [−1, 1]
    seen = []
    a.body[0].register_forward_pre_hook(lambda _m, inp: seen.append(inp[0]))
    a(torch.zeros(1, 1, 28, 28))
    assert float(seen[0].min()) == -1.0 and float(seen[0].max()) == -1.0
