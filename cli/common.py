"""What every command shares: error handling, ``--quiet``/``--json``, output helpers."""

from __future__ import annotations

import functools
import json
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from mrtf.errors import PRINT_LIMIT, FusionError, InputError, printable

#: the longest line a message prints (an error, a warning, one line of a report)
LINE_LIMIT = 10_000


class Terminated(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that every ``finally`` (temporary files,
    locks) runs before the process ends."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


class MrtfGroup(click.Group):
    """A click group that turns bad input into one line on stderr and exit code 2.

    SIGINT and SIGTERM unwind the command (its unfinished outputs are removed) and exit with
    130 and 143.
    """

    def invoke(self, ctx: click.Context) -> Any:
        old = None
        if threading.current_thread() is threading.main_thread():
            old = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except BaseException as exc:
            code = _exit_code_for(exc)
            if code is None:
                raise
            ctx.exit(code)
        finally:
            if old is not None:
                signal.signal(signal.SIGTERM, old)


def _exit_code_for(exc: BaseException) -> int | None:
    """Print the one line for a refused input or a signal and return the exit code; None for
    anything else (a bug: its traceback is shown)."""
    signalled = signal_behind(exc)
    if isinstance(signalled, KeyboardInterrupt):
        click.echo("mrtf: interrupted; unfinished outputs were removed", err=True)
        return 130
    if isinstance(signalled, Terminated):
        click.echo("mrtf: terminated; unfinished outputs were removed", err=True)
        return 143
    if isinstance(exc, (InputError, FusionError)):
        click.echo(f"mrtf: error: {shown(exc, LINE_LIMIT)}", err=True)
        return 2
    return None


def signal_behind(exc: BaseException) -> BaseException | None:
    """The KeyboardInterrupt or :class:`Terminated` that ``exc`` is or wraps, if any.

    A signal can arrive wrapped: Python 3.11 turns one raised inside a class body's
    ``__set_name__`` into a RuntimeError (it happened in CI when SIGINT landed while torch
    lazily imported ``torch._dynamo`` for the first optimizer), and a library may re-raise it
    as its own error.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (KeyboardInterrupt, Terminated)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def output_options(func: Callable) -> Callable:
    """Add ``--quiet`` and ``--json`` and pass an :class:`Out` as ``out``."""

    @click.option("--json", "as_json", is_flag=True,
                  help="Print one machine-readable JSON summary on stdout (and nothing else).")
    @click.option("--quiet", "-q", is_flag=True,
                  help="No progress (bars or log lines) and no chatter.")
    @functools.wraps(func)
    def wrapper(*args: Any, as_json: bool, quiet: bool, **kwargs: Any) -> Any:
        return func(*args, out=Out(quiet=quiet, as_json=as_json), **kwargs)

    return wrapper


class Out:
    """Where a command's words go: chatter on stdout unless quiet or JSON mode."""

    def __init__(self, quiet: bool = False, as_json: bool = False) -> None:
        self.quiet, self.as_json = quiet, as_json

    @property
    def chatty(self) -> bool:
        return not (self.quiet or self.as_json)

    @property
    def progress(self) -> bool:
        """Report progress: bars on a terminal, periodic plain lines on stderr elsewhere (a
        log, CI); never with --quiet or --json (mrtf.progress chooses the form)."""
        return self.chatty

    @property
    def bars(self) -> bool:
        """Progress shows as bars (an interactive terminal), not as lines."""
        return self.progress and sys.stderr.isatty()

    def say(self, text: str = "") -> None:
        """Lines of text on stdout; each line through :func:`shown` (text from a received
        file never drives the terminal)."""
        if self.chatty:
            click.echo("\n".join(shown(line, LINE_LIMIT) for line in text.split("\n")))

    def warn(self, text: str) -> None:
        """One ``mrtf: warning:`` line on stderr (a newline inside ``text`` is escaped)."""
        if not self.quiet:
            click.echo(f"mrtf: warning: {shown(text, LINE_LIMIT)}", err=True)

    def summary(self, data: dict[str, Any]) -> None:
        if self.as_json:
            click.echo(json.dumps(data, sort_keys=True, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def shown(value: Any, limit: int = PRINT_LIMIT) -> str:
    """What every printer of the CLI prints for a value: :func:`mrtf.errors.printable` (control
    characters escaped, at most ``limit`` characters). The one helper for text on a terminal;
    JSON output is escaped by ``json.dumps`` instead."""
    return printable(value, limit)


def table(rows: list[list[Any]], header: list[str]) -> str:
    """A plain fixed-width text table; every cell through :func:`shown`, so a cell is one line
    of at most :data:`~mrtf.errors.PRINT_LIMIT` characters."""
    cells = [[shown(c) for c in header]] + [[shown(_fmt(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "-" if value is None else str(value)
