"""The target's class frequencies given by the user: parsed and checked at the edge, the
calibrator's label-spread signal read against them (mrtf.trust.class_frequencies), and the
refine that takes them as its class prior."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest

from mrtf.errors import InputError
from mrtf.refinery import RefineConfig
from mrtf.trust.calibration import Signals, calibrate
from mrtf.trust.class_frequencies import (
    check_class_frequencies,
    normalised,
    parse_class_frequencies,
    spread_against,
)


def test_parse_takes_shares_or_counts():
    assert parse_class_frequencies("0.25,0.75") == (0.25, 0.75)
    assert parse_class_frequencies(" 3, 1 ,0") == (3.0, 1.0, 0.0)


@pytest.mark.parametrize("text,needle", [
    ("a,b", "comma-separated numbers"),
    ("0.5;0.5", "comma-separated numbers"),
    ("1", "at least 2"),
    ("1,-1", "non-negative"),
    ("0,0", "not all 0"),
    ("nan,1", "finite"),
    ("inf,1", "finite"),
])
def test_parse_refuses_what_is_not_a_distribution(text, needle):
    with pytest.raises(InputError, match=needle):
        parse_class_frequencies(text)


def test_one_per_class_is_checked_against_the_models():
    check_class_frequencies((1.0, 2.0, 3.0), 3)
    with pytest.raises(InputError, match="3 class frequencies were given but the received "
                                         "models have 10 classes"):
        check_class_frequencies((1.0, 2.0, 3.0), 10)
    cfg = RefineConfig(class_frequencies=(1.0, 1.0))
    cfg.validate()
    with pytest.raises(InputError, match="models have 10 classes"):
        cfg.check_classes(10)
    with pytest.raises(InputError, match="at least 2"):
        RefineConfig(class_frequencies=(1.0,)).validate()


def test_normalised_is_a_distribution_with_no_zero():
    p = normalised((3.0, 1.0, 0.0))
    assert p.sum() == pytest.approx(1.0) and (p > 0).all()
    assert p[0] == pytest.approx(0.75, abs=1e-5) and p[2] < 1e-5


def test_spread_against_an_even_prior_is_the_entropy_share():
    hist = np.array([0.5, 0.3, 0.2, 0.0])
    entropy = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2)) / math.log(4)
    assert spread_against(hist, None) == pytest.approx(entropy)
    assert spread_against(hist, np.full(4, 0.25)) == pytest.approx(entropy)
    # labels that spread as the given frequencies do read as fully spread, and labels piled
    # where the frequencies say the class is rare read as less spread than against even ones
    assert spread_against(hist, normalised(hist)) == pytest.approx(1.0, abs=1e-5)
    assert spread_against(hist, normalised((0.05, 0.05, 0.1, 0.8))) < entropy


def _skewed(m=400, c=5, k=4, seed=0):
    """Signals (with neighbourhoods: the full calibrator) and probabilities whose labels fall
    into the classes with shares 0.4, 0.3, 0.15, 0.1, 0.05."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(c, m, p=[0.4, 0.3, 0.15, 0.1, 0.05])
    logits = rng.normal(0, 1, (k, m, c)).astype(np.float32)
    logits[:, np.arange(m), labels] += 3.0
    probs = np.exp(logits.mean(0)) / np.exp(logits.mean(0)).sum(1, keepdims=True)
    s = Signals.from_logits(logits, probs, probs)
    s.neighbours = rng.integers(0, m, (m, 10))
    return s, probs, np.bincount(probs.argmax(1), minlength=c)


def test_the_calibrator_reads_the_spread_against_the_given_frequencies():
    s, probs, counts = _skewed()
    even = calibrate(probs, s, fit_temperature=False)
    s.class_prior = np.full(5, 0.2)
    same = calibrate(probs, s, fit_temperature=False)
    assert same.estimated_accuracy == pytest.approx(even.estimated_accuracy, abs=1e-9)
    s.class_prior = normalised(counts)  # the labels spread as the target's classes do
    told = calibrate(probs, s, fit_temperature=False)
    assert told.estimated_accuracy > even.estimated_accuracy + 0.01
    assert "class frequencies given" in " ".join(told.notes)
    assert not any("class frequencies" in n for n in even.notes)
    s.class_prior = normalised(counts[::-1])  # frequencies that contradict the labels
    assert calibrate(probs, s, fit_temperature=False).estimated_accuracy < \
        even.estimated_accuracy - 0.01


@pytest.mark.parametrize("adapted", [False, True])
def test_the_printed_interval_reaches_the_reading_without_the_frequencies(adapted):
    """refine's reading (trusted.calibrated) with the frequencies given: the estimate is the
    one read against them, its ± reaches the one read as if the classes were balanced."""
    from mrtf.refinery.trusted import calibrated

    s, probs, counts = _skewed()
    _, plain = calibrated(probs, probs, s, None, adapted=adapted)
    s.class_prior = normalised(counts)
    cal, told = calibrated(probs, probs, s, None, adapted=adapted)
    assert told.refined > plain.refined + 0.005  # the frequencies lift the reading
    assert told.plus_minus >= told.refined - plain.refined - 1e-12
    assert told.refined - told.plus_minus <= plain.refined
    assert any("as if the classes were balanced" in n for n in cal.notes)


def test_refine_takes_the_given_frequencies_as_its_class_prior(digits_federation, tmp_path):
    """The real command: the consensus' bias correction aims at the frequencies ("given"),
    and the estimate says it read them; on this balanced target the labels stay nearly the
    same."""
    from click.testing import CliRunner

    from mrtf.cli.main import cli
    from mrtf.io import read_labels

    received, target, _ = digits_federation
    with h5py.File(target) as f:
        counts = np.bincount(f["y"][:], minlength=10)
    plain, told = tmp_path / "plain.h5", tmp_path / "told.h5"
    base = ["refine", str(received), "--data", str(target), "--steps", "5", "--json"]
    first = CliRunner().invoke(cli, [*base, "--labels", str(plain)])
    res = CliRunner().invoke(cli, [*base, "--labels", str(told), "--class-frequencies",
                                   ",".join(str(int(n)) for n in counts)])
    assert first.exit_code == 0 and res.exit_code == 0, res.output
    said, plain_said = json.loads(res.output)["class_prior"], json.loads(first.output)
    # the bias correction aimed at the frequencies ("given") competes where "uniform" did
    assert said["chosen"] in ("learned", "given") and "given" in said["agreement"]
    assert "uniform" not in said["line"] and "given" in said["line"]
    assert plain_said["class_prior"] is None or "given" not in plain_said["class_prior"]["line"]
    a, b = read_labels(plain), read_labels(told)
    assert float((a.labels == b.labels).mean()) > 0.9
    assert any("class frequencies given" in n for n in b.calibration["notes"])
    assert not any("class frequencies" in n for n in a.calibration["notes"])
