"""FedDF / ST / ST+RD / MrTF / adaptive in the loop (MrTF Sect. 4.4): θ_{t+1}, then
``mrtf.refinery.refine`` on the target set with the round's local models, θ_t and θ_{t+1}."""

from __future__ import annotations

from mrtf.federated.received import received_set
from mrtf.federated.strategies.base import (
    Aggregated,
    ServerContext,
    Strategy,
    average_updates,
    cpu_state,
    sub_seed,
)
from mrtf.refinery.adaptive import input_independent

REFINERY_METHODS = ("feddf", "st", "st+rd", "mrtf", "adaptive")
#: clients train on the plain average, the server refines (and scores) every round: sending
#: adaptive's refined model stalled training (bench/studies/send_refined.py); the paper sends it.
TRAIN_ON_AVERAGE = ("adaptive",)


class RefineryStrategy(Strategy):
    """Refine θ_{t+1} on the target set with S_t's local models, θ_t and θ_{t+1} (CLR skipped
    while the round is below ``clr_min_round``). The refined model is sent to the next round's
    clients unless ``keep_training_on_average`` (then it is refined only when evaluated)."""

    def __init__(self, ctx: ServerContext, name: str = "mrtf") -> None:
        if name not in REFINERY_METHODS:
            raise ValueError(f"not a refinery method: {name!r}")
        super().__init__(ctx, name)

    def aggregate(self, rnd, start_state, updates, evaluate):
        from mrtf.refinery import RefineConfig, refine

        c, s = self.ctx, self.ctx.settings
        avg = average_updates(updates)
        on_average = s.keep_training_on_average or self.name in TRAIN_ON_AVERAGE
        if on_average and not evaluate:
            return Aggregated(avg, "refined", states={"averaged": avg})
        cfg = RefineConfig(method=self.name, variant=s.variant, steps=s.refine_steps,
                           lr=s.refine_lr, clr_min_round=s.clr_min_round,
                           seed=sub_seed(c.seed, rnd, "refine"),
                           device=str(c.device), progress=False)
        received = received_set(rnd, start_state, updates, arch=c.arch,
                                num_classes=c.num_classes, arch_kwargs=c.arch_kwargs)
        res = refine(received, c.target, cfg)
        refined = cpu_state(res.model)
        nxt = avg if on_average else refined
        warnings = []
        own = res.probs if res.model_probs is None else res.model_probs  # not its vote
        if nxt is refined and input_independent(own):
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
