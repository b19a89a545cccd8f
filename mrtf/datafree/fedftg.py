"""FedFTG server fusion (Zhang et al., CVPR 2022; fedftg-cvpr Sect. 3, Alg. 2).

A conditional generator G(z, y) (Eq. 2) and the global model (the *student*) are trained
adversarially against the local models (the *teachers*):

* customised label sampling, p(y) ∝ Σ_k n_k^y (Eq. 9), drawn as a stratified quota per batch
  as in the authors' code;
* class-level ensemble weights α_k^y = n_k^y / Σ_i n_i^y (Eq. 10);
* generator: min λ_cls·L_cls + λ_dis·L_dis − L_md (Eq. 8, the max over θ), with
  L_cls = Σ_k α_k^y CE(D(x̃; ω_k), y) (Eq. 5-6) and the diversity loss L_dis (Eq. 7);
* student: min L_md on the mined samples (Eq. 3, 8).

L_md defaults to KL(class-level ensemble ‖ student), Σ_k α_k^y σ(D(x̃; ω_k)) against
σ(D(x̃; ω)): what the authors' code optimises for the student. Eq. 4 taken literally (the
α-weighted sum of KL(σ(D(x̃; ω)) ‖ σ(D(x̃; ω_k))) over teachers) is ``discrepancy=
'kl_per_teacher'``; the code's L1 between logits is ``'l1'`` (see :func:`discrepancy_loss`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mrtf.datafree.common import FusionState, check_finite, freeze, stack_logits
from mrtf.datafree.config import FusionConfig
from mrtf.datafree.generators import ConditionalGenerator, sample_noise
from mrtf.errors import InputError


def _counts_tensor(counts: Sequence[Sequence[int]] | np.ndarray | torch.Tensor) -> torch.Tensor:
    c = torch.as_tensor(np.asarray(counts, dtype=np.float64))
    if c.dim() != 2 or (c < 0).any():
        raise InputError("label counts must be a (parties, classes) table of counts >= 0")
    if c.sum() <= 0:
        raise InputError("label counts are all zero: no class to sample")
    return c


def label_distribution(counts: Sequence[Sequence[int]] | np.ndarray | torch.Tensor
                       ) -> torch.Tensor:
    """p(y) ∝ Σ_k n_k^y (Eq. 9): (C,) float64 probabilities from a (K, C) count table."""
    total = _counts_tensor(counts).sum(0)
    return total / total.sum()


def stratified_labels(p: torch.Tensor, n: int, rng: torch.Generator) -> torch.Tensor:
    """n labels whose class counts follow ``p`` as closely as possible, shuffled.

    Each class gets ⌊n·p_y⌋; the remaining slots go to distinct classes drawn with probability
    ∝ the fractional parts (largest-remainder quota with a random tie-break). Classes with
    p_y = 0 never appear.
    """
    quota = torch.floor(p * n).long()
    left = n - int(quota.sum())
    if left > 0:
        frac = (p * n - quota.double()).clamp_min(0)
        if int((frac > 0).sum()) < left:  # float round-off: fall back to the support of p
            frac = (p > 0).double()
        extra = torch.multinomial(frac.float(), left, replacement=int((frac > 0).sum()) < left,
                                  generator=rng)
        quota.index_add_(0, extra, torch.ones_like(extra))
    labels = torch.repeat_interleave(torch.arange(len(p)), quota)
    return labels[torch.randperm(n, generator=rng)]


def class_ensemble_weights(counts: Sequence[Sequence[int]] | np.ndarray | torch.Tensor
                           ) -> torch.Tensor:
    """α_k^y = n_k^y / Σ_i n_i^y (Eq. 10) as a (K, C) float32 table; columns sum to 1.

    A class no party has seen gets uniform weights 1/K (it is never sampled by Eq. 9 anyway).
    """
    c = _counts_tensor(counts)
    col = c.sum(0, keepdim=True)
    alpha = torch.where(col > 0, c / col.clamp_min(1), torch.full_like(c, 1.0 / c.shape[0]))
    return alpha.float()


def ensemble_logits(t_logits: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor
                    ) -> torch.Tensor:
    """Σ_k α_k^{y_b} D(x_b; ω_k): (B, C) from teachers' (K, B, C) logits and labels (B,)."""
    w = alpha[:, y]  # (K, B)
    return (w.unsqueeze(-1) * t_logits).sum(0)


def cls_loss(t_logits: torch.Tensor, y: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """L_cls = mean_b Σ_k α_k^y CE(D(x̃_b; ω_k), y_b) (Eq. 5-6)."""
    k, b, c = t_logits.shape
    ce = F.cross_entropy(t_logits.reshape(k * b, c), y.repeat(k), reduction="none")
    return (alpha[:, y] * ce.view(k, b)).sum(0).mean()


def discrepancy_loss(s_logits: torch.Tensor, t_logits: torch.Tensor, y: torch.Tensor,
                     alpha: torch.Tensor, kind: str = "kl") -> torch.Tensor:
    """Model discrepancy L_md between student and teachers on generated samples (batch mean).

    ``kl`` (default): KL(Σ_k α_k^y σ(teacher_k) ‖ σ(student)), the class-level ensemble's
    prediction against the student's; the student's loss in the authors' code (their soft
    cross-entropy to the α-weighted softmax differs by a constant).
    ``kl_per_teacher``: Σ_k α_k^y KL(σ(student) ‖ σ(teacher_k)), Eq. 3-4 literally. Measured
    on digits it stalls (a student cannot be close to every disagreeing teacher at once).
    ``l1``: mean |student − Σ_k α_k^y teacher_k| over logits (the authors' generator term).
    """
    w = alpha[:, y]  # (K, B)
    if kind == "kl_per_teacher":
        log_s = F.log_softmax(s_logits, dim=1)
        kl = (log_s.exp() * (log_s.unsqueeze(0) - F.log_softmax(t_logits, dim=2))).sum(2)
        return (w * kl).sum(0).mean()
    if kind == "kl":
        p_ens = (w.unsqueeze(-1) * F.softmax(t_logits, dim=2)).sum(0)
        log_s = F.log_softmax(s_logits, dim=1)
        return (p_ens * (p_ens.clamp_min(1e-12).log() - log_s)).sum(1).mean()
    if kind == "l1":
        return (s_logits - ensemble_logits(t_logits, y, alpha)).abs().mean()
    raise InputError(f"unknown discrepancy {kind!r}")


def diversity_loss(z: torch.Tensor, x: torch.Tensor, form: str = "mean") -> torch.Tensor:
    """L_dis (Eq. 7), from DFAD/FedGen as in the authors' code.

    ``mean`` (default): exp(mean over all Q² pairs of −mean((z_i−z_j)²) · mean|x_i−x_j|).
    ``norm``: the paper's literal exp(1/Q² Σ −‖x_i−x_j‖₂·‖z_i−z_j‖₂); with 100-d noise and
    image-sized x the exponent is ≈ −100s, so it underflows to 0 and gives no gradient.
    """
    xf, zf = x.flatten(1), z.flatten(1)
    if form == "mean":
        dx = (xf.unsqueeze(0) - xf.unsqueeze(1)).abs().mean(2)
        dz = (zf.unsqueeze(0) - zf.unsqueeze(1)).pow(2).mean(2)
    elif form == "norm":
        dx, dz = torch.cdist(xf, xf), torch.cdist(zf, zf)
    else:
        raise InputError(f"unknown diversity form {form!r}")
    return torch.exp(-(dx * dz).mean())



def generator_step(st: FusionState, teachers: Sequence[nn.Module], z: torch.Tensor,
                    y: torch.Tensor, alpha: torch.Tensor, cfg: FusionConfig,
                    opt: torch.optim.Optimizer) -> dict[str, float]:
    """One step on min λ_cls·L_cls + λ_dis·L_dis − L_md (Eq. 8, generator side)."""
    st.generator.train()
    x = st.generator(z, y)
    t_logits = stack_logits(teachers, x)
    l_cls = cls_loss(t_logits, y, alpha)
    l_dis = diversity_loss(z, x, cfg.diversity)
    l_md = discrepancy_loss(st.student(x), t_logits, y, alpha, cfg.discrepancy)
    loss = cfg.lambda_cls * l_cls + cfg.lambda_dis * l_dis - l_md
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return {"gen_loss": loss.item(), "cls": l_cls.item(), "dis": l_dis.item(),
            "md_gen": l_md.item()}


def student_steps(st: FusionState, teachers: Sequence[nn.Module], z: torch.Tensor,
                   y: torch.Tensor, alpha: torch.Tensor, cfg: FusionConfig,
                   opt: torch.optim.Optimizer) -> float:
    """I_d steps on min L_md (Eq. 3, 8) over one mined batch; teachers' outputs computed once."""
    with torch.no_grad():
        st.generator.train()  # the batch statistics the generator was trained with
        x = st.generator(z, y)
        t_logits = stack_logits(teachers, x)
    st.last_batch = x
    loss = torch.zeros(())
    for _ in range(cfg.student_steps):
        loss = discrepancy_loss(st.student(x), t_logits, y, alpha, cfg.discrepancy)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item()


@dataclass(frozen=True)
class FtgTeachers:
    """The frozen teachers of one FedFTG update and what their label counts say: p(y)
    (Eq. 9, (C,)) and the class-level ensemble weights α (Eq. 10, (K, C), on the device)."""

    models: Sequence[nn.Module]
    p_y: torch.Tensor
    alpha: torch.Tensor

    @classmethod
    def of(cls, models: Sequence[nn.Module], counts: Sequence[Sequence[int]],
           device: torch.device) -> FtgTeachers:
        return cls(models, label_distribution(counts), class_ensemble_weights(counts).to(device))


def fedftg_round(st: FusionState, teachers: FtgTeachers, cfg: FusionConfig, rnd: int,
                 rng: torch.Generator, device: torch.device,
                 on_step: Callable[[dict], None] | None = None) -> None:
    """One server update of Alg. 2 (lines 3-10): I iterations of I_g generator steps and I_d
    student steps on the same z and y; both optimisers are made anew with lr × 0.998^rnd.
    Appends one record per iteration to ``st.history``; a non-finite loss raises FusionError.
    """
    models, alpha = teachers.models, teachers.alpha
    decay = cfg.lr_decay ** rnd
    g_opt = torch.optim.Adam(st.generator.parameters(), lr=cfg.gen_lr * decay)
    s_opt = torch.optim.SGD(st.student.parameters(), lr=cfg.student_lr * decay,
                            momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    for it in range(cfg.iterations):
        z = sample_noise(cfg.batch_size, st.generator.noise_dim, rng, device)
        y = stratified_labels(teachers.p_y, cfg.batch_size, rng).to(device)
        rec: dict[str, float] = {"round": rnd, "iteration": it}
        for _ in range(cfg.gen_steps):
            rec.update(generator_step(st, models, z, y, alpha, cfg, g_opt))
        rec["md_student"] = student_steps(st, models, z, y, alpha, cfg, s_opt)
        check_finite({k: v for k, v in rec.items() if k not in ("round", "iteration")},
                     f"FedFTG round {rnd} iteration {it}")
        st.history.append(rec)
        if on_step:
            on_step(rec)


def run_fedftg(teachers: Sequence[nn.Module], counts: Sequence[Sequence[int]],
               student: nn.Module, image_shape: tuple[int, int, int], cfg: FusionConfig,
               device: torch.device, on_step: Callable[[dict[str, float]], None] | None = None
               ) -> FusionState:
    """Alg. 2 (ServerUpdate) for ``cfg.rounds`` rounds, from the given student.

    Teachers are frozen (eval, no parameter gradients). The student stays in eval mode, so
    BatchNorm statistics are not pulled toward synthetic data (the authors' code trains it in
    train mode). Generator Adam and student SGD are re-created each round with lr ×0.998^round.
    """
    teachers = [freeze(t.to(device)) for t in teachers]
    rng = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    num_classes = len(counts[0])
    gen = ConditionalGenerator(num_classes, image_shape, cfg.noise_dim, cfg.activation)
    st = FusionState(student=student.to(device).eval(), generator=gen.to(device))
    ftg = FtgTeachers.of(teachers, counts, device)
    for rnd in range(cfg.rounds):
        fedftg_round(st, ftg, cfg, rnd, rng, device, on_step)
    st.student.eval()
    st.generator.eval()
    return st
