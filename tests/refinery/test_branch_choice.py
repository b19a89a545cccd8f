"""The adaptive default's vote-or-adapt choice (branch_choice.py) and SHOT's step cap."""

import numpy as np
import pytest

from mrtf.refinery.branch_choice import choose_branch
from mrtf.refinery.novelty import Novelty
from mrtf.refinery.shot import ShotSettings

NEW = Novelty(0.8, 1.5, 0.7, True)
FAMILIAR = Novelty(0.1, 0.8, 0.7, False)
UNKNOWN = Novelty(None, 0.8, None, False)


def test_adapt_when_new_to_the_parties_or_one_party_only():
    assert (choose_branch(NEW, 10).chosen, choose_branch(NEW, 10).by) == ("adapt", "novelty")
    assert (choose_branch(FAMILIAR, 1).chosen, choose_branch(FAMILIAR, 1).by) == \
        ("adapt", "one party")
    assert choose_branch(UNKNOWN, 1).chosen == "adapt"
    assert (choose_branch(FAMILIAR, 2).chosen, choose_branch(UNKNOWN, 5).chosen) == \
        ("vote", "vote")
    assert choose_branch(None, 1) is None  # nothing to adapt: no θ_{t+1}, or a given student


def test_the_line_says_why():
    assert choose_branch(FAMILIAR, 1).line() == \
        "vote or adapt: adapt (one party only: its errors cannot be outvoted)"
    d = choose_branch(NEW, 3).to_dict()
    assert d["chosen"] == "adapt" and d["by"] == "novelty" and "new to the parties" in d["line"]


def test_shot_steps_are_capped_only_when_asked():
    paper = ShotSettings.paper()
    assert paper.num_steps(10_000) == 30 * 157  # SHOT's 30 passes of batch 64, no cap
    capped = ShotSettings(optimizer="sgd", lr=0.01, epochs=30, max_steps=5000)
    assert capped.num_steps(10_000) == 4710 and capped.num_steps(100_000) == 5000


def test_the_adapt_branch_uses_shots_recipe_for_shots_kind_of_network():
    """BatchNorm (SHOT's source network, lenet_shot): SHOT's digit recipe, capped; a plain
    network: the project's Adam settings over ``config.steps``."""
    from mrtf.models import build_model
    from mrtf.refinery import RefineConfig
    from mrtf.refinery.fit import ADAPT_MAX_STEPS, adapt_settings

    config = RefineConfig(steps=37, batch_size=16)
    bn = adapt_settings(build_model("lenet_shot", num_classes=10), config)
    assert (bn.optimizer, bn.lr, bn.epochs, bn.max_steps) == ("sgd", 0.01, 30, ADAPT_MAX_STEPS)
    plain = adapt_settings(build_model("lenet", num_classes=10), config)
    assert (plain.optimizer, plain.steps, plain.batch_size, plain.epochs) == ("adam", 37, 16, 0)


def test_label_diversity_is_the_share_of_an_even_spread():
    import numpy as np
    import pytest

    from mrtf.refinery.branch_choice import label_diversity

    eye = np.eye(10, dtype=np.float32)
    assert label_diversity(eye[np.arange(1000) % 10]) == pytest.approx(1.0)
    assert f"{label_diversity(eye[np.zeros(1000, int)]):.2f}" == "0.00"  # not -0.00
    two = eye[np.arange(1000) % 2]  # two classes evenly: ln 2 / ln 10
    assert label_diversity(two, block=7) == pytest.approx(np.log(2) / np.log(10))


def test_a_collapsed_only_start_is_not_adapted():
    from mrtf.refinery.branch_choice import MIN_START_DIVERSITY

    low, high = MIN_START_DIVERSITY - 0.01, MIN_START_DIVERSITY + 0.01
    for novelty, k in ((NEW, 10), (FAMILIAR, 1)):
        kept = choose_branch(novelty, k, low)
        assert (kept.chosen, kept.by, kept.start_diversity) == ("vote", "collapsed start", low)
        assert "spread is 0.44" in kept.line() and kept.to_dict()["start_diversity"] == low
        assert choose_branch(novelty, k, high).chosen == "adapt"
        assert choose_branch(novelty, k, None).chosen == "adapt"  # not read: as before
    # a familiar target is voted whatever θ_{t+1}'s labels look like
    assert choose_branch(FAMILIAR, 10, 0.0).by == "vote"


def _labels(counts: list[int]) -> np.ndarray:
    """One-hot probabilities with ``counts[c]`` rows of class c."""
    y = np.repeat(np.arange(len(counts)), counts)
    return np.eye(len(counts), dtype=np.float32)[y]


def test_an_adaptation_that_empties_classes_gives_way_to_the_vote():
    from mrtf.refinery.branch_choice import MAX_SPREAD_LOSS, collapsed_adaptation

    adapt = choose_branch(NEW, 10, start_diversity=0.47)
    consensus = _labels([100] * 10)  # spread 1.0
    merged = _labels([0, 140, 110, 160, 140, 300, 0, 150, 0, 0])  # six classes: ~0.75
    out = collapsed_adaptation(adapt, merged, consensus)
    assert (out.chosen, out.by) == ("vote", "collapsed adaptation") and not out.adapts
    assert out.spreads[1] == pytest.approx(1.0) and out.spreads[0] < 1.0 - MAX_SPREAD_LOSS
    assert out.start_diversity == 0.47
    assert "0.75 of an even one's against the parties' consensus' 1.00" in out.line()
    # every class kept, a little less even than the consensus: the adaptation stands
    kept = collapsed_adaptation(adapt, _labels([80, 120] * 5), consensus)
    assert kept.adapts and kept.by == "novelty" and kept.spreads[0] > 0.98
    assert kept.to_dict()["spreads"] == list(kept.spreads)
    # a consensus that is itself collapsed asks no more of the adaptation
    assert collapsed_adaptation(adapt, merged, merged).adapts


def test_labels_that_follow_the_given_class_shares_are_no_collapse():
    """Adapted labels that follow a skewed target spread less than an even consensus; read
    against the class shares the user gave they are no collapsed adaptation."""
    from mrtf.refinery.branch_choice import collapsed_adaptation, spread_of

    shares = np.array([0.5, 0.2, 0.1, 0.1, 0.05, 0.05])
    counts = (shares * 400).astype(int)
    adapted = np.eye(6)[np.repeat(np.arange(6), counts)]
    consensus = np.eye(6)[np.arange(400) % 6]  # an even spread
    assert spread_of(adapted, shares) == pytest.approx(1.0)
    assert spread_of(consensus, np.full(6, 1 / 6)) == pytest.approx(spread_of(consensus))
    branch = choose_branch(NEW, 3)
    assert collapsed_adaptation(branch, adapted, consensus).by == "collapsed adaptation"
    kept = collapsed_adaptation(branch, adapted, consensus, tuple(shares))
    assert kept.chosen == "adapt" and kept.spreads[0] > kept.spreads[1]
