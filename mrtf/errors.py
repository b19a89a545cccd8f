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


def clip(text: str, limit: int = 160) -> str:
    """``text`` on one line, at most about ``limit`` characters, never cut inside a word: a
    library's message (torch, h5py, PIL) can run to pages, and a cut mid-word ("...but g")
    reads as a bug of its own. A cut is marked with "…"."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    head = text[:cut] if cut > limit // 2 else text[:limit]
    return head.rstrip(" ,;:(") + " …"


def first_line(exc: BaseException, limit: int = 160) -> str:
    """The first line of an exception's message, clipped at a word boundary."""
    lines = str(exc).strip().splitlines()
    return clip(lines[0], limit) if lines else type(exc).__name__


#: the longest text :func:`printable` shows of one value (a party name, a file name, a cell)
PRINT_LIMIT = 200


def printable(text: object, limit: int = PRINT_LIMIT) -> str:
    """``text`` safe to print on a terminal, for any string that came from a received file (a
    party name, a file name, an attribute): control and format characters (newlines, terminal
    escapes, bidirectional overrides, line separators) shown as ``\\xNN`` / ``\\uNNNN`` so that
    a value can neither forge a line (``mrtf: error: ...``) nor drive the terminal, and at most
    ``limit`` characters (a cut is marked with "…"). Ordinary text, accents included, is
    unchanged."""
    text = str(text)
    if len(text) > limit:  # cut first: a 90 MB name is not escaped in full
        text = text[:limit] + "…"
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 \
        else f"\\U{code:08x}"
