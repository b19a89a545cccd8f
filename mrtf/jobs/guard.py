"""The heavy part of a job, guarded: running out of memory, and a failure inside faiss (which
only non-finite features cause), become one line (:class:`mrtf.errors.InputError`,
:class:`mrtf.errors.FusionError`) instead of a traceback after a long run."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from mrtf.errors import FusionError, InputError


def run_guarded(work: Callable[[], Any]) -> Any:
    """Run the heavy part of a command; running out of memory becomes one line, and so does a
    failure inside faiss, which only non-finite features (models whose outputs overflow on
    this data) cause. numpy's overflow warnings are silenced: the outputs are checked for
    finiteness before anything is written, and that check says what went wrong."""
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            return work()
    except MemoryError:
        raise InputError("ran out of memory (the data or the models are too large for this "
                         "machine); nothing was written") from None
    except (AssertionError, RuntimeError) as exc:
        if not _raised_in_faiss(exc):
            raise
        raise FusionError("clustering failed on non-finite features (the models' outputs "
                          "overflow float32 on this data); nothing was written") from None


def _raised_in_faiss(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if f"{os.sep}faiss{os.sep}" in tb.tb_frame.f_code.co_filename:
            return True
        tb = tb.tb_next
    return False
