"""Errors that mean "the input is bad", as opposed to a bug in mrtf.

The CLI turns every :class:`InputError` into one line on stderr and exit code 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """A user-supplied file, option or value is unusable; the message says which and why."""

    def __init__(self, message: str) -> None:
        # One line only: the CLI prints the message as is.
        super().__init__(" ".join(str(message).split()))


class FusionError(RuntimeError):
    """A refinement or fusion run diverged (NaN losses); nothing was written."""


class OutputError(InputError):
    """An output cannot be written (exists, is an input, folder not writable, disk full); the
    CLI reports it like bad input: one line, exit code 2, nothing left behind."""
