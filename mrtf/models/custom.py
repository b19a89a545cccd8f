"""A user's own PyTorch model, given as ``module:factory``: trusted local code, loaded as saved.

The factory is called as ``factory(num_classes=C, **arch_kwargs)`` and must return an
``nn.Module`` whose ``forward(x)`` gives logits (B, C). Its ``state_dict`` keys are the ones
``torch.save(model.state_dict())`` wrote: nothing is renamed or wrapped, so a party's file
loads as it was saved and a refined model saves the same keys. When the class has no
``forward_features(x) -> (h, logits)``, the features (the penultimate representation of the
design's model contract) are the input of its last ``nn.Linear``, taken with a forward hook
(the same layer SHOT treats as the classifier, mrtf/refinery/shot.py).

Only code the user names on the command line runs (``--trust-arch``); a received file that
names a ``module:factory`` is refused otherwise (mrtf/io/bundles.py). The current folder is
importable as with ``python -m``: the user stands in the folder that holds ``mynet.py``.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from mrtf.errors import InputError, first_line


def split_spec(spec: str) -> tuple[str, str]:
    """``package.module:factory`` → (module name, factory name); InputError when malformed."""
    module_name, _, attr = spec.partition(":")
    parts = module_name.split(".")
    if not attr.isidentifier() or not all(p.isidentifier() for p in parts):
        raise InputError(f"custom architecture {spec!r} must be package.module:factory "
                         "(Python names, e.g. mynet:make)")
    return module_name, attr


def import_factory(spec: str) -> Callable[..., nn.Module]:
    """The factory named by ``spec``, imported with the current folder on ``sys.path`` (as
    ``python -m`` puts it there), so ``mynet:make`` finds ``./mynet.py``."""
    module_name, attr = split_spec(spec)
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:  # only for this import: the user's own code, trusted by naming it
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InputError(_not_found(spec, module_name, exc, cwd)) from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed at import: say where
        raise InputError(f"cannot import custom model {spec!r}: importing {module_name} "
                         f"raised {type(exc).__name__}: {first_line(exc, 100)}") from None
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise InputError(f"custom model {spec!r}: {module_name} has no function or class "
                         f"named {attr!r}")
    return factory


def _not_found(spec: str, module_name: str, exc: ModuleNotFoundError, cwd: str) -> str:
    missing = exc.name or module_name
    top = module_name.split(".")[0]
    if missing.split(".")[0] != top:  # the user's module imports something not installed
        return (f"cannot import custom model {spec!r}: {module_name} needs {missing!r}, "
                "which is not installed (pip install it)")
    where = module_name.replace(".", "/")
    return (f"cannot import custom model {spec!r}: no module {module_name!r} in {cwd} or on "
            f"PYTHONPATH; run mrtf from the folder that holds {where}.py, or set "
            "PYTHONPATH to that folder")


class LastLinearFeatures:
    """Mixin added to a user's model class: ``forward_features`` from a hook on the input of
    its last registered ``nn.Linear``. It adds no parameters and renames nothing."""

    def forward_features(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seen: list[torch.Tensor] = []
        head = last_linear(self)  # type: ignore[arg-type]
        handle = head.register_forward_pre_hook(lambda _m, inp: seen.append(inp[0]))
        try:
            logits = self(x)  # type: ignore[operator]
        finally:
            handle.remove()
        if not seen:
            raise InputError(f"{type(self).__name__}: its last nn.Linear (the classifier the "
                             "features are taken from) did not run in forward(); define the "
                             "classifier last in __init__, or give the class forward_features")
        return seen[-1].flatten(1), logits


def last_linear(model: nn.Module) -> nn.Linear:
    """The last ``nn.Linear`` registered in ``model`` (its classifier, by the contract)."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise InputError(f"{type(model).__name__}: a custom model needs an nn.Linear "
                         "classifier to take features from (or a forward_features method)")
    return linears[-1]


_HOOKED: dict[type, type] = {}


def with_features(net: nn.Module) -> nn.Module:
    """``net`` itself, its class extended with :class:`LastLinearFeatures` when it has no
    ``forward_features``: same object, same parameters, same state_dict keys."""
    if hasattr(net, "forward_features"):
        return net
    last_linear(net)  # refuse a model without a classifier now, not at the first forward
    cls = type(net)
    if cls not in _HOOKED:
        _HOOKED[cls] = type(cls.__name__, (LastLinearFeatures, cls),
                            {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
    net.__class__ = _HOOKED[cls]
    return net


def accepted_kwargs(spec: str, names: tuple[str, ...]) -> set[str]:
    """Which of ``names`` the factory of ``spec`` takes (all of them with ``**kwargs``)."""
    try:
        params = inspect.signature(import_factory(spec)).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): pass none
        return set()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return set(names)
    return {p.name for p in params} & set(names)


def build_custom(spec: str, num_classes: int, kwargs: dict[str, Any]) -> nn.Module:
    """``factory(num_classes=..., **kwargs)`` of the trusted ``spec``, with features."""
    factory = import_factory(spec)
    try:
        net = factory(num_classes=num_classes, **kwargs)
    except TypeError as exc:
        raise InputError(f"custom model {spec!r} rejected its arguments (num_classes="
                         f"{num_classes}, {kwargs}): {first_line(exc, 100)}") from None
    if not isinstance(net, nn.Module):
        raise InputError(f"custom model {spec!r} returned {type(net).__name__}, not an "
                         "nn.Module")
    return with_features(net)
