import pytest
import torch
from torch import nn

from mrtf.errors import InputError
from mrtf.models import available_archs, build_model

IMAGE_ARCHS = ["mlp", "lenet", "convnet", "vgg8", "resnet8", "resnet20"]
SHAPES = [(1, 8), (1, 28), (3, 28), (3, 32)]
# Feature sizes the reference networks have (docs/reference-code.md).
EXPECTED_FEATURES = {("mlp", 1, 28): 128, ("lenet", 1, 28): 256, ("convnet", 3, 32): 1024,
                     ("vgg8", 3, 32): 512, ("resnet8", 3, 32): 64, ("resnet20", 3, 32): 64}


def test_registry_lists_the_zoo():
    assert set(IMAGE_ARCHS + ["charlstm"]) <= set(available_archs())


@pytest.mark.parametrize("arch", IMAGE_ARCHS)
@pytest.mark.parametrize("channels,size", SHAPES)
def test_features_and_logits_in_one_pass(arch, channels, size):
    torch.manual_seed(0)
    model = build_model(arch, 7, in_channels=channels, image_size=size).eval()
    x = torch.rand(3, channels, size, size)
    h, logits = model.forward_features(x)
    assert logits.shape == (3, 7)
    assert h.shape == (3, model.feature_dim)
    torch.testing.assert_close(model(x), logits)
    want = EXPECTED_FEATURES.get((arch, channels, size))
    if want is not None:
        assert model.feature_dim == want


def test_charlstm():
    model = build_model("charlstm", 80).eval()
    h, logits = model.forward_features(torch.randint(0, 80, (2, 30)))
    assert h.shape == (2, 256) and logits.shape == (2, 80)


@pytest.mark.parametrize("norm,layer", [("batch", nn.BatchNorm2d), ("group", nn.GroupNorm)])
def test_norm_option(norm, layer):
    model = build_model("resnet8", 10, in_channels=3, image_size=32, norm=norm)
    assert any(isinstance(m, layer) for m in model.modules())
    none = build_model("vgg8", 10, in_channels=1, image_size=8, norm="none")
    assert not any(isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)) for m in none.modules())


def test_bad_names_and_kwargs():
    with pytest.raises(InputError, match="unknown architecture"):
        build_model("resnet50", 10)
    with pytest.raises(InputError, match="does not take"):
        build_model("lenet", 10, norm="batch")
    with pytest.raises(InputError, match="unknown norm"):
        build_model("vgg8", 10, norm="layer")
    with pytest.raises(InputError, match="num_classes"):
        build_model("lenet", 1)


def plain_net(num_classes: int = 10, width: int = 16) -> nn.Module:
    """A user's model without forward_features (imported by the test below)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(),
                         nn.Linear(width, num_classes))


def test_custom_model_gets_features_from_last_linear_input():
    model = build_model("tests.test_zoo:plain_net", 5, width=12).eval()
    x = torch.rand(4, 1, 8, 8)
    h, logits = model.forward_features(x)
    assert h.shape == (4, 12) and logits.shape == (4, 5)
    torch.testing.assert_close(h, torch.relu(model[1](model[0](x))))
    # nothing renamed: the keys are the user's own, as torch.save(model.state_dict()) wrote
    assert set(model.state_dict()) == set(plain_net(5, 12).state_dict())
    assert isinstance(model, nn.Sequential)
    with pytest.raises(InputError, match="cannot import"):
        build_model("tests.nope:factory", 5)
