"""Data-free fusion of received models (no data at the pilot party): FedFTG and FedKF.

``fuse(received, FusionConfig(...))`` picks FedFTG when every local party reports label counts
(customised label sampling and class-level ensemble need them) and FedKF otherwise.
"""

from mrtf.datafree.config import FusionConfig
from mrtf.datafree.fedftg import (
    FtgTeachers,
    class_ensemble_weights,
    cls_loss,
    discrepancy_loss,
    diversity_loss,
    ensemble_logits,
    fedftg_round,
    label_distribution,
    run_fedftg,
    stratified_labels,
)
from mrtf.datafree.fedkf import (
    aca_average,
    activation_loss,
    information_entropy_loss,
    kd_loss,
    latest_per_party,
    oca_average,
    one_hot_loss,
    run_fedkf,
)
from mrtf.datafree.fuse import FusionResult, choose_method, fuse
from mrtf.datafree.generators import (
    ConditionalGenerator,
    UnconditionalGenerator,
    default_noise_dim,
    sample_noise,
)
from mrtf.datafree.samples import dump_samples

__all__ = [
    "ConditionalGenerator", "FtgTeachers", "FusionConfig", "FusionResult",
    "UnconditionalGenerator",
    "aca_average", "activation_loss", "choose_method", "class_ensemble_weights", "cls_loss",
    "default_noise_dim", "discrepancy_loss", "diversity_loss", "dump_samples",
    "ensemble_logits", "fedftg_round", "fuse", "information_entropy_loss", "kd_loss",
    "label_distribution",
    "latest_per_party", "oca_average", "one_hot_loss", "run_fedftg", "run_fedkf",
    "sample_noise", "stratified_labels",
]
