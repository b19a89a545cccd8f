"""The refinery's methods by name. Each method is one registered :class:`Method` object (the
built-in ones live in mrtf/refinery/methods/, one module each); the method table, the config's
checks and the CLI's choices are read from here, so a new method is one module and one
``register_method`` call.

This module imports nothing from the refinery: the config (config.py) reads it, and the
methods, which use the config, register into it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

TEACHER_SETS = ("none", "locals", "all")


class MethodOptions(Protocol):
    """A method's own settings: a frozen dataclass that checks itself (``ShotSettings``,
    ``AadSettings``, ``NrcSettings``, ``DecisionSettings``)."""

    def validate(self) -> None:
        """Raise InputError (one line) on a bad value."""


class Method:
    """A refinery method: what it needs, and its hooks into the stages of pipeline.py.

    name : the ``--method`` value. summary : one line for the method table. help : the CLI's
        words for it ("" = its name alone).
    teachers : 'none' (θ_{t+1} as it is), 'locals' (S_t) or 'all' (S_t, θ_t and θ_{t+1}).
    features : θ_{t+1}'s features are kept in the data pass (CLR / the cluster view).
    vote : the labels are the refined model's neighbour vote (neighbour_vote.py).
    augment : the student's inputs are jittered while it distils (augment.py).
    trust_default : the party reliability checks run unless ``--trust`` says otherwise.
    aligns_input : ``--input-reading auto`` searches how the target is read
        (input_reading.py); otherwise the target is read as given unless the run says how.
    takes_class_prior : ``--class-prior uniform`` applies to it (the default's consensus).
    takes_class_frequencies : its labels read the target's class frequencies when the user
        gives them (``--class-frequencies``, RefineConfig.class_shares): the default's
        consensus, SHOT's, NRC's and DECISION's diversity terms. Where False the run says, in
        one note (plan.notes_on_inputs), that the method has no class prior to aim at them.
    uses_u_t : its targets read Eq. 10's u_t (a note says when it falls back).
    settings : the method's own options, their defaults (a frozen dataclass with
        ``validate()``, e.g. SHOT's ``ShotSettings.paper()``; None: the method has none).
        Defined here once; a run's ``RefineConfig.method_options`` (an instance of the same
        type) replaces them, and the method reads the run's from ``config.options``.

    Hooks (state: pipeline.RefineState), overridden by the methods (methods/base.py has the
    distilling default): ``notes``, ``wants_features``, ``evidence``, ``choice``, ``targets``,
    ``fit``.
    """

    name: str = ""
    summary: str = ""
    help: str = ""
    teachers: str = "locals"
    features: bool = False
    vote: bool = False
    augment: bool = False
    trust_default: bool = False
    aligns_input: bool = False
    takes_class_prior: bool = False
    takes_class_frequencies: bool = False
    uses_u_t: bool = False
    settings: MethodOptions | None = None

    def teacher_list(self, locals_: list, start: Any, self_model: Any) -> list:
        """The models that teach: none, the local models, or all (then θ_t when received
        and θ_{t+1} follow them, θ_{t+1} last)."""
        if self.teachers == "none":
            return []
        extra = ([start] if start is not None else []) + [self_model]
        return list(locals_) + (extra if self.teachers == "all" else [])

    def choice(self, state: Any) -> str:
        """One line, said before the targets and the fit (``plan: ...``): what the method
        will do with this target, once its evidence is read."""
        return f"method {self.name}: its targets are distilled"

    def notes(self, state: Any) -> list[str]:
        """What the output should say about this method's inputs (after the common notes)."""
        return []

    def wants_features(self, state: Any) -> bool:
        """Whether the data pass keeps θ_{t+1}'s features for this run."""
        return self.features

    def evidence(self, state: Any) -> None:
        """Read what the method needs off the teachers' logits before the targets (which may
        overwrite them); the default needs nothing."""

    def targets(self, state: Any) -> Any:
        """The distillation targets (M, C) from ``state.logits`` (and features)."""
        raise NotImplementedError(f"method {self.name} makes no targets")

    def fit(self, state: Any) -> Any:
        """The refined model, from ``state.targets``."""
        raise NotImplementedError(f"method {self.name} fits no model")


_REGISTRY: dict[str, Method] = {}


def register_method(method: Method) -> Method:
    """Add ``method`` under ``method.name`` (a name already taken is refused)."""
    if not method.name or method.name in _REGISTRY:
        raise ValueError(f"method name {method.name!r} is empty or taken")
    if method.teachers not in TEACHER_SETS:
        raise ValueError(f"teachers must be one of {TEACHER_SETS}, got {method.teachers!r}")
    _REGISTRY[method.name] = method
    return method


def unregister_method(name: str) -> None:
    """Remove a method (tests that register their own)."""
    _REGISTRY.pop(name, None)


def get_method(name: str) -> Method:
    """The method registered as ``name`` (KeyError when there is none)."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no refinery method {name!r}; registered: "
                       f"{', '.join(_REGISTRY)}") from None


class _Names(Sequence[str]):
    """The registered names in registration order, read live (a tuple would freeze them)."""

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[str]: ...

    def __getitem__(self, i):
        return tuple(_REGISTRY)[i]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return repr(tuple(_REGISTRY))


class _Table(Mapping[str, Method]):
    """name → registered Method, read live."""

    def __getitem__(self, name: str) -> Method:
        return _REGISTRY[name]

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_REGISTRY))

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return repr(dict(_REGISTRY))


#: the registered method names (live; click.Choice and config.validate read it)
METHODS: Sequence[str] = _Names()
#: name → Method (live): the method table
METHOD_SPECS: Mapping[str, Method] = _Table()


def method_help() -> str:
    """The CLI's ``--method`` help, one entry per registered method."""
    return ", ".join(f"{m.name} ({m.help})" if m.help else m.name
                     for m in _REGISTRY.values()) + "."
