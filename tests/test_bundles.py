import json
import pickle

import pytest
import torch

from mrtf.errors import InputError
from mrtf.io import BundleMeta, load_bundle, load_received, save_bundle
from mrtf.models import build_model

KW = {"in_channels": 1, "image_size": 8}


def _meta(**over):
    base = dict(arch="lenet", num_classes=10, arch_kwargs=KW, party="p1",
                label_counts=list(range(10)), n_samples=45, train_loss=0.75, round=3)
    base.update(over)
    return BundleMeta(**base)


def _model(seed=0, num_classes=10):
    torch.manual_seed(seed)
    return build_model("lenet", num_classes, **KW)


def test_round_trip_bit_exact(tmp_path):
    model = _model()
    path = save_bundle(tmp_path / "a.safetensors", model, _meta())
    loaded = load_bundle(path)
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict[key], value)
    meta = loaded.meta
    assert (meta.arch, meta.num_classes, meta.arch_kwargs) == ("lenet", 10, KW)
    assert meta.label_counts == list(range(10)) and meta.n_samples == 45
    assert meta.train_loss == 0.75 and meta.round == 3 and meta.role == "local"
    x = torch.rand(2, 1, 8, 8)
    torch.testing.assert_close(loaded.build()(x), model.eval()(x), rtol=0, atol=0)


def test_pt_with_sidecar(tmp_path):
    model = _model()
    torch.save(model.state_dict(), tmp_path / "b.pt")
    (tmp_path / "b.json").write_text(json.dumps(
        {"mrtf.arch": "lenet", "mrtf.num_classes": 10, "mrtf.arch_kwargs": KW,
         "mrtf.label_counts": [1] * 10}))
    loaded = load_bundle(tmp_path / "b.pt")
    assert loaded.meta.label_counts == [1] * 10
    assert torch.equal(loaded.state_dict["classifier.0.weight"],
                       model.state_dict()["classifier.0.weight"])


class _Payload:
    """Unpickling this would create a file: the loader must refuse before running it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickle_with_code_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    with open(tmp_path / "evil.pt", "wb") as f:
        pickle.dump({"w": _Payload(str(marker))}, f)
    (tmp_path / "evil.json").write_text(json.dumps({"arch": "lenet", "num_classes": 10}))
    with pytest.raises(InputError, match="refused to load"):
        load_bundle(tmp_path / "evil.pt")
    assert not marker.exists()
    # Sanity check that the payload really would have run.
    with open(tmp_path / "evil.pt", "rb") as f:
        pickle.load(f)
    assert marker.exists()


def test_truncated_and_corrupt_safetensors(tmp_path):
    path = save_bundle(tmp_path / "a.safetensors", _model(), _meta())
    data = path.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.safetensors").write_bytes(b"\x00garbage" * 10)
    for name in ("trunc", "junk"):
        with pytest.raises(InputError, match="corrupt or truncated"):
            load_bundle(tmp_path / f"{name}.safetensors")


def test_shape_mismatch_and_wrong_class_count(tmp_path):
    save_bundle(tmp_path / "a.safetensors", _model(num_classes=5), _meta(num_classes=10,
                                                                          label_counts=None))
    with pytest.raises(InputError, match="has shape"):
        load_bundle(tmp_path / "a.safetensors")


def test_missing_keys(tmp_path):
    state = _model().state_dict()
    state.pop("classifier.4.bias")
    save_bundle(tmp_path / "a.safetensors", state, _meta())
    with pytest.raises(InputError, match="missing classifier.4.bias"):
        load_bundle(tmp_path / "a.safetensors")


def test_nan_weights(tmp_path):
    state = _model().state_dict()
    state["body.0.weight"][0, 0, 0, 0] = float("nan")
    save_bundle(tmp_path / "a.safetensors", state, _meta())
    with pytest.raises(InputError, match="NaN"):
        load_bundle(tmp_path / "a.safetensors")


def test_unknown_arch_and_bad_counts(tmp_path):
    state = _model().state_dict()
    from safetensors.torch import save_file
    head = _meta().to_header()
    save_file(state, str(tmp_path / "u.safetensors"), metadata={**head, "mrtf.arch": "foo"})
    with pytest.raises(InputError, match="unknown architecture"):
        load_bundle(tmp_path / "u.safetensors")
    save_file(state, str(tmp_path / "c.safetensors"),
              metadata={**head, "mrtf.label_counts": "[1, 2, 3]"})
    with pytest.raises(InputError, match="label_counts"):
        load_bundle(tmp_path / "c.safetensors")
    save_file(state, str(tmp_path / "n.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match="not an mrtf bundle"):
        load_bundle(tmp_path / "n.safetensors")


def test_custom_arch_in_received_file_is_not_run(tmp_path):
    from safetensors.torch import save_file
    save_file({"w": torch.zeros(1)}, str(tmp_path / "x.safetensors"),
              metadata={"mrtf.arch": "os:system", "mrtf.num_classes": "10"})
    with pytest.raises(InputError, match="may not run code"):
        load_bundle(tmp_path / "x.safetensors")


def test_missing_file_and_dir(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_bundle(tmp_path / "nope.safetensors")
    with pytest.raises(InputError, match="no such directory"):
        load_received(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no received models"):
        load_received(tmp_path / "empty")


def test_parties_must_agree_on_classes(tmp_path):
    save_bundle(tmp_path / "a.safetensors", _model(), _meta())
    save_bundle(tmp_path / "b.safetensors", _model(num_classes=5),
                _meta(num_classes=5, label_counts=None))
    with pytest.raises(InputError, match="disagree on the class count"):
        load_received(tmp_path)


def test_non_strict_lists_refused(tmp_path):
    save_bundle(tmp_path / "a.safetensors", _model(), _meta())
    (tmp_path / "b.safetensors").write_bytes(b"nonsense")
    rs = load_received(tmp_path, strict=False)
    assert len(rs.models) == 1 and rs.refused[0][0].name == "b.safetensors"
