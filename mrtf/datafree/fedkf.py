"""FedKF, server side (Zhou et al.; fedkf Sect. IV), for a party that holds no data.

* T1, active-inactive aggregation (Sect. IV-A, Alg. 1 line 10): the OCA model is the
  data-size-weighted average of the latest model of every party ever received.
* T2, global-local knowledge fusion without the local data: an unconditional generator is
  trained against the OCA teacher with L_G = L_IE + λ1·L_OH + λ2·L_A (Eq. 2-5), and the student
  (by default the ACA model, the average of the latest round; Alg. 1 line 9) is trained with
  γ·KL(teacher ‖ student) (Eq. 6, T = 1) on generated samples — Eq. 8 without its L_CE term,
  since there is no local data. Alg. 1, lines 18-19: one generator step, then one student step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from mrtf.averaging import average_received
from mrtf.datafree.common import CollapseWatch, FusionState, check_finite, freeze
from mrtf.datafree.config import FusionConfig
from mrtf.datafree.generators import UnconditionalGenerator, default_noise_dim, sample_noise
from mrtf.errors import InputError
from mrtf.trust.selection import latest_per_party


def oca_average(models: Sequence) -> tuple[nn.Module, list[float]]:
    """The OCA model ŵ = Σ_k |D_k| ŵ_k / Σ_k |D_k| over the latest model of every party
    (Alg. 1 line 10). Weights are ``n_samples`` (uniform if any party lacks it).
    Returns ``(model in eval mode, normalised weights in latest_per_party order)``."""
    if not models:
        raise InputError("no local models to aggregate")
    return average_received(latest_per_party(models), by_samples=True)


def aca_average(models: Sequence) -> tuple[nn.Module, list[float]]:
    """The ACA model w^t (Alg. 1 line 9): data-size-weighted average of the models of the
    latest round present (all models when none carries a round)."""
    if not models:
        raise InputError("no local models to aggregate")
    rounds = [m.meta.round for m in models if m.meta.round is not None]
    latest = [m for m in models if not rounds or m.meta.round == max(rounds)]
    return average_received(latest_per_party(latest), by_samples=True)


def information_entropy_loss(probs: torch.Tensor) -> torch.Tensor:
    """L_IE (Eq. 3) normalised as in the authors' code: 1 + Σ_c p̄_c log p̄_c / log C, with p̄
    the batch mean of the teacher's softmax; 0 when p̄ is uniform, 1 when one class only."""
    p_bar = probs.mean(0)
    return 1 + (p_bar * p_bar.clamp_min(1e-12).log()).sum() / math.log(probs.shape[1])


def one_hot_loss(logits: torch.Tensor) -> torch.Tensor:
    """L_OH = CE(teacher logits, argmax) (Eq. 2)."""
    return F.cross_entropy(logits, logits.argmax(1))


def activation_loss(features: torch.Tensor) -> torch.Tensor:
    """L_A = −mean|f(ŵ; x̂)| (Eq. 4; mean over elements as in the code, not the summed ℓ1)."""
    return -features.abs().mean()


def kd_loss(t_logits: torch.Tensor, s_logits: torch.Tensor, temperature: float = 1.0
            ) -> torch.Tensor:
    """KL(σ(teacher/T) ‖ σ(student/T)), batch mean (Eq. 6)."""
    log_t = F.log_softmax(t_logits / temperature, dim=1)
    log_s = F.log_softmax(s_logits / temperature, dim=1)
    return (log_t.exp() * (log_t - log_s)).sum(1).mean()


def _features_logits(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if hasattr(model, "forward_features"):
        return model.forward_features(x)
    raise InputError("FedKF's activation loss needs a model with forward_features(x)")



def generator_step(st: FusionState, teacher: nn.Module, z: torch.Tensor, cfg: FusionConfig,
                    opt: torch.optim.Optimizer) -> dict[str, float]:
    """One step on L_G = L_IE + λ1·L_OH + λ2·L_A (Eq. 5)."""
    st.generator.train()
    feats, logits = _features_logits(teacher, st.generator(z))
    l_ie = information_entropy_loss(F.softmax(logits, dim=1))
    l_oh, l_a = one_hot_loss(logits), activation_loss(feats)
    loss = l_ie + cfg.lambda_oh * l_oh + cfg.lambda_a * l_a
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return {"gen_loss": loss.item(), "ie": l_ie.item(), "oh": l_oh.item(), "act": l_a.item()}


def student_step(st: FusionState, teacher: nn.Module, z: torch.Tensor, cfg: FusionConfig,
                  opt: torch.optim.Optimizer) -> float:
    """One step on γ·L_KL (Eq. 6, 8) over freshly generated samples."""
    with torch.no_grad():
        x = st.generator(z)
        t_logits = teacher(x)
    st.last_batch = x
    loss = cfg.gamma * kd_loss(t_logits, st.student(x), cfg.temperature)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.item()


def run_fedkf(teacher: nn.Module, student: nn.Module, image_shape: tuple[int, int, int],
              num_classes: int, cfg: FusionConfig, device: torch.device,
              on_step: Callable[[dict[str, float]], None] | None = None) -> FusionState:
    """``cfg.steps`` alternating generator / student steps (Alg. 1, lines 18-19).

    The teacher is frozen; the student stays in eval mode (no BatchNorm drift toward synthetic
    data). Generator: Adam(cfg.gen_lr); student: SGD(cfg.student_lr, momentum, weight decay).
    """
    teacher = freeze(teacher.to(device))
    rng = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    gen = UnconditionalGenerator(image_shape, cfg.noise_dim or default_noise_dim(num_classes),
                                 cfg.activation, num_classes).to(device)
    st = FusionState(student=student.to(device).eval(), generator=gen)
    g_opt = torch.optim.Adam(gen.parameters(), lr=cfg.gen_lr)
    s_opt = torch.optim.SGD(st.student.parameters(), lr=cfg.student_lr,
                            momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    watch = CollapseWatch(cfg.steps, cfg.collapse_tol, "fedkf")
    for step in range(cfg.steps):
        rec: dict[str, float] = {"step": step}
        rec.update(generator_step(st, teacher, sample_noise(cfg.batch_size, gen.noise_dim,
                                                             rng, device), cfg, g_opt))
        rec["kl_student"] = student_step(
            st, teacher, sample_noise(cfg.batch_size, gen.noise_dim, rng, device), cfg, s_opt)
        check_finite({k: v for k, v in rec.items() if k != "step"}, f"FedKF step {step}")
        st.history.append(rec)
        if on_step:
            on_step(rec)
        watch.check(step, st.last_batch)
    st.student.eval()
    st.generator.eval()
    return st
