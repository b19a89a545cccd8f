"""What ``mrtf refine`` says about a finished refinery run: its account of the sources, the
calibration and selective labeling, the scores when the data has y, and the JSON summary.
Nothing here changes a result; refine.py decides and writes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mrtf.cli.common import Out, table
from mrtf.refinery import RefineResult, accuracy_of
from mrtf.trust.selective import Selection


def say_account(result: RefineResult, out: Out, said: Sequence[str] = ()) -> None:
    """The refinery's notes, each source's trust, the adaptive method's choices (class prior,
    distil-or-adapt, neighbour vote) and the calibration. ``said``: the plan's lines, printed
    before the work (cli/plan.py: the reliability table, the verdicts, the basin, the vote-or-
    adapt choice); a line of the account they already hold is not said again."""
    plan = [line.removeprefix("plan: ").removeprefix("trust: ") for line in said]

    def say_new(line: str, prefix: str = "") -> None:
        if not any(line in p or line.removeprefix("party ") == p for p in plan):
            out.say(prefix + line)

    for note in result.notes:
        say_new(note, "note: ")
    if result.consensus is not None:
        for line in result.consensus.trust:
            out.say(f"source {line}")
        if result.consensus.class_prior is not None:  # the class prior, and why
            out.say(result.consensus.class_prior.line)
    if result.novelty is not None:  # the adaptive method's choice: distil the vote or adapt
        say_new(result.novelty.line())
    if result.branch is not None:  # ... and which branch ran, and why
        say_new(result.branch.line())
    if result.neighbour_vote is not None:
        out.say(result.neighbour_vote.line())
    cal = result.calibration
    out.say(cal.line())
    for note in cal.notes:
        out.say(f"note: {note}")


def say_selection(selection: Selection | None, confidence: np.ndarray, out: Out) -> None:
    """How many samples selective labeling left unlabeled, and the kept labels' estimate."""
    if selection is None:
        return
    kept = ~selection.abstained
    out.say(f"selective labeling ({selection.rule}): {int(selection.abstained.sum())} of "
            f"{len(kept)} samples left unlabeled (label -1); estimated accuracy of the kept "
            f"labels {float(confidence[kept].mean()):.3f}" if kept.any() else
            f"selective labeling ({selection.rule}): every sample left unlabeled")


def scores(result: RefineResult, y: np.ndarray | None, own_student: bool,
           selection: Selection | None, out: Out) -> dict[str, float]:
    """Accuracy on the data's y of each stage (scoring only: y never reaches the refinery),
    said as a table; {} without y. ``own_student``: distillation started from a given
    student (or heterogeneous parties' one), not the parameter average, and is named so."""
    if y is None:
        return {}
    first = "student" if own_student else "averaged"
    got = {first: accuracy_of(result.averaged_probs, y),
           "targets": accuracy_of(result.target_probs, y),
           "refined": accuracy_of(result.probs, y)}
    rows = [["student before refinement" if own_student else "averaged model", got[first]],
            ["teacher targets", got["targets"]]]
    if result.model_probs is not None:  # the labels are the model's neighbour vote
        got["refined_model"] = accuracy_of(result.model_probs, y)
        rows += [["refined model", got["refined_model"]],
                 ["labels (neighbour vote)", got["refined"]]]
    else:
        rows.append(["refined model", got["refined"]])
    if selection is not None and (~selection.abstained).any():
        keep = ~selection.abstained
        got["kept"] = accuracy_of(result.probs[keep], y[keep])
        rows.append(["kept labels (selective)", got["kept"]])
    out.say(table(rows, ["accuracy on --data y", ""]))
    return got


def summary(result: RefineResult, samples: int, opts: dict[str, Any], aggregate: str,
            selection: Selection | None, accuracy: dict[str, float],
            written: dict[str, Path | None]) -> dict[str, Any]:
    """The ``--json`` summary of a refine with data (``written``: labels, csv, model)."""
    info = result.to_dict()
    return {"command": "refine", "method": info["method"], "variant": info["variant"],
            "samples": samples, "u_t": info["u_t"], "heterogeneous": info["heterogeneous"],
            "notes": info["notes"], "sources": info.get("sources"),
            "novelty": info.get("novelty"), "branch": info.get("branch"),
            "class_prior": info.get("class_prior"),
            "neighbour_vote": info.get("neighbour_vote"),
            "input_reading": info.get("input_reading"), "parties": opts["parties"],
            "reliability": info.get("reliability"),
            "reliability_samples": info.get("reliability_samples"),
            "verdicts": info.get("verdicts"), "aggregate": aggregate,
            "estimated_accuracy": info.get("estimated_accuracy"),
            "calibration": result.calibration.attrs(),
            "selection": None if selection is None else selection.to_dict(),
            "accuracy": accuracy or None, "timings": result.timings,
            **{k: str(p) if p else None for k, p in written.items()}}
