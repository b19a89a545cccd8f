"""Model registry: architecture names → constructors, plus user models by ``module:factory``.

``build_model(arch, num_classes, **arch_kwargs)`` is the one way models are made, both for
training and for rebuilding a received model before its weights are loaded.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mrtf.errors import InputError
from mrtf.models.zoo import NORMS, VGG8, CharLSTM, ConvNet, LeNet, LeNetShot, MLPNet, ResNet

# Name → (constructor, accepted kwargs). Image models take in_channels/image_size; some a norm.
_IMAGE = ("in_channels", "image_size")
_REGISTRY: dict[str, tuple[Callable[..., nn.Module], tuple[str, ...]]] = {
    "mlp": (MLPNet, _IMAGE),
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
    """The subset of (in_channels, image_size, norm) that ``arch`` accepts."""
    if arch not in _REGISTRY:
        return {"in_channels": in_channels, "image_size": image_size}
    accepted = _REGISTRY[arch][1]
    kw: dict[str, Any] = {}
    if "in_channels" in accepted:
        kw.update(in_channels=in_channels, image_size=image_size)
    if norm is not None and "norm" in accepted:
        kw["norm"] = norm
    return kw


def build_model(arch: str, num_classes: int, **arch_kwargs: Any) -> nn.Module:
    """Build a registered model, or a user model given as ``package.module:factory``.

    Returns a module with ``forward_features(x) -> (h (B, D), logits (B, C))``.
    Raises InputError for an unknown name or unusable keyword arguments.
    """
    if not isinstance(num_classes, int) or num_classes < 2:
        raise InputError(f"num_classes must be an integer >= 2, got {num_classes!r}")
    if ":" in arch:
        return _build_custom(arch, num_classes, arch_kwargs)
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


class HookedModel(nn.Module):
    """Wraps a user's ``nn.Module``: features are the input of its last ``nn.Linear``."""

    def __init__(self, net: nn.Module, num_classes: int) -> None:
        super().__init__()
        linears = [m for m in net.modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise InputError("a custom model needs an nn.Linear layer to take features from")
        self.net, self.num_classes = net, num_classes
        self.feature_dim = linears[-1].in_features
        self._last = linears[-1]

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen: list[torch.Tensor] = []
        handle = self._last.register_forward_pre_hook(lambda _m, inp: seen.append(inp[0]))
        try:
            logits = self.net(x)
        finally:
            handle.remove()
        return seen[-1].flatten(1), logits

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def _build_custom(spec: str, num_classes: int, kwargs: dict[str, Any]) -> nn.Module:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"cannot import custom model {spec!r}: {exc}") from None
    try:
        net = factory(num_classes=num_classes, **kwargs)
    except TypeError as exc:
        raise InputError(f"custom model {spec!r} rejected its arguments: {exc}") from None
    if hasattr(net, "forward_features"):
        return net
    return HookedModel(net, num_classes)


def has_batchnorm(model: nn.Module) -> bool:
    """True when ``model`` has a BatchNorm layer (it cannot train on a single sample)."""
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
