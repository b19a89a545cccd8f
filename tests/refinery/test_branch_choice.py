"""The adaptive default's vote-or-adapt choice (branch_choice.py) and SHOT's step cap."""

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
