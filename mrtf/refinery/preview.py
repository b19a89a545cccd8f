"""What a refinement will do, said before its long steps: who teaches, the parties' trust
verdicts, what distillation starts from (the parameter average or not, and why), and, once
the data pass has run, whether the default votes or adapts. The pipeline hands it to a
:class:`PlanWatch` (``refine(..., watch=...)``); ``mrtf refine`` prints it before the
distillation and ``mrtf inspect RECEIVED --data`` prints the same without refining."""

from __future__ import annotations

from dataclasses import dataclass, field

from mrtf.refinery.state import RefineState
from mrtf.trust.reliability import PartyReliability


@dataclass(frozen=True)
class RefinePreview:
    """The plan of one refinement, after the party checks and before the data pass.

    method : the refinery method. teachers : the names of the sources that teach (the kept
        local models, then θ_t and θ_{t+1} or the student when the method uses them).
    start : what distillation (or adaptation) starts from, in words.
    average : whether a parameter average θ_{t+1} is formed (False: parties of different
        architectures, or parties that share no basin).
    basin : the basin verdict (mrtf.trust.basin) when the checks measured it, else None.
    verdicts : one line per checked party (mrtf.trust.reliability), [] with the checks off.
    flagged : the checked parties not trusted, as ``name (verdict)``.
    notes : what the refinement says about its inputs (the same notes its result carries).
    parties : what the checks measured of each party (the reliability table), [] with the
        checks off.
    """

    method: str
    teachers: list[str]
    start: str
    average: bool
    basin: str | None = None
    verdicts: list[str] = field(default_factory=list)
    flagged: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    parties: list[PartyReliability] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The plan as the lines ``refine`` and ``inspect --data`` print."""
        out = [f"plan: method {self.method}; {len(self.teachers)} teachers "
               f"({', '.join(self.teachers) or 'none'})",
               f"plan: starts from {self.start}"]
        if self.basin is not None:
            out.append(f"plan: {self.basin}")
        if self.verdicts:
            out += [f"trust: {v}" for v in self.verdicts]
            out.append(f"trust: {len(self.flagged)} parties flagged: "
                       + (", ".join(self.flagged) if self.flagged else "none"))
        return out


class PlanWatch:
    """Told the plan before the long steps (subclass it; every hook does nothing here).

    ``planned``: after the party checks, before the data pass over the target.
    ``chosen``: after the data pass, before the targets and the distillation: the method's
    choice in one line (the default: vote or adapt, novelty.py)."""

    def planned(self, preview: RefinePreview) -> None:
        """The plan, before the data pass."""

    def chosen(self, line: str) -> None:
        """The method's choice, before the distillation."""


def preview_of(state: RefineState) -> RefinePreview:
    """The plan of ``state`` once stages 1-2 (plan_models, check_parties) have run."""
    plan = state.plan
    assert plan is not None
    trusted = state.trusted
    report = None if trusted is None else trusted.report
    return RefinePreview(
        state.config.method, [_teacher_name(plan, t) for t in state.teachers],
        _start(state), plan.agg is not None,
        None if trusted is None else trusted.basin_line,
        [] if report is None else [p.line() for p in report.parties],
        [] if report is None else [f"{p.name} ({p.verdict})" for p in report.flagged],
        list(state.notes), [] if report is None else list(report.parties))


def _teacher_name(plan, teacher) -> str:
    """A teacher's name: the plan's names follow the teachers' order (local models, θ_t,
    θ_{t+1} or the student)."""
    for name, model in zip(plan.names, [*plan.locals_, *([plan.start] if plan.start is not None
                                                         else []), _self(plan)]):
        if model is teacher:
            return name
    return "a teacher"


def _self(plan):
    return plan.agg if plan.agg is not None else plan.student


def _start(state: RefineState) -> str:
    plan = state.plan
    assert plan is not None
    if state.student_given:
        return "the given student"
    if plan.agg is not None:
        return f"θ_{{t+1}}, the parameter average of {len(plan.locals_)} parties " \
               f"(aggregate {state.config.aggregate})"
    if plan.names and "starts as party" in plan.names[-1]:
        return plan.names[-1]
    return "the student"
