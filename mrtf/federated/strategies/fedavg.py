"""FedAvg (McMahan et al.): the sample-weighted parameter average θ_{t+1} is the next global
model; the average is :class:`Strategy`'s default server step."""

from __future__ import annotations

from mrtf.federated.strategies.base import Strategy


class FedAvg(Strategy):
    """θ_{t+1} = Σ_k n_k θ_k / Σ_k n_k, sent to the next round's clients and scored."""

    name = "fedavg"
