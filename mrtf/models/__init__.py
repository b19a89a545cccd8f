"""Model zoo and registry. Every model gives ``forward_features(x) -> (features, logits)``."""

from mrtf.models.custom import with_features
from mrtf.models.registry import (
    available_archs,
    build_model,
    has_batchnorm,
    image_kwargs,
    input_kwargs,
    register,
)
from mrtf.models.zoo import (
    VGG8,
    CharLSTM,
    ConvNet,
    FeatureModel,
    LeNet,
    LeNetShot,
    MLPNet,
    ResNet,
    WeightNormLinear,
)

__all__ = [
    "CharLSTM", "ConvNet", "FeatureModel", "LeNet", "LeNetShot", "MLPNet", "ResNet", "VGG8",
    "WeightNormLinear", "available_archs", "build_model", "has_batchnorm", "image_kwargs",
    "input_kwargs", "register", "with_features",
]
