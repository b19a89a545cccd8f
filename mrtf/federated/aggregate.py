"""Parameter averaging lives in :mod:`mrtf.averaging` (the refinery and data-free fusion use it
too); re-exported here for the federation's callers."""

from mrtf.averaging import average_received, average_states

__all__ = ["average_received", "average_states"]
