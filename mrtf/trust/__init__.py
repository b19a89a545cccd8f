"""Trust: whom the pilot party learns from and how sure its labels are (issue 13).

- :mod:`mrtf.trust.selection`: which received models count at all (round and θ_t claims
  checked against the other files, copies under several names counted once), before any data.
- :mod:`mrtf.trust.basin`: whether the parties share a basin (one start), so that their
  parameter average means something.
- :mod:`mrtf.trust.reliability`: per-party reliability measured on the unlabeled target set
  (agreement with the leave-one-out consensus, prediction histogram, confidence, weight-space
  distance, claims checked against behaviour) and a verdict per party.
- :mod:`mrtf.trust.weights`: what the weights alone say (distance, norm, an output layer that
  is θ_t's with its class rows renamed).
- :mod:`mrtf.trust.calibration`: a confidence that means what it says, chosen without labels.
- :mod:`mrtf.trust.estimate`: a label-free estimate of the labels' accuracy.
- :mod:`mrtf.trust.selective`: abstain on low-confidence samples (``--min-confidence``,
  ``--coverage``).

Nothing here reads the target's ``y``.
"""

from mrtf.trust.reliability import (
    PartyReliability,
    ReliabilityReport,
    assess,
)

__all__ = ["PartyReliability", "ReliabilityReport", "assess"]
