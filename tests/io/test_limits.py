"""mrtf.io.limits.reference_shapes: a zoo architecture's shapes are built once per
(arch, classes, kwargs), and a caller cannot change what the next caller gets."""

from __future__ import annotations

import pytest
import torch

from mrtf.errors import InputError
from mrtf.io import limits
from mrtf.io.limits import reference_shapes


def test_zoo_shapes_are_built_once_and_returned_as_fresh_dicts(monkeypatch):
    import mrtf.models

    limits._zoo_shapes.cache_clear()
    built = []
    real = mrtf.models.build_model
    monkeypatch.setattr(mrtf.models, "build_model",
                        lambda *a, **k: built.append(a) or real(*a, **k))
    first = reference_shapes("lenet", 10, {"in_channels": 1, "image_size": 28})
    first.pop(next(iter(first)))  # the caller's copy, not the cache's
    second = reference_shapes("lenet", 10, {"image_size": 28, "in_channels": 1})
    assert len(built) == 1
    assert len(second) == len(first) + 1
    assert all(isinstance(s, tuple) and d == torch.float32 for s, d in second.values())
    reference_shapes("lenet", 7, {"in_channels": 1, "image_size": 28})  # another head
    assert len(built) == 2


def test_too_large_is_refused_every_time():
    for _ in range(2):  # a refusal is not cached as an answer
        with pytest.raises(InputError, match="parameters, more than"):
            reference_shapes("mlp", 10, {"hidden": 8192, "in_features": 1_000_000})
