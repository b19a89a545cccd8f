"""The pilot party's jobs on files, as library calls: :func:`refine_files` (``mrtf refine``)
with its parameters :class:`RefineJob` and what it says, a :class:`Reporter`. The label job
is :func:`mrtf.labeling.label`."""

from mrtf.jobs.params import RefineJob
from mrtf.jobs.refine import refine_files
from mrtf.jobs.reporter import FusedFiles, RefinedFiles, Reporter

__all__ = ["FusedFiles", "RefineJob", "RefinedFiles", "Reporter", "refine_files"]
