"""The plan of a refinement as ``mrtf refine`` prints it before the long steps and ``mrtf
inspect RECEIVED --data`` prints it without refining (mrtf.refinery.preview)."""

from __future__ import annotations

from mrtf.cli.common import Out, table
from mrtf.refinery.preview import RefinePreview
from mrtf.trust.reliability import ReliabilityReport


def say_plan(preview: RefinePreview, out: Out) -> list[str]:
    """The parties' reliability table (what the checks measured; once, here, not again after
    the run), then the plan's lines: teachers, what distillation starts from, the basin
    verdict, each party's trust verdict and the flagged parties. Returns the lines said."""
    if preview.parties:
        out.say(table(ReliabilityReport(preview.parties, []).rows(), ReliabilityReport.HEADER))
    lines = preview.lines()
    for line in lines:
        out.say(line)
    return lines
