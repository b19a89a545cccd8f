"""adapt_start.py: the information of a labelling, and the start whose adapted labels carry
more of it; fit.adapt_both_starts adapts both starts and keeps that one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mrtf.refinery.fit as fit
from mrtf.io.hdf5 import ArraySource
from mrtf.models.registry import build_model
from mrtf.refinery.adapt_start import (
    AVERAGE,
    TIE,
    VOTE_STUDENT,
    StartChoice,
    choose_start,
    label_diversity,
    label_information,
)
from mrtf.refinery.config import RefineConfig


def _onehot(labels, c=10) -> np.ndarray:
    return np.eye(c, dtype=np.float32)[np.asarray(labels)]


def test_information_is_zero_for_one_class_or_no_opinion_and_ln_c_at_best() -> None:
    assert label_information(_onehot(np.arange(1000) % 10)) == pytest.approx(math.log(10))
    assert label_information(_onehot(np.zeros(500, int))) == pytest.approx(0.0, abs=1e-9)
    assert label_information(np.full((50, 10), 0.1)) == pytest.approx(0.0, abs=1e-9)
    # a collapse into 2 classes of 10 scores ln 2; unsure labels score less than sure ones
    assert label_information(_onehot(np.arange(100) % 2)) == pytest.approx(math.log(2))
    soft = 0.5 * _onehot(np.arange(1000) % 10) + 0.05
    assert 0 < label_information(soft) < label_information(_onehot(np.arange(1000) % 10))


def test_information_refuses_what_is_not_a_matrix_of_rows() -> None:
    for bad in (np.zeros(10), np.zeros((0, 10))):
        with pytest.raises(ValueError, match="M, C"):
            label_information(bad)


def test_the_start_with_more_informative_labels_is_kept_first_on_a_tie() -> None:
    spread, collapsed = _onehot(np.arange(200) % 10), _onehot(np.arange(200) % 2)
    c = choose_start({AVERAGE: collapsed, VOTE_STUDENT: spread})
    assert c.kept == VOTE_STUDENT and c.information[AVERAGE] == pytest.approx(math.log(2))
    assert choose_start({AVERAGE: spread, VOTE_STUDENT: collapsed}).kept == AVERAGE
    assert choose_start({AVERAGE: spread, VOTE_STUDENT: spread.copy()}).kept == AVERAGE
    assert list(c.information) == [AVERAGE, VOTE_STUDENT]  # in the order given
    assert "kept the vote's student" in c.line() and c.to_dict()["kept"] == VOTE_STUDENT
    with pytest.raises(ValueError):
        choose_start({})


def test_a_lead_under_the_tie_margin_keeps_the_first_start() -> None:
    """Two confident labellings score alike whichever is right: a lead under TIE × ln C
    keeps θ_{t+1} (given first); a lead over it keeps the other."""
    spread = _onehot(np.arange(1000) % 10)
    margin = TIE * math.log(10)

    def mixed(eps: float) -> np.ndarray:  # information lowered by about eps below ln 10
        lo = 0.0
        hi = 1.0
        for _ in range(60):  # bisect the mixing weight with a uniform row
            w = (lo + hi) / 2
            info = label_information((1 - w) * spread + w / 10)
            lo, hi = (w, hi) if info > math.log(10) - eps else (lo, w)
        return (1 - lo) * spread + lo / 10

    near, far = mixed(0.5 * margin), mixed(2 * margin)
    assert choose_start({AVERAGE: near, VOTE_STUDENT: spread}).kept == AVERAGE
    assert choose_start({AVERAGE: far, VOTE_STUDENT: spread}).kept == VOTE_STUDENT


def test_diversity_is_the_spread_of_the_labels() -> None:
    assert label_diversity(_onehot(np.arange(1000) % 10)) == pytest.approx(math.log(10))
    assert label_diversity(_onehot(np.arange(100) % 2)) == pytest.approx(math.log(2))
    assert label_diversity(np.full((50, 10), 0.1)) == pytest.approx(math.log(10))
    with pytest.raises(ValueError, match="M, C"):
        label_diversity(np.zeros(10))


def test_a_lead_in_information_from_confidence_alone_does_not_switch() -> None:
    """The student is surer of its labels but merged two classes (every "7" called "9"): it
    leads in information, trails in diversity, and θ_{t+1} is kept. The same sure labels
    without the merge lead in both and are kept."""
    truth = np.arange(1000) % 10
    unsure = 0.6 * _onehot(truth) + 0.04  # θ_{t+1}: right, less sure
    merged = _onehot(np.where(truth == 7, 9, truth))
    c = choose_start({AVERAGE: unsure, VOTE_STUDENT: merged})
    assert c.information[VOTE_STUDENT] > c.information[AVERAGE] + TIE * math.log(10)
    assert c.diversity[VOTE_STUDENT] < c.diversity[AVERAGE] - TIE * math.log(10)
    assert c.kept == AVERAGE and "diversity" in c.line()
    assert choose_start({AVERAGE: unsure, VOTE_STUDENT: _onehot(truth)}).kept == VOTE_STUDENT


def test_both_starts_are_adapted_and_the_chosen_model_is_returned(monkeypatch) -> None:
    """θ_{t+1} adapted as it is, a copy distilled to the vote first then adapted; the labels
    of each scored; the kept one is the model returned (the other start untouched by it)."""
    torch.manual_seed(0)
    average = build_model("lenet", 10)
    x = np.random.default_rng(0).random((40, 1, 28, 28), dtype=np.float32)
    targets = _onehot(np.arange(40) % 10)
    adapted: list[int] = []
    distilled: list[int] = []
    real_distil = fit.distil_student

    def adapt(model, *args, **kwargs):
        adapted.append(id(model))
        return model

    def distil(model, *args, **kwargs):
        distilled.append(id(model))
        return real_distil(model, *args, **kwargs)

    labels = iter([_onehot(np.zeros(40, int)), targets])  # θ_{t+1}'s collapsed

    monkeypatch.setattr(fit, "adapt_student", adapt)
    monkeypatch.setattr(fit, "distil_student", distil)
    monkeypatch.setattr(fit, "final_probs", lambda *a, **k: (next(labels), None))
    config = RefineConfig(steps=2, batch_size=16, seed=3, progress=False)
    kept = fit.adapt_both_starts(average, ArraySource(x), targets, config, torch.device("cpu"))
    assert isinstance(kept.choice, StartChoice) and kept.choice.kept == VOTE_STUDENT
    assert adapted[0] == id(average) and len(adapted) == 2 and distilled == [adapted[1]]
    assert kept.model is not average and id(kept.model) == adapted[1]
    assert kept.labels[0] is targets  # the kept start's labels, for the report to reuse
    # the vote's student before SHOT, a copy of its own (this SHOT stand-in changes nothing)
    assert kept.voted is not kept.model and id(kept.voted) not in adapted
    for a, b in zip(kept.voted.state_dict().values(), kept.model.state_dict().values()):
        assert torch.equal(a, b)


def test_both_starts_only_for_several_batchnorm_parties() -> None:
    assert fit.adapts_from_both_starts(build_model("lenet_shot", 10), num_local=3)
    assert not fit.adapts_from_both_starts(build_model("lenet_shot", 10), num_local=1)
    assert not fit.adapts_from_both_starts(build_model("lenet", 10), num_local=3)
