"""FedRS (Li & Zhan, "FedRS: Federated Learning with Restricted Softmax for Label
Distribution Non-IID Data", KDD 2021, https://doi.org/10.1145/3447548.3467254).

A client cannot learn the classes it never sees, yet plain softmax keeps pushing
their outputs down. FedRS scales the logits of locally missing classes by α < 1, so
their "proxies" receive smaller updates.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from neurofed.algorithms.base import Client
from neurofed.algorithms.fedavg import FedAvg
from neurofed.config import number


def restricted_logits(logits: torch.Tensor, counts, alpha: float) -> torch.Tensor:
    """FedRS's restricted softmax input: o_c = α_c·f_c(x), α_c = 1 for labels the client
    holds and α for the ones it misses."""
    n = torch.as_tensor(np.asarray(counts), device=logits.device)
    scale = torch.where(n > 0, torch.ones((), dtype=logits.dtype, device=logits.device),
                        torch.full((), alpha, dtype=logits.dtype, device=logits.device))
    return logits * scale


class FedRSClient(Client):
    """Local loss: cross-entropy of :func:`restricted_logits`.

    FedRS scales the classifier's w_cᵀh; our last layer is a spiking dense layer whose
    logit is its spike rate × ``federation.logit_scale``, so we scale that logit.
    """

    def loss(self, ctx, model, output, y, x):
        alpha = float(self.cfg["algorithm"]["alpha"])
        return F.cross_entropy(restricted_logits(model.readout(output), np.asarray(ctx.data.label_counts), alpha), y)


class FedRS(FedAvg):
    """Server: FedAvg's. Client: :class:`FedRSClient` (reads ``algorithm.alpha``).

    Default α = 0.5, the FedLEC experiments' value (the authors' ``main.py``,
    ``-strength`` default 0.5);
    α = 1 is FedAvg, α = 0 drops the missing labels from the softmax.
    """

    name = "fedrs"
    Client = FedRSClient
    config_defaults = {"alpha": 0.5}
    config_checks = {"alpha": number(0, 1)}
