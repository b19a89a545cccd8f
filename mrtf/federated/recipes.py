"""Party recipes: named local-training settings a party can train with before the pilot party
sees anything (``mrtf simulate --recipe NAME``; docs/party-recipe.md).

* ``default``: the project's settings (RunConfig's defaults: LeNet, lr 0.05, batch 16, E 2).
* ``shot``: SHOT's source recipe for digits (Liang et al. 2020, code ``digit/uda_digit.py``
  ``train_source``): its LeNet with a 256-d bottleneck + BatchNorm + dropout and a
  weight-normalised head (``lenet_shot``), cross-entropy with label smoothing 0.1, SGD lr 0.01,
  momentum 0.9 Nesterov, weight decay 1e-3, lr·(1 + 10·i/N)^−0.75 over the N local steps,
  batch 64, 30 epochs. SHOT also augments its USPS source (RandomCrop 28 pad 4, rotation
  10°): ``local_augment = true``; it does not augment MNIST. It keeps the checkpoint that
  scores best on the source test split every N/10 steps; a party here keeps its last.
"""

from __future__ import annotations

from typing import Any

from mrtf.errors import InputError

PARTY_RECIPES: dict[str, dict[str, Any]] = {
    "default": {},
    "shot": {"arch": "lenet_shot", "epochs": 30, "lr": 0.01, "batch_size": 64,
             "label_smoothing": 0.1, "nesterov": True, "lr_decay": "inverse",
             "weight_decay": 1e-3},
}


def party_recipe(name: str) -> dict[str, Any]:
    """The RunConfig keys a recipe sets (a copy); InputError for an unknown name."""
    if name not in PARTY_RECIPES:
        raise InputError(f"unknown party recipe {name!r}; choose from "
                         f"{', '.join(PARTY_RECIPES)}")
    return dict(PARTY_RECIPES[name])
