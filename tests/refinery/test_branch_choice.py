"""The adaptive default's vote-or-adapt choice on the target's own neighbourhoods."""

import numpy as np

from mrtf.refinery.branch_choice import BranchChoice, choose_branch
from mrtf.refinery.shot import ShotSettings

# 60 samples in 3 natural clusters of 20; each sample's 4 neighbours are in its own cluster
TRUE = np.repeat(np.arange(3), 20)
NEIGHBOURS = np.array([[c * 20 + (i + d) % 20 for d in (1, 2, 3, 4)]
                       for c in range(3) for i in range(20)])


def test_the_labels_that_follow_the_clusters_are_kept():
    noisy = TRUE.copy()
    noisy[::3] = (noisy[::3] + 1) % 3  # a third cut across the clusters
    assert choose_branch(noisy, TRUE, NEIGHBOURS).chosen == "adapt"
    choice = choose_branch(TRUE, noisy, NEIGHBOURS)
    assert choice.chosen == "vote" and choice.by == "neighbours"
    assert choice.agreement["vote"] == 1.0 and choice.agreement["adapt"] < 1.0
    assert abs(choice.chance["vote"] - 1 / 3) < 1e-12  # three balanced classes: Σ h² = 1/3
    assert choice.excess == {b: choice.agreement[b] - choice.chance[b] for b in choice.excess}


def test_labels_piled_on_one_class_are_not_rewarded():
    """One label for every sample agrees with every neighbour, but only by chance."""
    piled = np.zeros(60, dtype=np.int64)
    choice = choose_branch(TRUE, piled, NEIGHBOURS)
    assert choice.agreement["adapt"] == 1.0 and choice.chance["adapt"] == 1.0
    assert choice.chosen == "vote"


def test_a_tie_keeps_the_vote_and_the_line_says_why():
    choice = choose_branch(TRUE, TRUE.copy(), NEIGHBOURS)
    assert choice.chosen == "vote"
    assert choice.line().startswith("vote or adapt: vote (labels agreeing with their target "
                                    "neighbours: vote 1.000")
    d = choice.to_dict()
    assert d["chosen"] == "vote" and d["line"] == choice.line()
    assert "novelty" in BranchChoice("adapt", "novelty").line()


def test_shot_steps_are_capped_only_when_asked():
    paper = ShotSettings.paper()
    assert paper.num_steps(10_000) == 30 * 157  # SHOT's 30 passes of batch 64, no cap
    capped = ShotSettings(optimizer="sgd", lr=0.01, epochs=30, max_steps=5000)
    assert capped.num_steps(10_000) == 4710 and capped.num_steps(100_000) == 5000
