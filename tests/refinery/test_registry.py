"""A refinery method is one registered object (mrtf/refinery/registry.py): a new one, defined
and registered here, refines through the same pipeline as the built-in ones, in memory and
spilled, and the method table, the config's checks and the CLI's help pick it up; the methods
whose labels have no class prior say so when given class frequencies."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from mrtf.data import load_builtin
from mrtf.errors import InputError
from mrtf.io.bundles import load_received
from mrtf.io.hdf5 import ArraySource, H5Dataset
from mrtf.refinery import METHODS, RefineConfig, refine, teacher_logits
from mrtf.refinery.config import METHOD_SPECS
from mrtf.refinery.ensemble import logit_targets
from mrtf.refinery.methods.base import Ensemble
from mrtf.refinery.plan import unread_class_frequencies
from mrtf.refinery.registry import get_method, method_help, register_method, unregister_method
from mrtf.refinery.teachers import _softmax_np, avg_prob, newest_locals

NAME = "raw-avgprob"


class RawAvgProb(Ensemble):
    """The local models' plain softmax averaged (Eq. 4 without Eq. 6's stabilization)."""

    name = NAME
    summary = "unstabilized AvgProb targets (Eq. 4)"
    help = "plain AvgProb"
    teachers = "locals"

    def ensemble(self, logits, num_local, config, u):
        return logit_targets(logits, num_local, lambda lg: avg_prob(_softmax_np(lg)))


@pytest.fixture
def toy():
    method = register_method(RawAvgProb())
    yield method
    unregister_method(NAME)


def test_a_registered_method_is_listed_checked_and_helped(toy):
    assert METHODS[-1] == NAME and NAME in METHODS and METHOD_SPECS[NAME] is toy
    assert get_method(NAME) is toy
    assert "raw-avgprob (plain AvgProb)" in method_help()
    RefineConfig(method=NAME).validate()
    assert RefineConfig(method=NAME).vote_k == 0 and RefineConfig(method=NAME).jitter is None
    with pytest.raises(InputError, match="adaptive method only"):
        RefineConfig(method=NAME, class_prior="uniform").validate()
    with pytest.raises(ValueError, match="taken"):
        register_method(RawAvgProb())


def test_unregistered_method_is_refused():
    assert NAME not in METHODS
    with pytest.raises(InputError, match="method must be one of"):
        RefineConfig(method=NAME).validate()


def test_a_registered_method_refines_in_memory_and_spilled(toy, digits_federation, tmp_path):
    received = load_received(digits_federation[0])
    x = load_builtin("digits").x[:400]
    base = dict(method=NAME, steps=5, batch_size=32, progress=False, inference_batch=128)
    mem = refine(received, ArraySource(x), RefineConfig(stream="off", **base))
    out = refine(received, ArraySource(x), RefineConfig(stream="on", scratch_dir=str(tmp_path),
                                                        **base))
    teachers = [m.build() for m in newest_locals(received)]
    want = avg_prob(_softmax_np(teacher_logits(teachers, ArraySource(x), 128).logits))
    np.testing.assert_allclose(mem.target_probs, want, atol=1e-6)
    np.testing.assert_array_equal(out.target_probs, mem.target_probs)
    np.testing.assert_array_equal(out.probs, mem.probs)
    assert mem.config.method == NAME and mem.teachers == len(teachers)
    assert mem.model_probs is None  # the method does not vote
    assert isinstance(mem.model, torch.nn.Module) and list(Path(tmp_path).iterdir()) == []


def test_the_methods_whose_labels_read_class_frequencies_are_flagged(toy):
    takers = [m.name for m in METHOD_SPECS.values() if m.takes_class_frequencies]
    assert takers == ["adaptive", "shot", "nrc", "decision"]
    assert not toy.takes_class_frequencies  # a new method's default: no class prior


def _state(method, frequencies):
    return SimpleNamespace(method=get_method(method),
                           config=SimpleNamespace(class_frequencies=frequencies))


@pytest.mark.parametrize("method, reader", [
    ("feddf", "only the label-free estimate reads them"),
    ("mrtf", "only the label-free estimate reads them"),
    ("aad", "nothing in this run reads them (no teachers: no label-free estimate)"),
])
def test_a_method_without_a_class_prior_says_the_frequencies_do_not_steer_it(method, reader):
    got = unread_class_frequencies(_state(method, (2.0, 1.0)))
    assert got == [f"class frequencies: method {method} has no class prior; {reader}"]
    assert unread_class_frequencies(_state(method, None)) == []


@pytest.mark.parametrize("method", ["adaptive", "shot", "nrc", "decision"])
def test_a_method_with_a_class_prior_gets_no_such_note(method):
    assert unread_class_frequencies(_state(method, (2.0, 1.0))) == []


def test_fedavg_refines_with_the_note_once(digits_federation):
    received = load_received(digits_federation[0])
    with H5Dataset(digits_federation[1]) as target:
        told = refine(received, target, RefineConfig(method="fedavg", progress=False,
                                                     class_frequencies=(1.0,) * 10))
        plain = refine(received, target, RefineConfig(method="fedavg", progress=False))
    note = ("class frequencies: method fedavg has no class prior; nothing in this run reads "
            "them (no teachers: no label-free estimate)")
    assert told.notes.count(note) == 1
    assert not any(line.startswith("class frequencies:") for line in plain.notes)
    np.testing.assert_array_equal(told.probs, plain.probs)
