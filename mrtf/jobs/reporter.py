"""What the refine job says while it works, and what it returns.

The job says things at the moment they are known, the plan before the long steps: the
parties table (which received files count, mrtf.trust.parties), then, after the party checks
and before the data pass, the trust verdicts and what distillation starts from
(:class:`mrtf.refinery.preview.RefinePreview`), then the vote-or-adapt choice before the
distillation; the refinery's own account only once it has run. A :class:`Reporter` receives
them; the base class says nothing (a library call is silent), ``mrtf refine`` prints them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mrtf.datafree.fuse import FusionResult
from mrtf.io.labels import LabelSet
from mrtf.refinery.preview import PlanWatch
from mrtf.refinery.result import RefineResult
from mrtf.trust.selective import Selection


@dataclass
class RefinedFiles:
    """What a refine job with data did (``refine_files`` returns it once the files are in
    place; :meth:`Reporter.refined` sees it just before they are written).

    result : the refinery's result. labels : the labels as written. selection : the samples
    left unlabeled, or None. samples : the target set's size. parties : every received file
    and whether it counts (mrtf.trust.parties.PartyUse as dicts). own_student : distillation
    started from a given student (or a student for parties of different architectures), not
    the parameter average. truth : the data's y when it has one (for scoring only; the
    refinery never read it). written : the output paths by kind (labels, csv, model).
    """

    result: RefineResult
    labels: LabelSet
    selection: Selection | None
    samples: int
    parties: list[dict[str, Any]]
    own_student: bool
    truth: np.ndarray | None = None
    written: dict[str, Path | None] = field(default_factory=dict)


@dataclass
class FusedFiles:
    """What a data-free job did: the fusion's result, the method and why it was chosen, the
    received files' use and the written paths (model, samples)."""

    result: FusionResult
    method: str
    reason: str
    parties: list[dict[str, Any]]
    written: dict[str, Path | None] = field(default_factory=dict)


class Reporter(PlanWatch):
    """Where a job's words go; every hook does nothing here. ``planned`` and ``chosen``
    (mrtf.refinery.preview.PlanWatch) come before the long steps."""

    def say(self, line: str) -> None:
        """A line of the job's account (the parties table, notes, what was written)."""

    def warn(self, line: str) -> None:
        """A warning about the inputs (a note of the loader, a party name on two files)."""

    def refined(self, files: RefinedFiles) -> None:
        """The refinement's account, after it ran and before the outputs are written."""
