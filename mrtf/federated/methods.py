"""Server strategies of a federated evaluation run (Flower-style: narrow hooks, engine elsewhere).

A strategy sees one round at a time through three hooks:

* ``client_update(rnd, k, model, x, y, local, seed)``: the client's training, or ``None`` for
  the engine's default (FedAvg / FedProx / SCAFFOLD local SGD). Only FedKF overrides it.
* ``aggregate(rnd, start_state, updates, evaluate) -> Aggregated``: the server step; returns the
  state the next round's clients receive and what to score on the target set.
* ``state_tensors()`` / ``load_state_tensors(tensors, extra)``: persistent server state for
  checkpoints (tensors only; small JSON extras).

The engine (runner.py) owns client selection, local training, DP noise, evaluation and
checkpoints; a real deployment could drive the same strategies from another engine.

Methods (MrTF paper Sect. 4.4 and 5; FedFTG Alg. 2; FedKF Alg. 1):

* fedavg: the sample-weighted parameter average θ_{t+1}.
* feddf, st, st+rd, mrtf: θ_{t+1}, then ``mrtf.refinery.refine`` on the target set with the
  round's local models, θ_t and θ_{t+1}; the refined model goes to the next round
  (``keep_training_on_average``: the authors' code, which only evaluates it).
* fedftg: θ_{t+1}, then one FedFTG ServerUpdate (I outer iterations), persistent generator.
* fedkf: the ACA w^t goes to the clients; the OCA ŵ^t (cache of every client's latest model)
  teaches the client-side generator + KD (Alg. 1 lines 13-22).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.datafree.common import FusionState, freeze
from mrtf.datafree.config import FusionConfig
from mrtf.datafree.fedftg import (
    class_ensemble_weights,
    fedftg_round,
    label_distribution,
)
from mrtf.datafree.fedkf import generator_step as kf_generator_step
from mrtf.datafree.fedkf import kd_loss
from mrtf.datafree.generators import ConditionalGenerator, UnconditionalGenerator, sample_noise
from mrtf.federated.aggregate import average_states
from mrtf.federated.local import LocalConfig, LocalResult, has_batchnorm
from mrtf.io.bundles import BundleMeta, ReceivedModel, ReceivedSet
from mrtf.models import build_model
from mrtf.refinery.adaptive import input_independent

METHODS = ("fedavg", "feddf", "st", "st+rd", "mrtf", "adaptive", "fedftg", "fedkf")
REFINERY_METHODS = ("feddf", "st", "st+rd", "mrtf", "adaptive")
#: clients train on the plain average, the server refines (and scores) every round: sending
#: adaptive's refined model stalled training (bench/send_refined.py); the paper sends it.
TRAIN_ON_AVERAGE = ("adaptive",)
#: columns every metrics row carries (None where a method has no such model)
SCORES = ("averaged", "ensemble", "refined", "aca", "oca")


def sub_seed(*parts: int | str) -> int:
    """A deterministic 31-bit seed from integers/strings (same on every machine)."""
    ints = [p if isinstance(p, int) else int.from_bytes(p.encode(), "little") % (2 ** 31)
            for p in parts]
    return int(np.random.SeedSequence(ints).generate_state(1)[0] % (2 ** 31))


@dataclass
class MethodSettings:
    """Server-side knobs shared by the strategies (defaults: the papers)."""

    refine_steps: int = 500
    refine_lr: float | None = None
    variant: str = "paper"
    clr_min_round: int = 5
    keep_training_on_average: bool = False
    fusion_iterations: int = 10  # FedFTG I per communication round
    fusion_student_steps: int = 5  # FedFTG I_d
    fusion_batch: int | None = None  # FedFTG 50, FedKF 64
    fedkf_kd_from_round: int = 0  # Alg. 1: KD from the first round; the authors' code: 1
    fedkf_oca: str = "paper"  # 'paper': all K cache slots start at w^0; 'reference': trained only


@dataclass
class ServerContext:
    """What every strategy may use. ``target`` holds no labels (never read for training)."""

    arch: str
    num_classes: int
    arch_kwargs: dict
    image_shape: tuple[int, int, int]
    target: Any  # ArraySource without y
    client_sizes: list[int]
    seed: int
    device: torch.device
    settings: MethodSettings

    def build(self, state: dict[str, torch.Tensor]) -> nn.Module:
        model = build_model(self.arch, self.num_classes, **self.arch_kwargs)
        model.load_state_dict(state)
        return model.to(self.device).eval()


@dataclass
class ClientUpdate:
    """What the server sees from one client (after DP noise, when configured)."""

    client: int
    state: dict[str, torch.Tensor]
    n_samples: int
    label_counts: list[int]
    train_loss: float


@dataclass
class Aggregated:
    """state: what the next round's clients receive. states / probs: models (state dicts) and
    target-set predictions (M, C) to score, by column name (SCORES); a column with both is
    scored on the target from its predictions, and its model is used for the clients' local
    test parts. primary: the column that is the method's own output ("accuracy"). warnings:
    one line each, for the user (the engine shows the first one of each run track)."""

    state: dict[str, torch.Tensor]
    primary: str
    states: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    probs: dict[str, np.ndarray] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _cpu_state(model_or_state) -> dict[str, torch.Tensor]:
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) \
        else model_or_state
    return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}


def _average(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
    return average_states([u.state for u in updates], [u.n_samples for u in updates])


class Strategy:
    """FedAvg: the sample-weighted average is the next global model."""

    name = "fedavg"

    def __init__(self, ctx: ServerContext) -> None:
        self.ctx = ctx

    def initialize(self, init_state: dict[str, torch.Tensor]) -> None:
        """Called once with θ_0 before the first round (not on resume)."""

    def client_update(self, rnd: int, k: int, model: nn.Module, x: torch.Tensor,
                      y: torch.Tensor, local: LocalConfig, seed: int) -> LocalResult | None:
        return None

    def aggregate(self, rnd: int, start_state: dict[str, torch.Tensor],
                  updates: list[ClientUpdate], evaluate: bool) -> Aggregated:
        avg = _average(updates)
        return Aggregated(avg, "averaged", states={"averaged": avg})

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def state_json(self) -> dict:
        return {}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], extra: dict) -> None:
        pass


class RefineryStrategy(Strategy):
    """FedDF / ST / ST+RD / MrTF in the loop (MrTF Sect. 4.4): refine θ_{t+1} on the target set
    with S_t's local models, θ_t and θ_{t+1} (``mrtf.refinery.refine``; CLR skipped while the
    round is below ``clr_min_round``). The refined model is sent to the next round's clients
    unless ``keep_training_on_average`` (then it is refined only when evaluated)."""

    def __init__(self, ctx: ServerContext, method: str) -> None:
        super().__init__(ctx)
        self.name = method

    def _received(self, rnd: int, start_state, updates: list[ClientUpdate]) -> ReceivedSet:
        c = self.ctx
        base = dict(arch=c.arch, num_classes=c.num_classes, arch_kwargs=c.arch_kwargs,
                    round=rnd)
        models = [ReceivedModel(Path(f"client-{u.client:03d}"), BundleMeta(
            **base, party=f"client-{u.client:03d}", label_counts=list(u.label_counts),
            n_samples=u.n_samples, train_loss=u.train_loss if np.isfinite(u.train_loss)
            else None, role="local"), u.state) for u in updates]
        models.append(ReceivedModel(Path("global-start"), BundleMeta(
            **base, party="server", role="global"), start_state))
        return ReceivedSet(models, [])

    def aggregate(self, rnd, start_state, updates, evaluate):
        from mrtf.refinery import RefineConfig, refine

        s = self.ctx.settings
        avg = _average(updates)
        on_average = s.keep_training_on_average or self.name in TRAIN_ON_AVERAGE
        if on_average and not evaluate:
            return Aggregated(avg, "refined", states={"averaged": avg})
        cfg = RefineConfig(method=self.name, variant=s.variant, steps=s.refine_steps,
                           lr=s.refine_lr, clr_min_round=s.clr_min_round,
                           seed=sub_seed(self.ctx.seed, rnd, "refine"),
                           device=str(self.ctx.device), progress=False)
        res = refine(self._received(rnd, start_state, updates), self.ctx.target, cfg)
        refined = _cpu_state(res.model)
        nxt = avg if on_average else refined
        warnings = []
        if nxt is refined and input_independent(res.probs):
            # measured on mnist5k (Dirichlet 0.1): when the teachers' predictions carry no class
            # information, distillation kills every ReLU of a layer; the clients' gradients
            # through it are then zero, so local training can never revive the model
            warnings.append(f"{self.name}: the refined model sent to the clients in round "
                            f"{rnd + 1} gives the same output for every target sample (dead "
                            "network); later rounds cannot recover: consider "
                            "--keep-training-on-average")
        return Aggregated(nxt, "refined", states={"averaged": avg, "refined": refined},
                          probs={"averaged": res.averaged_probs, "ensemble": res.target_probs,
                                 "refined": res.probs}, warnings=warnings)


class FedFTGStrategy(Strategy):
    """FedFTG (fedftg-cvpr Alg. 2): after each aggregation, one ServerUpdate fine-tunes θ_{t+1}
    with a conditional generator trained against the round's local models (label counts give
    customised label sampling and the class-level ensemble). The generator persists across
    rounds; its Adam and the student's SGD are re-created each round with lr ×0.998^round."""

    name = "fedftg"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        s = ctx.settings
        self.cfg = FusionConfig(method="fedftg", iterations=s.fusion_iterations,
                                student_steps=s.fusion_student_steps,
                                batch_size=s.fusion_batch).validate().resolved("fedftg")
        torch.manual_seed(sub_seed(ctx.seed, "fedftg-generator"))
        self.generator = ConditionalGenerator(ctx.num_classes, ctx.image_shape,
                                              self.cfg.noise_dim, self.cfg.activation)

    def aggregate(self, rnd, start_state, updates, evaluate):
        dev, cfg = self.ctx.device, self.cfg
        avg = _average(updates)
        teachers = [freeze(self.ctx.build(u.state)) for u in updates]
        counts = [list(u.label_counts) for u in updates]
        student = self.ctx.build(avg)
        seed = sub_seed(self.ctx.seed, rnd, "fedftg")
        rng = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        st = FusionState(student=student.eval(), generator=self.generator.to(dev))
        p_y = label_distribution(counts)
        alpha = class_ensemble_weights(counts).to(dev)
        fedftg_round(st, teachers, p_y, alpha, cfg, rnd, rng, dev)
        self.generator = st.generator.cpu()
        fused = _cpu_state(st.student)
        return Aggregated(fused, "refined", states={"averaged": avg, "refined": fused})

    def state_tensors(self):
        return {f"generator.{k}": v for k, v in _cpu_state(self.generator).items()}

    def load_state_tensors(self, tensors, extra):
        self.generator.load_state_dict({k[len("generator."):]: v for k, v in tensors.items()
                                        if k.startswith("generator.")})


class FedKFStrategy(Strategy):
    """FedKF (fedkf Alg. 1), client side: each active client trains its persistent generator
    against the OCA teacher ŵ^{t-1} (L_IE + λ1·L_OH + λ2·L_A) and its model on
    CE(real batch) + γ·KL(teacher ‖ model) on generated samples, one step each per batch
    (lines 17-19). The server sends the ACA model w^t (line 9) and keeps the cache of every
    client's latest model for OCA ŵ^t (lines 7, 10). Both ACA and OCA are scored; the
    method's accuracy is OCA's. The generators' Adam is re-created each round."""

    name = "fedkf"

    def __init__(self, ctx: ServerContext) -> None:
        super().__init__(ctx)
        s = ctx.settings
        self.cfg = FusionConfig(method="fedkf", batch_size=s.fusion_batch
                                ).validate().resolved("fedkf")
        self.init_state: dict[str, torch.Tensor] = {}
        self.cache: dict[int, dict[str, torch.Tensor]] = {}
        self.generators: dict[int, UnconditionalGenerator] = {}
        self.oca: dict[str, torch.Tensor] = {}

    def initialize(self, init_state):
        self.init_state = _cpu_state(init_state)
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
        res = fedkf_local_train(model, teacher, self._generator(k), x, y, self.ctx.num_classes,
                                local, self.cfg, seed, self.ctx.device)
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
        aca = _average(updates)
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
            out.update({f"gen.{c}.{k}": v for k, v in _cpu_state(g).items()})
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


STRATEGIES = {"fedavg": Strategy, "fedftg": FedFTGStrategy, "fedkf": FedKFStrategy}


def make_strategy(method: str, ctx: ServerContext) -> Strategy:
    if method in REFINERY_METHODS:
        return RefineryStrategy(ctx, method)
    return STRATEGIES[method](ctx)


def fedkf_local_train(model: nn.Module, teacher: nn.Module, generator: nn.Module,
                      x: torch.Tensor, y: torch.Tensor, num_classes: int, local: LocalConfig,
                      cfg: FusionConfig, seed: int, device: torch.device | str = "cpu"
                      ) -> LocalResult:
    """FedKF's ClientUpdate (Alg. 1 lines 13-22): per local batch one generator step on
    L_G (Eq. 5) against the frozen teacher, then one model step on
    CE(real batch) + γ·KL(σ(teacher(x̂)) ‖ σ(model(x̂))) (Eq. 6-8). ``generator`` is trained in
    place (persistent per client); ``model`` is not changed. Reported loss: the CE part."""
    net = copy.deepcopy(model).to(device).train()
    teacher = freeze(copy.deepcopy(teacher).to(device))
    gen = generator.to(device)
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
