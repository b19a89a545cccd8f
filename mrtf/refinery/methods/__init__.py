"""The built-in refinery methods, one module each, registered here in the order the CLI lists
them (registry.py): the adaptive default, the paper's ablation (Fig. 11), then the source-free
adaptations of θ_{t+1} (SHOT, AaD, NRC). A new method is a module with a
:class:`~mrtf.refinery.registry.Method` subclass and one line below (or a ``register_method``
call of its own)."""

from mrtf.refinery.methods.aad import Aad
from mrtf.refinery.methods.adaptive import Adaptive
from mrtf.refinery.methods.decision import Decision
from mrtf.refinery.methods.fedavg import FedAvg
from mrtf.refinery.methods.feddf import FedDF
from mrtf.refinery.methods.mrtf import MrTF
from mrtf.refinery.methods.nrc import Nrc
from mrtf.refinery.methods.shot import Shot
from mrtf.refinery.methods.st import ST
from mrtf.refinery.methods.st_rd import STRD
from mrtf.refinery.registry import METHODS, Method, get_method, register_method

BUILT_IN = (Adaptive(), FedAvg(), FedDF(), ST(), STRD(), MrTF(), Shot(), Aad(), Nrc())
for _method in BUILT_IN:
    register_method(_method)
register_method(Decision())  # multi-source adaptation (DECISION), after the paper's methods

__all__ = ["BUILT_IN", "METHODS", "Method", "get_method", "register_method"]
