"""Progress for long work, on a terminal and in a log.

On a terminal, tqdm bars. Piped into a log or run in CI a bar is one line rewritten with
carriage returns, or nothing: a 45-minute run then says nothing until the end. There,
:class:`LogBar` prints a plain line instead, at most every ``MRTF_PROGRESS_SECONDS`` (default
30) seconds across all bars, plus one when a long stage ends::

    mrtf: progress: distill 200/500 steps  elapsed 1m05s  ETA 1m37s  loss 0.4123

:func:`bar` picks one; :func:`log_lines` makes code that calls ``tqdm`` directly (the
refinery) print such lines for the duration of a block.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any

DEFAULT_SECONDS = 30.0


def interval() -> float:
    """Seconds between two progress lines (``MRTF_PROGRESS_SECONDS``, default 30)."""
    try:
        return max(0.0, float(os.environ.get("MRTF_PROGRESS_SECONDS", DEFAULT_SECONDS)))
    except ValueError:
        return DEFAULT_SECONDS


def duration(seconds: float) -> str:
    """``1h02m``, ``4m05s``, ``12s``."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class LogBar:
    """The part of tqdm's interface mrtf uses, printing rate-limited plain lines to stderr."""

    _last_line = float("-inf")  # monotonic time of the last line any bar printed (the rate limit)

    def __init__(self, iterable: Iterable | None = None, total: int | None = None,
                 desc: str = "", unit: str = "it", disable: bool = False, **_: Any) -> None:
        self.iterable, self.desc, self.unit, self.disable = iterable, desc or "", unit, disable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total, self.n = total, 0
        self.postfix: dict[str, Any] = {}
        self.start = time.monotonic()
        self.printed_n = -1  # done count of the last line printed (-1: none yet)

    def __iter__(self) -> Iterator:
        for item in self.iterable or ():
            yield item
            self.update(1)
        self.close()

    def __enter__(self) -> LogBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        # a stage shorter than the interval prints nothing; a longer one a line per interval
        since = max(LogBar._last_line, self.start)
        if not self.disable and time.monotonic() - since >= interval():
            self._line()

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True,
                    **kwargs: Any) -> None:
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def set_description(self, desc: str, refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        """The last line of a stage that printed one, or that took longer than the interval."""
        if self.disable or self.n == 0:
            self.disable = True
            return
        if self.printed_n != self.n and (self.printed_n >= 0
                                         or time.monotonic() - self.start >= interval()):
            self._line()
        self.disable = True

    def _line(self) -> None:
        elapsed = time.monotonic() - self.start
        done = f"{self.n}/{self.total}" if self.total else str(self.n)
        parts = [f"{self.desc} {done} {self.unit}s".strip(), f"elapsed {duration(elapsed)}"]
        if self.total and 0 < self.n < self.total:
            parts.append(f"ETA {duration(elapsed / self.n * (self.total - self.n))}")
        parts += [f"{k} {v}" for k, v in self.postfix.items()]
        print("mrtf: progress: " + "  ".join(parts), file=sys.stderr, flush=True)
        LogBar._last_line = time.monotonic()
        self.printed_n = self.n


def _tty() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def bar(total: int, desc: str, unit: str = "it", enabled: bool = True) -> Any:
    """A tqdm bar on a terminal, a :class:`LogBar` elsewhere, disabled when not ``enabled``."""
    if _tty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, leave=False,
                    dynamic_ncols=True)
    return LogBar(total=total, desc=desc, unit=unit, disable=not enabled)


@contextlib.contextmanager
def log_lines(enabled: bool = True) -> Iterator[None]:
    """Within the block, code that creates ``tqdm.tqdm`` / ``tqdm.auto.tqdm`` bars gets a
    :class:`LogBar` when stderr is not a terminal (the refinery imports tqdm where it draws
    a bar, so the swap reaches it). Nothing changes on a terminal or when not ``enabled``."""
    if not enabled or _tty():
        yield
        return
    import tqdm
    import tqdm.auto

    saved = tqdm.tqdm, tqdm.auto.tqdm
    tqdm.tqdm = tqdm.auto.tqdm = LogBar  # type: ignore[misc]
    try:
        yield
    finally:
        tqdm.tqdm, tqdm.auto.tqdm = saved
