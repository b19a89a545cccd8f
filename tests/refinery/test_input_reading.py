"""mrtf/refinery/input_reading.py: how the target is read, on real digits (MNIST, USPS from
../shared/data): the zoom, the foreground contrast, the tie, the bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from mrtf.data import load_standard
from mrtf.errors import InputError
from mrtf.io.hdf5 import ArraySource
from mrtf.io.reading import Reading, ReadSource, rescale
from mrtf.refinery import RefineConfig
from mrtf.refinery.input_reading import (
    ENLARGEMENTS,
    READINGS,
    ReadingChoice,
    choose_reading,
    kept_reading,
    parse_input_reading,
    sample_rows,
    search_with_enlargements,
)

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture(scope="module")
def digits():
    if not (SHARED_DATA / "SHA256SUMS").is_file():
        pytest.fail(f"{SHARED_DATA.resolve()}: the standard datasets are missing")
    d = SHARED_DATA.resolve()
    mnist = load_standard("mnist", "train", data_dir=d)
    return {"mnist-train": (mnist.x[:6000], mnist.y[:6000]),
            "mnist": load_standard("mnist", "test", data_dir=d),
            "usps": load_standard("usps", "test", size=28, data_dir=d),
            "usps-framed": load_standard("usps", "test", frame="mnist", data_dir=d)}


class Centroids(nn.Module):
    """A party that learnt MNIST's class means: logits = -‖x - μ_c‖² / 10."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        super().__init__()
        mu = np.stack([x[y == c].mean(0) for c in range(10)])
        self.register_buffer("mu", torch.from_numpy(mu).flatten(1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return -torch.cdist(z.reshape(len(z), -1), self.mu) ** 2 / 10


@pytest.fixture(scope="module")
def party(digits):
    return Centroids(*digits["mnist-train"]).eval()


def _accuracy(party: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((party(torch.from_numpy(x)).argmax(1).numpy() == y).mean())


def test_usps_that_fills_its_frame_is_read_smaller(digits, party):
    usps = digits["usps"]
    choice = choose_reading([party], ArraySource(usps.x[:600]), 10)
    assert choice.reason == "searched" and choice.sample == 600
    assert set(choice.information) == {r.spec() for r in READINGS}
    assert choice.reading.scale in (0.7, 0.8)
    # scored with y here only: the chosen reading is the better one
    x, y = usps.x[:600], usps.y[:600]
    assert _accuracy(party, choice.reading.apply(x), y) > _accuracy(party, x, y) + 0.02


def test_inverted_digits_are_read_as_their_foreground(digits, party):
    x, y = 1.0 - digits["mnist"].x[:600], digits["mnist"].y[:600]  # dark strokes on white
    choice = choose_reading([party], ArraySource(x), 10)
    assert choice.reading == Reading(1.0, True)
    assert _accuracy(party, choice.reading.apply(x), y) > _accuracy(party, x, y) + 0.3


@pytest.mark.parametrize("name", ["mnist", "usps-framed"])
def test_data_prepared_as_the_parties_is_read_as_given(digits, party, name):
    choice = choose_reading([party], ArraySource(digits[name].x[:600]), 10)
    assert choice.reading == Reading() and not choice.changed
    assert "read as given" in choice.line()


def test_a_lead_under_the_tie_keeps_one():
    x = np.random.default_rng(0).random((64, 1, 12, 12), dtype=np.float32)

    class Flat(nn.Module):  # the same prediction at every factor: all ties
        def forward(self, z):
            return torch.zeros(len(z), 4) + torch.arange(4.0)

    choice = choose_reading([Flat()], ArraySource(x), 4)
    assert choice.reading == Reading()


def test_vectors_are_not_searched():
    x = np.zeros((10, 20), np.float32)
    choice = choose_reading([nn.Linear(20, 3)], ArraySource(x), 3)
    assert choice == ReadingChoice(Reading(), reason="not images")
    assert "not images" in choice.line()


def test_the_sample_is_bounded_by_parties_and_seeded():
    assert len(sample_rows(500, 10, 0)) == 500
    assert len(sample_rows(100_000, 1, 0)) == 2000
    assert len(sample_rows(100_000, 50, 0)) == 400
    assert len(sample_rows(100_000, 1000, 0)) == 256
    a, b = sample_rows(100_000, 10, 3), sample_rows(100_000, 10, 3)
    assert np.array_equal(a, b) and np.all(np.diff(a) > 0)


@pytest.mark.parametrize("text,want", [("auto", "auto"), ("Search", "search"), ("off", "off"),
                                       ("0.7", Reading(0.7)), ("fg:2", Reading(2.0, True))])
def test_parse(text, want):
    assert parse_input_reading(text) == want


@pytest.mark.parametrize("text", ["big", "0.1", "3", "nan", "", "fg:9"])
def test_parse_refuses(text):
    with pytest.raises(ValueError, match="input reading"):
        parse_input_reading(text)
    with pytest.raises(InputError, match="input reading"):
        RefineConfig(input_reading=text).validate()


def test_line_names_the_reading_and_the_information():
    c = ReadingChoice(Reading(0.7), {"0.7": 0.72, "1": 0.43}, 2000)
    assert c.changed and "0.7× its size" in c.line() and "0.720" in c.line()
    assert c.to_dict()["reading"] == "0.7" and c.to_dict()["information"]["1"] == 0.43
    assert "--input-reading" in ReadingChoice(Reading(0.8), reason="given").line()


def test_a_read_source_is_what_the_reading_reads(digits):
    x = digits["usps"].x[:50]
    np.testing.assert_allclose(ReadSource(ArraySource(x), Reading(0.7)).read(),
                               rescale(x, 0.7))


@pytest.fixture(scope="module")
def usps_party():
    """A party that learnt the class means of USPS, whose digits fill the frame."""
    usps = load_standard("usps", "train", size=28, data_dir=SHARED_DATA.resolve())
    return Centroids(usps.x[:3000], usps.y[:3000]).eval()


def test_mnist_is_read_enlarged_by_parties_of_frame_filling_digits(digits, usps_party):
    mnist = digits["mnist"]
    x, y = mnist.x[:1000], mnist.y[:1000]
    # a claimed loss above the parties' entropy: the target as given is not new to them
    choice = search_with_enlargements([usps_party], ArraySource(x), 10, [5.0], seed=0)
    assert choice.reading.scale == 1.4 and choice.declined is None
    assert _accuracy(usps_party, choice.reading.apply(x), y) > \
        _accuracy(usps_party, x, y) + 0.2  # 0.58 against 0.27
    assert set(choice.information) >= {r.spec() for r in READINGS + ENLARGEMENTS}
    assert choice.to_dict()["declined"] is None


def test_an_enlargement_is_declined_where_the_target_as_given_is_new(digits, usps_party):
    x = digits["mnist"].x[:1000]
    wide = search_with_enlargements([usps_party], ArraySource(x), 10, [5.0], seed=0)
    # a claimed loss of 0: their entropy on the target is far above it, the target is new
    new = search_with_enlargements([usps_party], ArraySource(x), 10, [0.0], seed=0)
    assert new.declined == wide.reading and new.reading.scale <= 1.0
    assert new.reading == choose_reading([usps_party], ArraySource(x), 10, 0).reading
    assert "new to them" in new.line() and new.to_dict()["declined"] == wide.reading.spec()


def test_the_kept_reading_is_the_best_of_those_allowed_past_the_tie():
    given, small, big = Reading(), Reading(0.7), Reading(1.4)
    scored = {given: 0.40, small: 0.50, big: 1.00}
    assert kept_reading(scored, 10) == big
    assert kept_reading(scored, 10, READINGS) == small  # enlargements not allowed
    assert kept_reading({given: 0.40, small: 0.405, big: 1.0}, 10, READINGS) == given  # a tie
