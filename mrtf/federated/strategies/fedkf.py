"""FedKF (fedkf Alg. 1), both halves: the server strategy (ACA sent to the clients, OCA cache
of every client's latest model) and the client update it replaces local SGD with."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.averaging import average_states
from mrtf.datafree.common import FusionState, freeze
from mrtf.datafree.config import FusionConfig
from mrtf.datafree.fedkf import generator_step as kf_generator_step
from mrtf.datafree.fedkf import kd_loss
from mrtf.datafree.generators import UnconditionalGenerator, sample_noise
from mrtf.federated.local import LocalConfig, LocalResult
from mrtf.federated.strategies.base import (
    Aggregated,
    ServerContext,
    Strategy,
    average_updates,
    cpu_state,
    sub_seed,
)
from mrtf.models import has_batchnorm


class FedKFStrategy(Strategy):
    """Client side: each active client trains its persistent generator against the OCA
    teacher ŵ^{t-1} (L_IE + λ1·L_OH + λ2·L_A) and its model on CE(real batch) +
    γ·KL(teacher ‖ model) on generated samples, one step each per batch (lines 17-19). The
    server sends the ACA model w^t (line 9) and keeps the cache of every client's latest model
    for OCA ŵ^t (lines 7, 10). Both ACA and OCA are scored; the method's accuracy is OCA's.
    The generators' Adam is re-created each round."""

    name = "fedkf"

    def __init__(self, ctx: ServerContext, name: str | None = None) -> None:
        super().__init__(ctx, name)
        s = ctx.settings
        self.cfg = FusionConfig(method="fedkf", batch_size=s.fusion_batch
                                ).validate().resolved("fedkf")
        self.init_state: dict[str, torch.Tensor] = {}
        self.cache: dict[int, dict[str, torch.Tensor]] = {}
        self.generators: dict[int, UnconditionalGenerator] = {}
        self.oca: dict[str, torch.Tensor] = {}

    def initialize(self, init_state):
        self.init_state = cpu_state(init_state)
        self.oca = self.init_state

    def _generator(self, k: int) -> UnconditionalGenerator:
        if k not in self.generators:
            torch.manual_seed(sub_seed(self.ctx.seed, k, "fedkf-generator"))
            self.generators[k] = UnconditionalGenerator(
                self.ctx.image_shape, self.cfg.noise_dim or 100, self.cfg.activation,
                self.ctx.num_classes)
        return self.generators[k]

    def client_update(self, rnd, k, model, x, y, local, seed):
        if rnd < self.ctx.settings.fedkf_kd_from_round:
            return None
        teacher = self.ctx.build(self.oca)
        kf = KfDistillation(teacher, self._generator(k), self.cfg)
        res = fedkf_local_train(model, kf, x, y, self.ctx.num_classes, local, seed,
                                self.ctx.device)
        self.generators[k] = self.generators[k].cpu()
        return res

    def _oca(self) -> dict[str, torch.Tensor]:
        sizes = self.ctx.client_sizes
        if self.ctx.settings.fedkf_oca == "reference":
            ks = sorted(self.cache)
            return average_states([self.cache[k] for k in ks], [sizes[k] for k in ks])
        states = [self.cache.get(k, self.init_state) for k in range(len(sizes))]
        return average_states(states, [max(1, n) for n in sizes])

    def aggregate(self, rnd, start_state, updates, evaluate):
        aca = average_updates(updates)
        for u in updates:
            self.cache[u.client] = u.state
        self.oca = self._oca()
        return Aggregated(aca, "oca", states={"averaged": aca, "aca": aca, "oca": self.oca})

    def state_tensors(self):
        out = {f"init.{k}": v for k, v in self.init_state.items()}
        out.update({f"oca.{k}": v for k, v in self.oca.items()})
        for c, st in self.cache.items():
            out.update({f"cache.{c}.{k}": v for k, v in st.items()})
        for c, g in self.generators.items():
            out.update({f"gen.{c}.{k}": v for k, v in cpu_state(g).items()})
        return out

    def state_json(self):
        return {"cache": sorted(self.cache), "generators": sorted(self.generators)}

    def load_state_tensors(self, tensors, extra):
        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}

        self.init_state, self.oca = part("init."), part("oca.")
        self.cache = {int(c): part(f"cache.{c}.") for c in extra.get("cache", [])}
        self.generators = {}
        for c in extra.get("generators", []):
            self._generator(int(c)).load_state_dict(part(f"gen.{c}."))


@dataclass(frozen=True)
class KfDistillation:
    """What a FedKF client distils from: the teacher (the server's OCA model), the client's
    own generator (persistent, trained in place) and the fusion settings (γ, T, the
    generator's lr and batch)."""

    teacher: nn.Module
    generator: nn.Module
    cfg: FusionConfig


def fedkf_local_train(model: nn.Module, kf: KfDistillation, x: torch.Tensor, y: torch.Tensor,
                      num_classes: int, local: LocalConfig, seed: int,
                      device: torch.device | str = "cpu") -> LocalResult:
    """FedKF's ClientUpdate (Alg. 1 lines 13-22): per local batch one generator step on
    L_G (Eq. 5) against the frozen teacher, then one model step on
    CE(real batch) + γ·KL(σ(teacher(x̂)) ‖ σ(model(x̂))) (Eq. 6-8). ``kf.generator`` is trained
    in place (persistent per client); ``model`` is not changed. Reported loss: the CE part."""
    cfg = kf.cfg
    net = copy.deepcopy(model).to(device).train()
    teacher = freeze(copy.deepcopy(kf.teacher).to(device))
    gen = kf.generator.to(device)
    g_opt = torch.optim.Adam(gen.parameters(), lr=cfg.gen_lr)
    opt = torch.optim.SGD(net.parameters(), lr=local.lr, momentum=local.momentum,
                          weight_decay=local.weight_decay)
    rng = torch.Generator().manual_seed(seed)
    zrng = torch.Generator().manual_seed(sub_seed(seed, "noise"))
    n = len(x)
    batch = min(local.batch_size, n)
    steps = local.steps or local.epochs * max(1, int(np.ceil(n / batch)))
    order, cursor = torch.randperm(n, generator=rng), 0
    losses: list[float] = []
    st = FusionState(student=net, generator=gen)
    for _ in range(steps):
        if cursor + batch > n:
            order, cursor = torch.randperm(n, generator=rng), 0
        idx = order[cursor:cursor + batch]
        cursor += batch
        if len(idx) == 1 and has_batchnorm(net):
            continue
        kf_generator_step(st, teacher, sample_noise(cfg.batch_size, gen.noise_dim, zrng,
                                                     device), cfg, g_opt)
        with torch.no_grad():
            xg = gen(sample_noise(cfg.batch_size, gen.noise_dim, zrng, device))
            t_logits = teacher(xg)
        xb, yb = x[idx].to(device), y[idx].to(device)
        ce = F.cross_entropy(net(xb), yb)
        loss = ce + cfg.gamma * kd_loss(t_logits, net(xg), cfg.temperature)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if local.clip > 0:
            nn.utils.clip_grad_norm_(net.parameters(), local.clip)
        opt.step()
        losses.append(float(ce.detach()))
    gen.eval()
    counts = torch.bincount(y.cpu().long(), minlength=num_classes).tolist()
    return LocalResult(model=net.eval(), train_loss=float(np.mean(losses)) if losses
                       else float("nan"), label_counts=counts, n_samples=n)
