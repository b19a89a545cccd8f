"""``mrtf convert``: datasets into the HDF5 format (built-in names, .npz/.npy, image folders)."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options
from mrtf.data import DATASET_NAMES, import_to_h5, is_dataset_name, load_dataset
from mrtf.errors import InputError
from mrtf.io.hdf5 import H5Dataset, write_dataset
from mrtf.io.outputs import Outputs


@click.command()
@click.argument("source")
@click.argument("output", type=click.Path(path_type=Path))
@click.option("--labels", "labels_file", type=click.Path(path_type=Path), default=None,
              help="A .npy of labels for an .npy SOURCE.")
@click.option("--image-size", type=int, default=None, help="Resize images to this size.")
@click.option("--channels", type=click.Choice(["1", "3"]), default=None,
              help="Convert images to 1 or 3 channels.")
@click.option("--unlabeled", is_flag=True, help="Leave out y (a target set to label).")
@click.option("--force", is_flag=True, help="Replace an existing OUTPUT.")
@output_options
def convert(source: str, output: Path, labels_file: Path | None, image_size: int | None,
            channels: str | None, unlabeled: bool, force: bool, out: Out) -> None:
    """Write SOURCE (a built-in dataset name; a standard one, mnist, usps or mnistm as NAME,
    NAME:SPLIT or usps[:SPLIT]:framed (USPS in MNIST's frame), read from $MRTF_DATA (see
    `mrtf data`); an .npz, an .npy, or an image folder
    with one sub-folder per class, or flat for unlabeled images) to OUTPUT as an HDF5
    dataset."""
    chans = int(channels) if channels else None
    named = is_dataset_name(source)
    if not named and not Path(source).exists():
        raise InputError(f"{source}: no such file, folder or dataset ({DATASET_NAMES})")
    if not named and unlabeled:
        raise InputError("--unlabeled applies to built-in datasets; leave labels out of "
                         "the source instead")
    inputs = [Path(source), labels_file] if not named else []
    with Outputs([output], force, inputs) as outs, outs.writing(output) as tmp:
        if named:
            ds = load_dataset(source, image_size, chans)
            write_dataset(tmp, ds.x, None if unlabeled else ds.y, ids=range(len(ds.y)),
                          attrs={"source": source}, atomic=False)
        else:
            import_to_h5(source, tmp, labels_file, image_size, chans, atomic=False)
        with H5Dataset(tmp) as ds:
            n, shape, labeled = len(ds), ds.sample_shape, ds.has_labels
        outs.commit()
    out.say(f"wrote {n} samples of shape {'×'.join(map(str, shape))} "
            f"({'labeled' if labeled else 'unlabeled'}) to {output}")
    out.summary({"command": "convert", "output": str(output), "samples": n,
                 "shape": list(shape), "labeled": labeled})
