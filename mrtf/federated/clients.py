"""Client algorithms: how a selected client trains from the global model (the engine calls one
per round for every client whose strategy has no client update of its own).

* ``fedavg`` / ``fedprox``: local SGD (:func:`~mrtf.federated.local.local_train`); FedProx's
  proximal term comes from ``LocalConfig.mu``.
* ``scaffold``: local SGD with SCAFFOLD's control variates (option II); the server control c
  and each client's c_k persist across rounds and are checkpointed with the run.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from mrtf.federated.local import LocalConfig, LocalResult, local_train


class ClientAlgorithm:
    """FedAvg / FedProx local SGD; no state between rounds."""

    name = "fedavg"

    def __init__(self, local: LocalConfig, num_clients: int) -> None:
        self.local, self.num_clients = local, num_clients

    def initialize(self, model: nn.Module) -> None:
        """Called once with the initial model before the first round (not on resume)."""

    def train(self, k: int, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
              num_classes: int, seed: int, device: torch.device | str) -> LocalResult:
        return local_train(model, x, y, num_classes, self.local, seed=seed, device=device)

    def end_round(self) -> None:
        """Called after every client of a round has trained."""

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_json(self) -> dict:
        return {}

    def load_state(self, tensors: dict[str, torch.Tensor], meta: dict) -> None:
        pass


class Scaffold(ClientAlgorithm):
    """SCAFFOLD (Karimireddy et al., option II): the local gradients are corrected by c − c_k;
    after training, c_k⁺ = c_k − c + (θ_t − θ_k)/(K_steps·η_eff), and at the end of the round
    c ← c + (1/N) Σ_{k∈S} Δc_k.

    η_eff = lr / (1 − momentum): with heavy-ball momentum the local SGD moves about that far
    per unit gradient, and dividing by the bare lr overstates the gradient (×10 at 0.9), which
    makes the control variates blow up."""

    name = "scaffold"

    def __init__(self, local: LocalConfig, num_clients: int) -> None:
        super().__init__(local, num_clients)
        self.control: dict[str, torch.Tensor] = {}
        self.client_controls: dict[int, dict[str, torch.Tensor]] = {}
        self._deltas: list[dict[str, torch.Tensor]] = []

    def initialize(self, model: nn.Module) -> None:
        self.control = {k: torch.zeros_like(p) for k, p in model.named_parameters()}
        self.client_controls = {}

    def train(self, k, model, x, y, num_classes, seed, device):
        ck = self.client_controls.get(k)
        ctrl = {n: self.control[n] - (ck[n] if ck else 0.0) for n in self.control}
        res = local_train(model, x, y, num_classes, self.local, seed=seed, device=device,
                          control=ctrl)
        self._deltas.append(self._update_client(k, model, res.model, len(x)))
        return res

    def _update_client(self, k: int, start: nn.Module, trained: nn.Module, n: int
                       ) -> dict[str, torch.Tensor]:
        """c_k⁺ for client k (stored); returns Δc_k = c_k⁺ − c_k."""
        local = self.local
        batch = min(local.batch_size, n)
        steps = local.steps or local.epochs * max(1, int(np.ceil(n / batch)))
        eff_lr = local.lr / (1.0 - local.momentum)
        start_p = dict(start.named_parameters())
        new_p = dict(trained.named_parameters())
        old = self.client_controls.get(k) or {n_: torch.zeros_like(v)
                                              for n_, v in self.control.items()}
        new = {n_: (old[n_] - self.control[n_] + (start_p[n_].detach().cpu()
                                                  - new_p[n_].detach().cpu()) / (steps * eff_lr))
               for n_ in self.control}
        self.client_controls[k] = new
        return {n_: new[n_] - old[n_] for n_ in new}

    def end_round(self) -> None:
        if self._deltas:
            for n in self.control:  # c ← c + (1/N) Σ_{k∈S} Δc_k
                self.control[n] = self.control[n] + sum(d[n] for d in self._deltas) \
                    / self.num_clients
        self._deltas = []

    def state_tensors(self):
        out = {f"control.{k}": v for k, v in self.control.items()}
        for c, st in self.client_controls.items():
            out.update({f"ccontrol.{c}.{k}": v for k, v in st.items()})
        return out

    def state_json(self):
        return {"scaffold": True, "client_controls": sorted(self.client_controls)}

    def load_state(self, tensors, meta):
        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}

        self.control = part("control.")
        self.client_controls = {int(c): part(f"ccontrol.{c}.")
                                for c in meta.get("client_controls", [])}
        self._deltas = []


#: --local-algorithm name → client algorithm (FedProx is local SGD with LocalConfig.mu > 0)
CLIENT_ALGORITHMS: dict[str, type[ClientAlgorithm]] = {
    "fedavg": ClientAlgorithm, "fedprox": ClientAlgorithm, "scaffold": Scaffold}
LOCAL_ALGORITHMS = tuple(CLIENT_ALGORITHMS)


def make_client(name: str, local: LocalConfig, num_clients: int) -> ClientAlgorithm:
    return CLIENT_ALGORITHMS[name](local, num_clients)
