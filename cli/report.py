"""``mrtf report RUN_DIR``: re-render a run's plot, summary and metrics.h5 from metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

import click

from mrtf.cli.common import Out, output_options
from mrtf.errors import InputError


@click.command()
@click.argument("run_dir", type=click.Path(path_type=Path))
@output_options
def report(out: Out, run_dir: Path) -> None:
    """Re-render accuracy.png, summary.md and metrics.h5 of a run directory."""
    from mrtf.federated.report import render

    if not run_dir.is_dir():
        raise InputError(f"{run_dir} is not a directory")
    summary = render(run_dir)
    out.say((run_dir / "summary.md").read_text().rstrip())
    out.summary({"command": "report", "run": str(run_dir), "summary": summary})
