"""A method's own options from text: ``KEY=VALUE`` assignments (``mrtf refine --option``, the
Flower run config's ``pilot-options``) set fields of the method's registered settings
(``Method.settings``, their defaults), giving ``RefineConfig.method_options``.

Each value is read as the type of the field's default (int, float, bool or str); an unknown
key, a malformed value or a method without options is one clear InputError."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from mrtf.errors import InputError
from mrtf.refinery.registry import METHOD_SPECS, Method, MethodOptions

_TRUE, _FALSE = ("true", "yes", "on", "1"), ("false", "no", "off", "0")


def methods_with_options() -> list[str]:
    """The registered methods that take ``--option``, each as ``name (SettingsType)``."""
    return [f"{m.name} ({type(m.settings).__name__})" for m in METHOD_SPECS.values()
            if m.settings is not None]


def option_keys(method: str) -> list[str]:
    """The keys ``method`` takes (its settings' fields); [] for a method without options."""
    own = _method(method).settings
    return [] if own is None else [f.name for f in _settable(own)]


def method_options(method: str, assignments: Sequence[str]) -> MethodOptions | None:
    """``method``'s settings with every ``KEY=VALUE`` of ``assignments`` set (later ones win);
    None when there are none (the method's defaults)."""
    if not assignments:
        return None
    own = _method(method).settings
    if own is None:
        raise InputError(f"--option: method {method} takes no options (methods that do: "
                         f"{', '.join(methods_with_options())})")
    known = {f.name for f in _settable(own)}
    values: dict[str, Any] = {}
    for text in assignments:
        key, sep, value = text.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in known:
            raise InputError(f"--option {text!r}: give KEY=VALUE, KEY one of "
                             f"{', '.join(sorted(known))} (method {method})")
        values[key] = _parse(key, value.strip(), getattr(own, key))
    return replace(own, **values)


def _settable(settings) -> list:
    """The fields ``--option`` sets: all but those another flag sets (metadata option False,
    e.g. ShotSettings.class_prior from --class-frequencies)."""
    return [f for f in fields(settings) if f.metadata.get("option", True)]


def _method(name: str) -> Method:
    try:
        return METHOD_SPECS[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}") from None


def _parse(key: str, text: str, default: Any) -> Any:
    """``text`` as the type of ``default``."""
    if isinstance(default, bool):
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise InputError(f"--option {key}: true or false, got {text!r}")
    if isinstance(default, int | float):
        kind = type(default)
        try:
            return kind(text)
        except ValueError:
            raise InputError(f"--option {key}: {'an integer' if kind is int else 'a number'}, "
                             f"got {text!r}") from None
    return text
