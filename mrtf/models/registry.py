"""Model registry: architecture names → constructors, plus user models by ``module:factory``.

``build_model(arch, num_classes, **arch_kwargs)`` is the one way models are made, both for
training and for rebuilding a received model before its weights are loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from mrtf.errors import InputError
from mrtf.models.custom import accepted_kwargs, build_custom
from mrtf.models.zoo import NORMS, VGG8, CharLSTM, ConvNet, LeNet, LeNetShot, MLPNet, ResNet

# Name → (constructor, accepted kwargs). Image models take in_channels/image_size; some a norm.
_IMAGE = ("in_channels", "image_size")
_REGISTRY: dict[str, tuple[Callable[..., nn.Module], tuple[str, ...]]] = {
    "mlp": (MLPNet, _IMAGE + ("in_features", "hidden", "feature_dim")),
    "lenet": (LeNet, _IMAGE),
    "lenet_shot": (LeNetShot, _IMAGE),  # SHOT's digit network (bottleneck + BN + WN head)
    "convnet": (ConvNet, _IMAGE + ("norm",)),
    "vgg8": (VGG8, _IMAGE + ("norm", "dropout")),
    "resnet8": (lambda **kw: ResNet(depth=8, **kw), _IMAGE + ("norm",)),
    "resnet20": (lambda **kw: ResNet(depth=20, **kw), _IMAGE + ("norm",)),
    "charlstm": (CharLSTM, ("vocab_size", "embed_dim", "hidden", "layers")),
}


def available_archs() -> list[str]:
    """Registered architecture names."""
    return sorted(_REGISTRY)


def register(name: str, factory: Callable[..., nn.Module], kwargs: tuple[str, ...]) -> None:
    """Add an architecture; ``factory(num_classes=..., **kwargs)`` must give a FeatureModel."""
    _REGISTRY[name] = (factory, kwargs)


def image_kwargs(arch: str, in_channels: int, image_size: int, norm: str | None = None
                 ) -> dict[str, Any]:
    """The subset of (in_channels, image_size, norm) that ``arch`` accepts (a custom
    ``module:factory``: the ones its signature names)."""
    if ":" in arch:
        given = {"in_channels": in_channels, "image_size": image_size, "norm": norm}
        return {k: v for k, v in given.items()
                if v is not None and k in accepted_kwargs(arch, tuple(given))}
    if arch not in _REGISTRY:
        return {"in_channels": in_channels, "image_size": image_size}
    accepted = _REGISTRY[arch][1]
    kw: dict[str, Any] = {}
    if "in_channels" in accepted:
        kw.update(in_channels=in_channels, image_size=image_size)
    if norm is not None and "norm" in accepted:
        kw["norm"] = norm
    return kw


def input_kwargs(arch: str, sample_shape: tuple[int, ...]) -> dict[str, Any]:
    """``arch``'s keyword arguments for samples of ``sample_shape``: (C, H, W) images give
    in_channels / image_size (:func:`image_kwargs`), flat (D,) feature vectors in_features
    where the architecture takes it (``mlp``, or a custom factory naming it)."""
    if len(sample_shape) == 3:
        return image_kwargs(arch, sample_shape[0], sample_shape[-1])
    if len(sample_shape) != 1:
        return {}
    if ":" in arch:
        takes = "in_features" in accepted_kwargs(arch, ("in_features",))
    else:
        takes = arch in _REGISTRY and "in_features" in _REGISTRY[arch][1]
    return {"in_features": int(sample_shape[0])} if takes else {}


def build_model(arch: str, num_classes: int, **arch_kwargs: Any) -> nn.Module:
    """Build a registered model, or a user model given as ``package.module:factory``
    (trusted local code, mrtf/models/custom.py: its state_dict keys as the user saved them).

    Returns a module with ``forward_features(x) -> (h (B, D), logits (B, C))``.
    Raises InputError for an unknown name or unusable keyword arguments.
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise InputError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if ":" in arch:
        return build_custom(arch, num_classes, arch_kwargs)
    if arch not in _REGISTRY:
        raise InputError(
            f"unknown architecture {arch!r}; known: {', '.join(available_archs())}, "
            "or package.module:factory"
        )
    factory, accepted = _REGISTRY[arch]
    unknown = sorted(set(arch_kwargs) - set(accepted))
    if unknown:
        raise InputError(f"architecture {arch!r} does not take {', '.join(unknown)}")
    if "norm" in arch_kwargs and arch_kwargs["norm"] not in NORMS:
        raise InputError(f"unknown norm {arch_kwargs['norm']!r}; choose one of {NORMS}")
    try:
        return factory(num_classes=num_classes, **arch_kwargs)
    except (ValueError, RuntimeError, TypeError) as exc:
        raise InputError(f"cannot build {arch!r} with {arch_kwargs}: {exc}") from None


def has_batchnorm(model: nn.Module) -> bool:
    """True when ``model`` has a BatchNorm layer (it cannot train on a single sample)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
