"""MrTF model refinery (transductive path): stabilized teachers (Eq. 3-7), rectified
distillation (Eq. 10), clustered label refinery (Eq. 11-12), distillation (Eq. 1-2); and the
SHOT source-free adaptation baseline (shot.py). ``refine`` is one pipeline of named stages
(pipeline.py); each method a registered object (registry.py, methods/)."""

from mrtf.refinery.cluster import prototype_targets, prototype_targets_dense, prototypes
from mrtf.refinery.distill import DistillSettings, distill, soft_cross_entropy
from mrtf.refinery.pipeline import (
    METHODS,
    VARIANTS,
    RefineConfig,
    RefineResult,
    accuracy_of,
    check_fits,
    ensemble_targets,
    newest_locals,
    refine,
)
from mrtf.refinery.rectify import entropy, entropy_weights, rectified_targets, u_t
from mrtf.refinery.registry import Method, get_method, register_method
from mrtf.refinery.shot import ShotSettings, shot_adapt, shot_pseudo_labels
from mrtf.refinery.teachers import (
    TeacherOutputs,
    avg_logit,
    avg_prob,
    group_by_arch,
    predict_probs,
    stabilized_probs,
    teacher_logits,
)

__all__ = [
    "METHODS", "VARIANTS", "DistillSettings", "Method", "RefineConfig", "RefineResult",
    "ShotSettings", "TeacherOutputs", "get_method", "register_method",
    "accuracy_of", "avg_logit", "avg_prob", "check_fits", "distill", "entropy",
    "ensemble_targets", "entropy_weights", "newest_locals",
    "group_by_arch", "predict_probs", "prototype_targets", "prototype_targets_dense",
    "prototypes", "rectified_targets", "refine", "shot_adapt", "shot_pseudo_labels",
    "soft_cross_entropy", "stabilized_probs",
    "teacher_logits", "u_t",
]
