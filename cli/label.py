"""``mrtf label``: a refined (or any received) model labels newly collected data."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from mrtf.cli.common import Out, output_options
from mrtf.errors import InputError
from mrtf.io.bundles import load_bundle
from mrtf.io.hdf5 import H5Dataset
from mrtf.io.labels import write_labels
from mrtf.io.labels_csv import write_labels_csv
from mrtf.io.limits import check_memory, labeling_bytes
from mrtf.io.outputs import Outputs
from mrtf.jobs.guard import run_guarded
from mrtf.labeling import label as label_data
from mrtf.progress import log_lines
from mrtf.refinery import accuracy_of
from mrtf.trust.selective import check_selection


@dataclass(frozen=True)
class LabelFiles:
    """Where ``mrtf label`` writes: the labels (.h5) and/or the CSV; ``force`` replaces
    existing files."""

    labels: Path | None = None
    csv: Path | None = None
    force: bool = False


@dataclass(frozen=True)
class SelectionRule:
    """Selective labeling (mrtf.trust.selective): leave samples below ``min_confidence``
    unlabeled, or label only the ``coverage`` fraction that is most confident (None: off)."""

    min_confidence: float | None = None
    coverage: float | None = None


def label_file_options(func: Callable) -> Callable:
    """Add ``--labels``, ``--csv`` and ``--force`` and pass a :class:`LabelFiles` as ``files``."""

    @click.option("--labels", "labels_out", type=click.Path(path_type=Path), default=None,
                  help="Where to write the labels (.h5).")
    @click.option("--csv", "csv_out", type=click.Path(path_type=Path), default=None,
                  help="Write the labels as CSV too: id (the file name, or the row), label, "
                       "confidence.")
    @click.option("--force", is_flag=True, help="Replace an existing labels file.")
    @functools.wraps(func)
    def wrapper(*args: Any, labels_out: Path | None, csv_out: Path | None, force: bool,
                **kwargs: Any) -> Any:
        return func(*args, files=LabelFiles(labels_out, csv_out, force), **kwargs)

    return wrapper


def selection_options(func: Callable) -> Callable:
    """Add ``--min-confidence`` and ``--coverage`` and pass a :class:`SelectionRule` as
    ``rule``."""

    @click.option("--min-confidence", type=float, default=None,
                  help="Leave samples whose confidence is below this unlabeled (label -1, "
                       "abstained = 1).")
    @click.option("--coverage", type=float, default=None,
                  help="Label only this fraction of the samples, the most confident ones.")
    @functools.wraps(func)
    def wrapper(*args: Any, min_confidence: float | None, coverage: float | None,
                **kwargs: Any) -> Any:
        return func(*args, rule=SelectionRule(min_confidence, coverage), **kwargs)

    return wrapper


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(path_type=Path), required=True,
              help="Samples to label (.h5 with x).")
@label_file_options
@click.option("--batch-size", type=int, default=1024, show_default=True)
@selection_options
@click.option("--trust-arch", multiple=True, help="A package.module:factory you trust.")
@click.option("--device", default=None)
@output_options
def label(model: Path, data: Path, files: LabelFiles, batch_size: int,
          trust_arch: tuple[str, ...], device: str | None, out: Out,
          rule: SelectionRule = SelectionRule()) -> None:
    """Label new data with a (refined) MODEL file: --labels (.h5) and/or --csv."""
    labels_out, csv_out, force = files.labels, files.csv, files.force
    min_confidence, coverage = rule.min_confidence, rule.coverage
    if labels_out is None and csv_out is None:
        raise InputError("nothing to write: give --labels FILE.h5 and/or --csv FILE.csv")
    check_selection(min_confidence, coverage)
    with Outputs([labels_out, csv_out], force, (data, model)) as outs:
        bundle = load_bundle(model, trust_arch)
        for note in bundle.notes:
            out.warn(f"{bundle.path.name}: {note}")
        with H5Dataset(data) as source:
            check_memory(labeling_bytes(len(source), bundle.meta.num_classes),
                         f"labeling {len(source):,} samples")
            outs.check_space({p: len(source) * (bundle.meta.num_classes + 6) * 4
                              for p in (labels_out, csv_out) if p is not None})
            source.check_columns(bundle.meta.num_classes, f" of {bundle.path.name}")
            with log_lines(out.progress):
                result = run_guarded(lambda: label_data(
                    bundle, source, batch_size=batch_size, device=device,
                    min_confidence=min_confidence, coverage=coverage))
            probs, labels, cal, selection = (result.probs, result.labels, result.calibration,
                                             result.selection)
            if labels_out is not None:
                with outs.writing(labels_out) as tmp:
                    write_labels(tmp, labels, "label", {"model": str(model)},
                                 [bundle.meta.party or bundle.path.stem], atomic=False)
            if csv_out is not None:
                with outs.writing(csv_out) as tmp:
                    write_labels_csv(tmp, labels, atomic=False)
            y = source.labels()
        outs.commit()
    acc = accuracy_of(probs, y) if y is not None else None
    where = " and ".join(str(p) for p in (labels_out, csv_out) if p is not None)
    out.say(f"labeled {len(probs)} samples with {model.name} → {where}"
            + (f"  (accuracy on y: {acc:.4f})" if acc is not None else ""))
    out.say(cal.line())
    for note in cal.notes:
        out.say(f"note: {note}")
    if selection is not None:
        out.say(f"selective labeling ({selection.rule}): {int(selection.abstained.sum())} of "
                f"{len(probs)} samples left unlabeled (label -1)")
    out.summary({"command": "label", "samples": len(probs),
                 "labels": str(labels_out) if labels_out else None,
                 "csv": str(csv_out) if csv_out else None, "accuracy": acc,
                 "calibration": cal.attrs(),
                 "selection": None if selection is None else selection.to_dict()})

