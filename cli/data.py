"""``mrtf data``: the standard datasets (mnist, usps, mnistm) in the data directory: fetch
them, list what is there, print where it is (mrtf.data.fetch, mrtf.data.registry)."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options, table
from mrtf.data.fetch import DATASETS, FetchOptions, fetch_dataset
from mrtf.data.registry import FILES, resolve_data_dir, verify
from mrtf.errors import InputError

_DATA_DIR = click.option(
    "--data-dir", type=click.Path(path_type=Path), default=None,
    help="Data directory (default: $MRTF_DATA, else $XDG_CACHE_HOME/mrtf/data or "
         "~/.cache/mrtf/data).")


@click.group("data")
def data() -> None:
    """The standard digit datasets: mnist (train/test), usps (train/test), mnistm (test)."""


@data.command("fetch")
@click.argument("names", nargs=-1, required=True)
@_DATA_DIR
@click.option("--mirror", default=None,
              help="Base URL laid out like the data directory (MIRROR/mnist/…, "
                   "MIRROR/usps/usps.h5, MIRROR/mnist_m/mnist_m_test.npz) instead of the "
                   "official sources; MNIST-M needs one.")
@click.option("--timeout", default=30.0, show_default=True,
              help="Seconds to wait for a connection or for data.")
@click.option("--retries", default=3, show_default=True,
              help="Retries per source after a network error (a cut download resumes).")
@output_options
def fetch(names: tuple[str, ...], data_dir: Path | None, mirror: str | None, timeout: float,
          retries: int, out: Out) -> None:
    """Download NAMES (mnist, usps, mnistm or all), verify their sha256 and place them in the
    data directory; files already there and verified are kept."""
    wanted = list(DATASETS) if "all" in names else list(dict.fromkeys(names))
    for name in wanted:
        if name not in DATASETS:
            raise InputError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)} "
                             "or all")
    if not timeout > 0 or not 0 <= retries <= 20:
        raise InputError("--timeout must be > 0 and --retries within 0..20")
    options = FetchOptions(timeout=timeout, retries=retries, progress=out.bars)
    root = resolve_data_dir(data_dir)
    done = []
    for name in wanted:
        for f in fetch_dataset(name, root, mirror, options):
            where = f" from {f.source}" if f.source else ""
            out.say(f"{f.status:10s} {f.path}{where}")
            done.append({"dataset": name, "path": str(f.path), "source": f.source,
                         "status": f.status})
    out.say(f"{', '.join(wanted)}: verified in {root}")
    out.summary({"command": "data fetch", "data_dir": str(root), "files": done})


@data.command("list")
@_DATA_DIR
@output_options
def list_cmd(data_dir: Path | None, out: Out) -> None:
    """Each file of the standard datasets: present or not, verified or not, where."""
    root = resolve_data_dir(data_dir)
    rows = []
    for spec in FILES:
        path = root / spec.path
        part = path.with_name(path.name + ".part")
        size = path.stat().st_size if path.is_file() else None
        if size is None:
            state = f"partial ({part.stat().st_size} bytes)" if part.is_file() else "missing"
        else:
            try:
                verify(root, spec)
                state = "verified"
            except InputError:
                state = "bad checksum"
        rows.append({"dataset": spec.dataset, "file": spec.path, "state": state,
                     "bytes": size})
    out.say(f"data directory: {root}")
    out.say(table([[r["dataset"], r["file"], r["state"], r["bytes"]] for r in rows],
                  ["dataset", "file", "state", "bytes"]))
    out.summary({"command": "data list", "data_dir": str(root), "files": rows})


@data.command("path")
@_DATA_DIR
def path_cmd(data_dir: Path | None) -> None:
    """Print the data directory (--data-dir, else $MRTF_DATA, else the user cache)."""
    click.echo(str(resolve_data_dir(data_dir)))
