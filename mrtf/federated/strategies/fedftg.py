"""FedFTG (fedftg-cvpr Alg. 2) as a server strategy."""

from __future__ import annotations

import torch

from mrtf.datafree.common import FusionState, freeze
from mrtf.datafree.config import FusionConfig
from mrtf.datafree.fedftg import FtgTeachers, fedftg_round
from mrtf.datafree.generators import ConditionalGenerator
from mrtf.federated.strategies.base import (
    Aggregated,
    ServerContext,
    Strategy,
    average_updates,
    cpu_state,
    sub_seed,
)


class FedFTGStrategy(Strategy):
    """After each aggregation, one ServerUpdate fine-tunes θ_{t+1} with a conditional generator
    trained against the round's local models (label counts give customised label sampling and
    the class-level ensemble). The generator persists across rounds; its Adam and the
    student's SGD are re-created each round with lr ×0.998^round."""

    name = "fedftg"

    def __init__(self, ctx: ServerContext, name: str | None = None) -> None:
        super().__init__(ctx, name)
        s = ctx.settings
        self.cfg = FusionConfig(method="fedftg", iterations=s.fusion_iterations,
                                student_steps=s.fusion_student_steps,
                                batch_size=s.fusion_batch).validate().resolved("fedftg")
        torch.manual_seed(sub_seed(ctx.seed, "fedftg-generator"))
        self.generator = ConditionalGenerator(ctx.num_classes, ctx.image_shape,
                                              self.cfg.noise_dim, self.cfg.activation)

    def aggregate(self, rnd, start_state, updates, evaluate):
        dev, cfg = self.ctx.device, self.cfg
        avg = average_updates(updates)
        teachers = [freeze(self.ctx.build(u.state)) for u in updates]
        counts = [list(u.label_counts) for u in updates]
        student = self.ctx.build(avg)
        seed = sub_seed(self.ctx.seed, rnd, "fedftg")
        rng = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        st = FusionState(student=student.eval(), generator=self.generator.to(dev))
        fedftg_round(st, FtgTeachers.of(teachers, counts, dev), cfg, rnd, rng, dev)
        self.generator = st.generator.cpu()
        fused = cpu_state(st.student)
        return Aggregated(fused, "refined", states={"averaged": avg, "refined": fused})

    def state_tensors(self):
        return {f"generator.{k}": v for k, v in cpu_state(self.generator).items()}

    def load_state_tensors(self, tensors, extra):
        self.generator.load_state_dict({k[len("generator."):]: v for k, v in tensors.items()
                                        if k.startswith("generator.")})
