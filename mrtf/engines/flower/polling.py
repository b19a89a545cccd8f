"""A Grid whose ``send_and_receive`` polls for replies every ``interval`` seconds.

Flower's own polls every 3 s, so every message round trip costs up to 3 s of idle waiting on
top of the ClientApp's process start; a tiny round trains in well under a second. The replies
are the same: only the waiting between pulls changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any


class PollingGrid:
    """Delegates everything to ``grid``; ``send_and_receive`` pulls every ``interval`` s."""

    def __init__(self, grid: Any, interval: float) -> None:
        self._grid = grid
        self._interval = interval

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None
                         ) -> list[Any]:
        ids = {i for i in self._grid.push_messages(messages) if i is not None}
        end = None if timeout is None else time.monotonic() + timeout
        replies: list[Any] = []
        while ids:
            got = list(self._grid.pull_messages(ids))
            replies.extend(got)
            ids.difference_update(m.metadata.reply_to_message_id for m in got)
            if not ids or (end is not None and time.monotonic() >= end):
                break
            time.sleep(self._interval)
        return replies
