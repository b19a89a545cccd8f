"""What ``mrtf refine`` says about a finished refinery run: its account of the sources, the
calibration and selective labeling, the scores when the data has y, and the JSON summary.
Nothing here changes a result; refine.py decides and writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from mrtf.cli.common import Out, table
from mrtf.refinery import RefineResult, accuracy_of
from mrtf.trust.selective import Selection


def say_account(result: RefineResult, out: Out) -> None:
    """The refinery's notes, the parties' reliability, each source's trust, the adaptive
    method's choices (class prior, distil-or-adapt, neighbour vote) and the calibration."""
    info = result.info
    for note in info["notes"]:
        out.say(f"note: {note}")
    if "reliability" in info:
        say_reliability(info["reliability"], out)
    for line in info.get("trust", []):
        out.say(f"source {line}")
    if "class_prior" in info:  # the adaptive method's class prior, and why
        out.say(info["class_prior"]["line"])
    if "novelty" in info:  # the adaptive method's choice: distil the vote or adapt
        out.say(info["novelty"]["line"])
    if "branch" in info:  # ... and, when both branches ran, which was kept
        out.say(info["branch"]["line"])
    if "neighbour_vote" in info:
        nv = info["neighbour_vote"]
        out.say(f"neighbour vote (k = {nv['k']}, among {nv['reference']:,} samples): "
                f"{nv['changed']:,} labels differ from the refined model's own prediction")
    cal = result.calibration
    out.say(cal.line())
    for note in cal.notes:
        out.say(f"note: {note}")


def say_reliability(parties: list[dict[str, Any]], out: Out) -> None:
    """The per-party table and verdicts (mrtf.trust.reliability), as ``inspect --data``."""
    from mrtf.trust.reliability import PartyReliability, ReliabilityReport

    report = ReliabilityReport([PartyReliability(**p) for p in parties], [])
    out.say(table(report.rows(), report.HEADER))
    flagged = report.flagged
    out.say(f"{len(flagged)} parties flagged: " + (
        ", ".join(f"{p.name} ({p.verdict})" for p in flagged) if flagged else "none"))


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
    info, cfg = result.info, result.info["config"]
    return {"command": "refine", "method": cfg["method"], "variant": cfg["variant"],
            "samples": samples, "u_t": info["u_t"], "heterogeneous": info["heterogeneous"],
            "notes": info["notes"], "sources": info.get("sources"),
            "novelty": info.get("novelty"), "branch": info.get("branch"),
            "class_prior": info.get("class_prior"),
            "neighbour_vote": info.get("neighbour_vote"), "parties": opts["parties"],
            "reliability": info.get("reliability"),
            "reliability_samples": info.get("reliability_samples"),
            "verdicts": info.get("verdicts"), "aggregate": aggregate,
            "estimated_accuracy": info.get("estimated_accuracy"),
            "calibration": result.calibration.attrs(),
            "selection": None if selection is None else selection.to_dict(),
            "accuracy": accuracy or None, "timings": result.timings,
            **{k: str(p) if p else None for k, p in written.items()}}
