"""``mrtf label``: a refined (or any received) model labels newly collected data."""

from __future__ import annotations

from pathlib import Path

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


@click.command()
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--data", type=click.Path(path_type=Path), required=True,
              help="Samples to label (.h5 with x).")
@click.option("--labels", "labels_out", type=click.Path(path_type=Path), default=None,
              help="Where to write the labels (.h5).")
@click.option("--csv", "csv_out", type=click.Path(path_type=Path), default=None,
              help="Write the labels as CSV too: id (the file name, or the row), label, "
                   "confidence.")
@click.option("--batch-size", type=int, default=1024, show_default=True)
@click.option("--min-confidence", type=float, default=None,
              help="Leave samples whose confidence is below this unlabeled (label -1, "
                   "abstained = 1).")
@click.option("--coverage", type=float, default=None,
              help="Label only this fraction of the samples, the most confident ones.")
@click.option("--trust-arch", multiple=True, help="A package.module:factory you trust.")
@click.option("--device", default=None)
@click.option("--force", is_flag=True, help="Replace an existing labels file.")
@output_options
def label(model: Path, data: Path, labels_out: Path | None, csv_out: Path | None,
          batch_size: int, trust_arch: tuple[str, ...], device: str | None, force: bool,
          out: Out, min_confidence: float | None = None, coverage: float | None = None
          ) -> None:
    """Label new data with a (refined) MODEL file: --labels (.h5) and/or --csv."""
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

