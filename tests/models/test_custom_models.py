"""A user's own model class (mrtf/models/custom.py): built as written, no renamed weights,
features from its last nn.Linear, importable from the current folder, clear when not."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from mrtf.errors import InputError
from mrtf.io.bundles import load_bundle
from mrtf.models import build_model, input_kwargs

NET = textwrap.dedent("""
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self, num_classes=10, width=8):
            super().__init__()
            self.conv = nn.Conv2d(1, width, 3, padding=1)
            self.bn = nn.BatchNorm2d(width)
            self.fc = nn.Linear(width * 16, 32)
            self.head = nn.Linear(32, num_classes)

        def forward(self, x):
            h = torch.relu(self.bn(self.conv(x)))
            h = nn.functional.adaptive_avg_pool2d(h, 4).flatten(1)
            return self.head(torch.relu(self.fc(h)))


    class WithFeatures(Net):
        def forward_features(self, x):
            return torch.zeros(len(x), 3), self(x)


    def make(num_classes=10, width=8):
        return Net(num_classes, width)


    def make_with_features(num_classes=10):
        return WithFeatures(num_classes)


    def no_linear(num_classes=10):
        return nn.Sequential(nn.Conv2d(1, num_classes, 8), nn.Flatten())
    """)


@pytest.fixture
def in_folder(tmp_path, monkeypatch):
    """A user's folder holding ``usernet.py``, as the current folder (not on sys.path)."""
    (tmp_path / "usernet.py").write_text(NET)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "usernet", raising=False)
    yield tmp_path
    sys.modules.pop("usernet", None)


def test_weights_load_as_saved_and_features_come_from_the_last_linear(in_folder):
    model = build_model("usernet:make", 4, width=6).eval()
    assert type(model).__name__ == "Net"
    plain = sys.modules["usernet"].Net(4, 6)
    assert list(model.state_dict()) == list(plain.state_dict())  # nothing renamed or added
    model.load_state_dict(plain.state_dict())  # a torch.save(model.state_dict()) loads as is
    x = torch.rand(5, 1, 8, 8)
    h, logits = model.forward_features(x)
    torch.testing.assert_close(logits, plain.eval()(x))
    assert h.shape == (5, 32)
    torch.testing.assert_close(model.head(h), logits)  # h is what the classifier reads
    assert str(in_folder) not in sys.path  # the folder was on the path for the import only


def test_forward_features_of_the_class_is_used_when_present(in_folder):
    model = build_model("usernet:make_with_features", 3)
    h, _ = model.forward_features(torch.rand(2, 1, 8, 8))
    assert h.shape == (2, 3)


def test_a_model_without_a_linear_classifier_is_refused(in_folder):
    with pytest.raises(InputError, match="needs an nn.Linear"):
        build_model("usernet:no_linear", 3)


def test_a_missing_module_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError) as err:
        build_model("nosuchnet:make", 3)
    msg = str(err.value)
    assert "run mrtf from the folder that holds nosuchnet.py" in msg and "PYTHONPATH" in msg
    (tmp_path / "needsdep.py").write_text("import not_installed_pkg_xyz\n")
    with pytest.raises(InputError, match="needs 'not_installed_pkg_xyz', which is not "
                                         "installed"):
        build_model("needsdep:make", 3)
    sys.modules.pop("needsdep", None)
    with pytest.raises(InputError, match="module:factory"):
        build_model("not a module:make", 3)


def test_a_received_file_runs_user_code_only_when_trusted(in_folder):
    torch.save(build_model("usernet:make", 3).state_dict(), in_folder / "p.pt")
    (in_folder / "p.json").write_text('{"mrtf.arch": "usernet:make", "mrtf.num_classes": 3}')
    with pytest.raises(InputError, match="--trust-arch usernet:make"):
        load_bundle(in_folder / "p.pt")
    received = load_bundle(in_folder / "p.pt", trusted_archs=["usernet:make"])
    assert set(received.state_dict) == set(received.build().state_dict())
    # a state dict saved from nn.DataParallel gets the fix, not only the key lists
    torch.save({f"module.{k}": v for k, v in received.state_dict.items()}, in_folder / "p.pt")
    with pytest.raises(InputError, match=r"save model.module.state_dict\(\) instead"):
        load_bundle(in_folder / "p.pt", trusted_archs=["usernet:make"])


def test_student_kwargs_follow_the_factory_signature(in_folder):
    assert input_kwargs("usernet:make", (1, 8, 8)) == {}  # make takes no image size
    assert input_kwargs("mlp", (30,)) == {"in_features": 30}
    assert input_kwargs("lenet", (1, 8, 8)) == {"in_channels": 1, "image_size": 8}
    mlp = build_model("mlp", 2, in_features=30, hidden=16, feature_dim=8)
    assert mlp(torch.rand(4, 30)).shape == (4, 2)
