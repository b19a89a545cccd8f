"""Issue 36: a function that moves the caller's model to the compute device puts it back, on
its own device and in its own train/eval modes (placement.py). On CPU the device is checked by
a spy on the model's ``.to`` (the last move is back home); on a CUDA machine the same tests
run with device "cuda", where the model really leaves and comes back."""

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from torch import nn

from mrtf.io.hdf5 import ArraySource
from mrtf.models import build_model
from mrtf.refinery.distill import distill
from mrtf.refinery.neighbour_vote import final_probs, predict_with_vote
from mrtf.refinery.placement import kept_home, lent
from mrtf.refinery.teachers import TeacherChunks, predict_probs, teacher_logits

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(scope="module")
def source():
    x = (load_digits().images[:300, None] / 16.0).astype(np.float32)
    return ArraySource(x)


@pytest.fixture
def caller(monkeypatch):
    """A LeNet in train mode with one submodule in eval mode, and the devices passed to its
    ``.to`` (a spy on nn.Module.to that records this module's moves only: the refinery's
    deep copies of it are not the caller's)."""
    torch.manual_seed(0)
    net = build_model("lenet", 10, in_channels=1, image_size=8).train()
    next(iter(net.children())).eval()
    moves: list = []
    real_to = nn.Module.to

    def spy(self, *args, **kwargs):
        device = torch._C._nn._parse_to(*args, **kwargs)[0]  # .to's own argument parsing
        if self is net and device is not None:
            moves.append(device)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", spy)
    return net, moves


def _modes(net):
    return [m.training for m in net.modules()]


def _assert_home(net, moves, params, modes):
    assert [m.training for m in net.modules()] == modes
    assert all(p is q for p, q in zip(net.parameters(), params))
    assert all(p.device.type == "cpu" for p in net.parameters())
    assert moves and moves[-1].type == "cpu"  # the last move is back home


CALLS = {
    "predict_with_vote": lambda net, src, dev: predict_with_vote(net, src, 3, device=dev,
                                                                 stack="loop"),
    "predict_with_vote_reference": lambda net, src, dev: predict_with_vote(
        net, src, 3, reference=64, device=dev),
    "final_probs_no_vote": lambda net, src, dev: final_probs(net, src, 0, device=dev),
    "predict_probs": lambda net, src, dev: predict_probs(net, src, 128, dev, "auto"),
    "teacher_logits_features": lambda net, src, dev: teacher_logits(
        [net, build_model("lenet", 10, in_channels=1, image_size=8)], src, 128, dev,
        features_of=net),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("call", sorted(CALLS))
def test_inference_leaves_the_callers_model_where_it_was(source, caller, device, call):
    net, moves = caller
    params, modes = list(net.parameters()), _modes(net)
    CALLS[call](net, source, device)
    assert torch.device(device).type in [d.type for d in moves]  # it ran on the device
    _assert_home(net, moves, params, modes)
    net(torch.from_numpy(source.read(0, 4)))  # the caller's next CPU forward works


@pytest.mark.parametrize("device", DEVICES)
def test_a_stopped_pass_puts_the_model_back(source, caller, device):
    net, moves = caller
    params, modes = list(net.parameters()), _modes(net)
    chunks = iter(TeacherChunks([net], source, 64, device))
    next(chunks)
    assert not net.training  # lent: eval mode while the pass runs
    chunks.close()  # the consumer stops early
    _assert_home(net, moves, params, modes)


@pytest.mark.parametrize("device", DEVICES)
def test_distill_returns_the_student_home_in_eval_mode(source, caller, device):
    net, moves = caller
    targets = np.full((len(source), 10), 0.1, np.float32)
    out = distill(net, source, targets, steps=3, batch_size=16, device=device)
    assert out is net and not net.training
    assert moves[-1].type == "cpu" and next(net.parameters()).device.type == "cpu"


def test_lent_and_kept_home_restore_on_error(caller):
    net, moves = caller
    params, modes = list(net.parameters()), _modes(net)
    with pytest.raises(RuntimeError), lent([net, None, net], torch.device("cpu")):
        assert not any(m.training for m in net.modules())
        raise RuntimeError("the pass failed")
    _assert_home(net, moves, params, modes)
    with pytest.raises(RuntimeError), kept_home(net):
        net.to("cpu", torch.float64)
        raise RuntimeError("training failed")
    assert moves[-1].type == "cpu"
