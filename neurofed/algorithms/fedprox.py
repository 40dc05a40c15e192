"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020,
https://arxiv.org/abs/1812.06127).

A FedAvg whose clients add a proximal term to their local objective, keeping the
local model near the global one it started from.
"""

from __future__ import annotations

from neurofed.algorithms.base import Client
from neurofed.algorithms.fedavg import FedAvg
from neurofed.config import number


class FedProxClient(Client):
    r"""Local objective (FedProx's proximal objective h_k)

    .. math:: h(w; w^t) = F(w) + \frac{\mu}{2} \lVert w - w^t \rVert^2

    with F the FedAvg cross-entropy of the spike-rate logits (the parent's ``loss``)
    and w^t the parameters received this round; μ is ``algorithm.mu``. μ = 0 is FedAvg.
    """

    def begin(self, ctx, model) -> None:
        super().begin(ctx, model)
        mu = float(self.cfg["algorithm"]["mu"])
        ctx.derived.anchor = self.param_tensors(ctx, model, ctx.global_flat) if mu else []

    def loss(self, ctx, model, output, y, x):
        loss = super().loss(ctx, model, output, y, x)
        mu = float(self.cfg["algorithm"]["mu"])
        if not mu:
            return loss
        prox = sum(((p - w0) ** 2).sum() for p, w0 in ctx.derived.anchor)
        return loss + 0.5 * mu * prox


class FedProx(FedAvg):
    """Server: FedAvg's (random selection, sample-weighted average).
    Client: :class:`FedProxClient` (reads ``algorithm.mu``).

    Default μ = 0.01, the FedLEC experiments' value (the authors' ``main.py``, ``-mu``
    default 0.01); FedProx's own
    experiments pick μ from {0.001, 0.01, 0.1, 1}.
    """

    name = "fedprox"
    Client = FedProxClient
    config_defaults = {"mu": 0.01}
    config_checks = {"mu": number(0)}
