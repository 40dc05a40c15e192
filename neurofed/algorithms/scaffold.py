"""SCAFFOLD (Karimireddy et al., "SCAFFOLD: Stochastic Controlled Averaging for
Federated Learning", ICML 2020, https://arxiv.org/abs/1910.06378).

Control variates correct each client's drift: the server keeps c (an estimate of the
global update direction), every client keeps c_i (its own), and local steps are
corrected by c − c_i. Option II of the paper's Algorithm 1 updates c_i from the
client's own trajectory, at no extra gradient cost.
"""

from __future__ import annotations

import numpy as np
import torch

from neurofed.algorithms.base import Client, FitResult, Server, weighted_average
from neurofed.algorithms.fedavg import FedAvg
from neurofed.config import number

# Key of the server variate c in the downloaded message (torch parameter names hold no "/").
C_KEY = "scaffold/c"


def option_ii(x: np.ndarray, y: np.ndarray, c: np.ndarray, steps: int, lr: float) -> np.ndarray:
    """Δc_i = c_i⁺ − c_i = (x − y_i) / (K η_l) − c   (Algorithm 1, option II)."""
    return ((x.astype(np.float64) - y) / (max(int(steps), 1) * lr) - c).astype(np.float32)


class ScaffoldClient(Client):
    r"""Each local step (Algorithm 1): y_i ← y_i − η_l (g_i(y_i) + c − c_i).

    Applied after the optimizer's step as w ← w − η_l (c − c_i), as the NIID-Bench
    code (Li et al., ICDE 2022) and the FedLEC authors' code do: for plain SGD this
    is exactly that step; for SGD with momentum or Adam the correction stays a
    displacement of η_l (c − c_i) per step, in the same units as the option II
    variates below (mean displacement per step / η_l), instead of being rescaled by
    Adam's preconditioner. After K local steps (option II):
    c_i⁺ = c_i − c + (x − y_i)/(K η_l), y_i the upload as sent (after ``federation.update_noise``
    and, under LDP, clipped and noised, as the server sees it: :meth:`uploaded`), kept in
    ``state["c_i"]`` (a flat float32 vector; zero before a client's first round). η_l is this
    round's learning rate (``federation.lr`` with its schedule, :func:`neurofed.algorithms.policies.round_lr`).
    """

    def begin(self, ctx, model) -> None:
        super().begin(ctx, model)
        r = ctx.derived
        r.c = np.asarray(ctx.params[C_KEY], dtype=np.float32)
        r.c_i = ctx.state.get("c_i", np.zeros_like(r.c))
        r.lr = float(ctx.config.get("lr", self.cfg["federation"]["lr"]))  # this round's η_l
        drift = r.c - r.c_i
        r.correction = self.param_tensors(ctx, model, drift) if np.any(drift) else []

    @torch.no_grad()
    def after_step(self, ctx, model, optimizer) -> None:
        for p, d in ctx.derived.correction:
            p.sub_(d, alpha=ctx.derived.lr)

    def uploaded(self, ctx, upload, metrics):
        # Δc_i from the upload as sent (update noise and, under federation.ldp_laplace, the
        # privatized upload, a post-processing of it): exactly the Δc_i the server computes,
        # so c stays the mean of the c_i (a c_i from the clean y_i would drift from it).
        r = ctx.derived
        delta_c = option_ii(ctx.global_flat, upload, r.c, metrics["steps"], r.lr)
        ctx.state["c_i"] = r.c_i + delta_c


class ScaffoldServer(Server):
    r"""Sends (x, c); after the round (Algorithm 1, server update):

    x ← x + η_g (Σ_i p_i y_i − x),   c ← c + (1/N) Σ_{i∈S} Δc_i

    with p_i = n_i / Σ n_j over the replying clients S (the paper averages uniformly,
    1/|S|; we weight by samples like FedAvg, as the FedLEC and NIID-Bench code do, so
    η_g = 1 with zero variates is exactly FedAvg), N the number of clients — the
    participating share |S|/N of the mean Δc — and η_g ``algorithm.global_lr``.

    Clients upload only y_i: the server recomputes each Δc_i from option II (it knows
    x, c, η_l and the client's step count K from its metrics), so the upload is the
    same size as FedAvg's and Δc_i is exactly the value the client stored. With
    ``federation.update_noise`` or ``ldp_laplace`` both sides compute Δc_i from the noised
    y_i (only the noised upload ever leaves a client), so c = c⁰ + (1/N) Σ_i (c_i − c_i⁰) holds.
    """

    def __init__(self, cfg, spec, initial, context):
        super().__init__(cfg, spec, initial, context)
        self.c = np.zeros(spec.size, dtype=np.float32)

    def message(self):
        return {**super().message(), C_KEY: self.c}

    def aggregate(self, rnd: int, results: list[FitResult]) -> dict:
        lr = self.cfg["federation"]["lr"]
        deltas = [option_ii(self.params, r.params, self.c, r.metrics["steps"],
                            float(self.client_config(rnd, r.cid).get("lr", lr))) for r in results]
        eta_g = float(self.cfg["algorithm"]["global_lr"])
        average = weighted_average(results)
        x = self.params.astype(np.float64)
        self.params = average if eta_g == 1.0 else (x + eta_g * (average - x)).astype(np.float32)
        self.c = (self.c + np.sum(deltas, axis=0) / self.num_clients).astype(np.float32)
        return {"control_variate_norm": float(np.linalg.norm(self.c))}

    def state_dict(self):
        return {**super().state_dict(), "c": self.c}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.c = np.asarray(state["c"], dtype=np.float32)


class Scaffold(FedAvg):
    """Server: :class:`ScaffoldServer` (variate c, checkpointed). Client:
    :class:`ScaffoldClient` (variate c_i in the per-client state).

    Default η_g = 1 (SCAFFOLD's experiments, and a FedAvg-shaped server step as in the
    FedLEC baselines, whose paper prints no SCAFFOLD settings)."""

    name = "scaffold"
    Server = ScaffoldServer
    Client = ScaffoldClient
    needs_client_state = True
    config_defaults = {"global_lr": 1.0}
    config_checks = {"global_lr": number(0, lo_open=True)}
