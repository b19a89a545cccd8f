"""``mrtf score``: labels against ground truth, with the calibration and coverage plots."""

from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from mrtf.cli.common import Out, output_options, table
from mrtf.errors import InputError
from mrtf.io.hdf5 import H5Dataset
from mrtf.io.labels import read_labels
from mrtf.io.outputs import Outputs
from mrtf.scoring import score_labels
from mrtf.trust.metrics import ece, ece_floor


@click.command()
@click.argument("labels", type=click.Path(path_type=Path))
@click.option("--truth", type=click.Path(path_type=Path), required=True,
              help="An .h5 dataset holding the true labels y.")
@click.option("--plot", type=click.Path(path_type=Path), default=None,
              help="Write a PNG: reliability diagram of the confidence (15 bins) and the "
                   "risk-coverage curve.")
@click.option("--force", is_flag=True, help="Replace an existing --plot file.")
@output_options
def score(labels: Path, truth: Path, out: Out, plot: Path | None = None,
          force: bool = False) -> None:
    """Score a LABELS file against the y of --truth."""
    with Outputs([plot], force, (labels, truth)) as outs:
        _score(labels, truth, out, plot, outs)


def _score(labels: Path, truth: Path, out: Out, plot: Path | None, outs: Outputs) -> None:
    predicted = read_labels(labels)
    y = _truth(labels, truth, predicted)
    c = predicted.probs.shape[1]
    abst = predicted.abstained if predicted.abstained is not None else \
        np.zeros(len(y), dtype=bool)
    full = predicted.probs.argmax(1)  # every sample's label, abstained ones included
    if abst.all():
        raise InputError(f"{labels}: every sample is abstained (label -1); nothing to score")
    result = score_labels(predicted.labels[~abst], y[~abst], c)
    if abst.any():
        result["coverage"] = float((~abst).mean())
        result["accuracy_all"] = float((full == y).mean())
        out.say(f"accuracy {result['accuracy']:.4f} on the {result['n']} labeled samples "
                f"(coverage {result['coverage']:.3f}; {int(abst.sum())} abstained); "
                f"{result['accuracy_all']:.4f} on all {len(y)} with the abstained ones' "
                "argmax")
    else:
        out.say(f"accuracy {result['accuracy']:.4f} on {result['n']} samples")
    correct = full == y
    _calibration(result, predicted.confidence, correct, predicted.calibration or {}, out)
    out.say(table([[i, result["per_class"][i], result["support"][i]] for i in range(c)],
                  ["class", "accuracy", "support"]))
    out.say("confusion (rows: true, columns: predicted)")
    out.say(table([[i, *row] for i, row in enumerate(result["confusion"])],
                  ["", *map(str, range(c))]))
    if plot is not None:
        from mrtf.trust.plots import plot_trust

        with outs.writing(plot) as tmp:
            plot_trust(tmp, predicted.confidence, correct, f"{labels.name}: accuracy "
                       f"{float(correct.mean()):.3f}", atomic=False)
        outs.commit()
        out.say(f"wrote the reliability diagram and risk-coverage curve to {plot}")
    out.summary({"command": "score", **result, "plot": str(plot) if plot else None})


def _truth(labels: Path, truth: Path, predicted) -> np.ndarray:
    """``truth``'s y, checked against the labels file: row count, ids and class range."""
    with H5Dataset(truth) as ds:
        if not ds.has_labels:
            raise InputError(f"{truth}: has no 'y' to score against")
        if len(ds) != len(predicted.labels):  # before reading y: its row count is declared
            raise InputError(f"{labels} holds {len(predicted.labels)} labels but {truth} has "
                             f"{len(ds)} samples")
        # the labels file says how many classes there are; a y outside them is refused, not
        # given a row of its own (y = 10^12 would ask for a 10^12 × 10^12 confusion matrix)
        ds.check_columns(predicted.probs.shape[1], f" of {labels}")
        y, ids = ds.labels(), ds.ids()
    if predicted.ids is not None and ids is not None and (
            len(ids) != len(predicted.ids) or not np.array_equal(ids, predicted.ids)):
        raise InputError(f"{labels} and {truth} hold different sample ids")
    return y


def _calibration(result: dict, conf: np.ndarray, correct: np.ndarray, cal: dict,
                 out: Out) -> None:
    """The confidence column's ECE beside its sampling floor, and the labels file's
    estimated accuracy against the true one (into ``result`` and printed)."""
    result["ece"] = ece(conf, correct)
    result["ece_sampling_floor"] = ece_floor(conf)
    est = cal.get("estimated_accuracy")
    if isinstance(est, (int, float)):
        result["estimated_accuracy"] = float(est)
        pm = cal.get("plus_minus")
        out.say(f"estimated accuracy {float(est):.4f}"
                + (f" (±{float(pm):.3f})" if isinstance(pm, (int, float)) else "")
                + f" vs true {float(correct.mean()):.4f} (all samples): "
                f"{100 * (float(est) - float(correct.mean())):+.1f} points")
    out.say(f"ECE of the confidence column (15 bins): {result['ece']:.4f}"
            + ("" if cal else " (uncalibrated: the max probability)")
            + f"; a perfectly calibrated one would show ~{result['ece_sampling_floor']:.4f} "
            f"on {len(correct):,} samples (sampling alone)")
