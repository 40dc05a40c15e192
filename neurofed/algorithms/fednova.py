"""FedNova (Wang et al., "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020, https://arxiv.org/abs/2007.07481).

Clients that take more local steps pull the FedAvg average towards their own
optimum. FedNova divides each client's update by its effective number of local steps
before averaging and rescales the result by the average effective step count.
"""

from __future__ import annotations

import numpy as np

from neurofed.algorithms.base import Client, FitResult, Server
from neurofed.algorithms.fedavg import FedAvg


def effective_steps(steps: int, momentum: float = 0.0) -> float:
    """‖a_i‖₁ for τ local steps of SGD with heavy-ball momentum ρ (the FedNova paper's
    momentum case, and its authors' running counter Σ_{k=1..τ} (1 − ρ^k)/(1 − ρ)):
    ‖a_i‖₁ = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ); τ for ρ = 0."""
    tau, rho = float(steps), float(momentum)
    if rho == 0.0:
        return tau
    return (tau - rho * (1.0 - rho ** tau) / (1.0 - rho)) / (1.0 - rho)


class FedNovaClient(Client):
    """Trains like FedAvg and reports ``fednova_a`` = ‖a_i‖₁ with its upload.

    Choice for Adam (the paper defines a_i for SGD, momentum SGD and proximal SGD
    only): a_i = τ, the number of local steps. Adam's first moment is an exponential
    *average* whose weights sum to at most one per gradient (unlike heavy-ball
    momentum, whose weights sum to up to 1/(1 − ρ)), and its per-coordinate scaling
    has no scalar counterpart, so we count steps; this still normalizes the
    heterogeneous numbers of local steps that FedNova is about. With
    ``federation.optimizer: sgd`` the exact momentum formula above is used. Weight
    decay is not folded into a_i (the paper's proximal case is not a weight decay).
    """

    def finish(self, ctx, model, local_flat, metrics):
        fed = self.cfg["federation"]
        rho = fed.get("momentum", 0.0) if fed["optimizer"] == "sgd" else 0.0
        metrics["fednova_a"] = effective_steps(metrics["steps"], rho)
        return local_flat


class FedNovaServer(Server):
    r"""Normalized averaging (the FedNova update, with the cumulative update
    Δ_i = x − y_i = η Σ_k a_{i,k} g_i):

    x ← x − τ_eff Σ_i p_i Δ_i / ‖a_i‖₁,   τ_eff = Σ_i p_i ‖a_i‖₁,   p_i = n_i / Σ_j n_j

    over the clients that replied. With equal ‖a_i‖₁ this is FedAvg.
    """

    def aggregate(self, rnd: int, results: list[FitResult]) -> dict:
        n = np.array([r.num_examples for r in results], dtype=np.float64)
        p = n / n.sum()
        a = np.array([float(r.metrics["fednova_a"]) for r in results])
        x = self.params.astype(np.float64)
        deltas = x[None, :] - np.stack([r.params for r in results]).astype(np.float64)
        tau_eff = float(p @ a)
        self.params = (x - tau_eff * ((p / a) @ deltas)).astype(np.float32)
        return {"tau_eff": tau_eff}


class FedNova(FedAvg):
    """Server: :class:`FedNovaServer`. Client: :class:`FedNovaClient`."""

    name = "fednova"
    Server = FedNovaServer
    Client = FedNovaClient
    config_defaults = {}  # p_i = n_i / Σ n_j is part of its normalized update: no weighting choice
