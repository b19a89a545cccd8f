"""The plan of a refinement as ``mrtf refine`` prints it before the long steps and ``mrtf
inspect RECEIVED --data`` prints it without refining (mrtf.refinery.preview)."""

from __future__ import annotations

from mrtf.cli.common import Out
from mrtf.refinery.preview import RefinePreview


def say_plan(preview: RefinePreview, out: Out) -> None:
    """The plan's lines: teachers, what distillation starts from, the basin verdict, each
    party's trust verdict and the flagged parties."""
    for line in preview.lines():
        out.say(line)
