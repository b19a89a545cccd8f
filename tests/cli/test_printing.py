"""One helper for every printer (issue 35): text from a received file can neither forge a
line of output nor drive the terminal, and it is bounded in length."""

from __future__ import annotations

from collections.abc import Callable

import click
import pytest
from click.testing import CliRunner, Result

from mrtf.cli.common import MrtfGroup, Out, Terminated, shown, signal_behind, table
from mrtf.errors import InputError, printable

FORGED = "p2\nmrtf: error: forged\x1b[2J\r\x07\u202eevil\u2028x"


def _run(body: Callable[[], None]) -> Result:
    """``body`` run as the command ``go`` of an MrtfGroup, as the CLI runs its commands."""
    @click.group(cls=MrtfGroup)
    def main() -> None:
        pass

    main.command("go")(body)
    return CliRunner().invoke(main, ["go"])


def test_printable_escapes_control_and_format_characters() -> None:
    assert printable(FORGED) == ("p2\\x0amrtf: error: forged\\x1b[2J\\x0d\\x07\\u202eevil"
                                 "\\u2028x")
    assert printable("naïve 中文 party-1") == "naïve 中文 party-1"  # ordinary text unchanged
    assert printable("\U000e0001") == "\\U000e0001"


def test_printable_caps_the_length_before_escaping() -> None:
    assert printable("x" * 10**6, 50) == "x" * 50 + "…"
    assert len(printable("\x1b" * 10**6, 10)) == 10 * 4 + 1


def test_table_cells_are_one_escaped_line_each() -> None:
    text = table([[FORGED, "y" * 500, None]], ["party", "long", "none"])
    lines = text.splitlines()
    assert len(lines) == 3  # header, rule, one row
    assert "\x1b" not in text and "\r" not in text
    assert "p2\\x0amrtf: error: forged" in lines[2]
    assert "y" * 200 + "…" in lines[2] and "y" * 201 not in lines[2]


def test_say_warn_and_errors_escape_what_they_print() -> None:
    def go() -> None:
        out = Out()
        # a text's own newlines stay lines (tables); every other control character is
        # escaped. (Values with a newline never reach say: names from received files are
        # refused or passed through shown() first, tests/io/test_hostile_round2.py.)
        out.say(f"line one {FORGED.replace(chr(10), ' ')}\nline two")
        out.warn(f"warned {FORGED}")
        raise InputError(f"refused {FORGED}")

    res = _run(go)
    assert res.exit_code == 2
    assert res.stdout.splitlines()[0].startswith("line one p2 mrtf: error: forged\\x1b[2J")
    assert res.stdout.splitlines()[1] == "line two"
    for text in (res.stdout, res.stderr):
        assert not any(c in text for c in "\x1b\r\x07\u202e\u2028")
    err = res.stderr.splitlines()
    assert len(err) == 2 and err[0].startswith("mrtf: warning: warned p2\\x0amrtf: error:")
    assert err[1].startswith("mrtf: error: refused p2 mrtf: error: forged\\x1b[2J")
    assert shown(FORGED) == printable(FORGED)


class _SetNameSignals:
    """A descriptor whose ``__set_name__`` is interrupted, as torch's lazy imports were."""

    def __init__(self, signalled: BaseException) -> None:
        self.signalled = signalled

    def __set_name__(self, owner: type, name: str) -> None:
        raise self.signalled


@pytest.mark.parametrize("signalled, code, word", [(KeyboardInterrupt(), 130, "interrupted"),
                                                   (Terminated(), 143, "terminated")])
def test_a_signal_wrapped_by_another_error_still_exits_as_the_signal(signalled, code,
                                                                     word) -> None:
    def go() -> None:
        try:
            type("Interrupted", (), {"field": _SetNameSignals(signalled)})
        except BaseException as exc:  # 3.11 wraps it in RuntimeError, 3.12 re-raises it
            raise InputError("a library's own error, raised from the signal") from exc

    res = _run(go)
    assert res.exit_code == code, res.output
    assert res.stderr.splitlines() == [f"mrtf: {word}; unfinished outputs were removed"]
    assert signal_behind(RuntimeError("no signal behind it")) is None


def test_an_unexpected_error_is_not_swallowed() -> None:
    def go() -> None:
        raise ValueError("a bug")

    res = _run(go)
    assert res.exit_code == 1 and isinstance(res.exception, ValueError)
