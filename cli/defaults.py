"""Click options whose defaults are a settings dataclass's (RefineConfig, RunConfig, ...): the
default is read from the field, never restated in cli/ (tests/cli/test_defaults.py walks the
commands' options and compares)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click


def field_default(cls: type, name: str) -> Any:
    """The default of ``cls``'s field ``name`` (a default_factory's value)."""
    for f in fields(cls):
        if f.name == name:
            if f.default is not MISSING:
                return f.default
            if f.default_factory is not MISSING:
                return f.default_factory()
            raise TypeError(f"{cls.__name__}.{name} has no default")
    raise TypeError(f"{cls.__name__} has no field {name!r}")


def option_name(decls: tuple[str, ...]) -> str:
    """The parameter name click gives ``decls``: a bare name if one is given, else the
    first long option's (``--batch-size`` → ``batch_size``, ``--augment/--no-augment`` →
    ``augment``)."""
    bare = [d for d in decls if not d.startswith("-")]
    if bare:
        return bare[0]
    long = [d for d in decls if d.startswith("--")] or list(decls)
    return long[0].split("/")[0].lstrip("-").replace("-", "_")


def field_option(cls: type, *decls: str, **kw: Any) -> Callable:
    """``click.option(*decls, **kw)`` with the default of ``cls``'s field of the same name
    (:func:`option_name`), shown in ``--help``; the field's ``metadata["help"]`` is the
    help when ``kw`` gives none."""
    name = option_name(decls)
    if "help" not in kw:
        meta = {f.name: f.metadata for f in fields(cls)}.get(name, {})
        if "help" in meta:
            kw["help"] = meta["help"]
    kw.setdefault("show_default", field_default(cls, name) is not None)
    return click.option(*decls, default=field_default(cls, name), **kw)
