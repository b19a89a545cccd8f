"""The ``mrtf`` command: thin wrappers that parse, call the library and format errors."""

from __future__ import annotations

import click

import mrtf
from mrtf.cli.common import MrtfGroup
from mrtf.cli.convert import convert
from mrtf.cli.data import data
from mrtf.cli.demo import demo
from mrtf.cli.inspect import inspect
from mrtf.cli.label import label
from mrtf.cli.refine import refine_cmd
from mrtf.cli.report import report
from mrtf.cli.score import score
from mrtf.cli.simulate import simulate
from mrtf.host_memory import limit_malloc_arenas


@click.group(cls=MrtfGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(mrtf.__version__, prog_name="mrtf")
def cli() -> None:
    """mrtf: refine received models into one model and one labeled dataset."""


for command in (simulate, refine_cmd, label, score, inspect, convert, demo, report, data):
    cli.add_command(command)


def main() -> None:
    limit_malloc_arenas()  # before any work starts the threads (mrtf/host_memory.py)
    cli(prog_name="mrtf")


if __name__ == "__main__":
    main()
