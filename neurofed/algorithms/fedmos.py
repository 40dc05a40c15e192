"""FedMoS (Wang et al., "FedMoS: Taming Client Drift in Federated Learning with Double
Momentum and Adaptive Selection", IEEE INFOCOM 2023,
https://doi.org/10.1109/INFOCOM53939.2023.10228957; authors' code:
https://github.com/Distributed-Learning-Networking-Group/FedMoS).

Client, per local step t on minibatch ξ_t (local momentum, a STORM-type estimator,
with a proximal pull to the round's global model w):

    d_t     = ∇f(x_t; ξ_t) + (1 − a) (d_{t−1} − ∇f(x_{t−1}; ξ_t)),   d_0 = ∇f(x_0; ξ_0)
    x_{t+1} = x_t − η d_t − μ (x_t − w)

``algorithm.a`` = a, ``algorithm.mu`` = μ; d resets every round. The optimizer
(``federation.optimizer``) is handed d_t in place of the gradient: with ``sgd`` and
no momentum this is the update above exactly; with ``adam`` it is Adam on d_t (a
choice). ``algorithm.estimator``:

- ``storm`` (the paper's equation): both gradients of the difference are taken on the
  same encoded minibatch ξ_t, a second forward/backward pass at x_{t−1};
- ``authors`` (the authors' ``FedMosOptimizer.update_momentum``): the difference takes the
  previous step's stored gradient g_{t−1} = ∇f(x_{t−1}; ξ_{t−1}), zero before the first
  step, so d_t = g_t + (1 − a)(d_{t−1} − g_{t−1}) = g_t + (1 − a)^t g_0: the plain gradient
  plus a fading copy of the first one, at one pass a step.

Server momentum (``algorithm.beta`` = β), on the aggregated update
Δ^r = Σ_k q_k (w_k − w^r) / Σ_k q_k:

    u^{r+1} = β u^r + Δ^r,   w^{r+1} = w^r + u^{r+1}   (r ≥ 2);   w^2 = w^1 + Δ^1, u^2 = 0

which is the code's u ← β u − Δ/(ηE), w ← w − ηE u written without its ηE factor
(it cancels; u here is the last global move). The first round is the code's ``iter == 0``
branch: its move is applied but kept out of u, so the jump from the initial weights is not
repeated β-scaled in round 2 (with it in u, round 2 fell to chance on MNIST, seeds 1 and 2).

Adaptive selection (the code's ``select_adaptively``): with p_k = n_k / Σ n, lay
the clients in decreasing p_k along [0, P) with segment lengths P·p_k; draw j
(j = 0..P−1) picks one client from the slice [j, j+1) with probability equal to its
overlap. Client k is thus drawn P·p_k times in expectation, a client can be drawn
more than once, and q_k = (times drawn) / P is its aggregation weight.
"""

from __future__ import annotations

import numpy as np
import torch

from neurofed.algorithms.base import Algorithm, Client, Server
from neurofed.config import choice, number
from neurofed.device import model_device
from neurofed.seeds import rng_for
from neurofed.models import quantize as quantization


def adaptive_selection(p: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """Times each client is drawn in the m draws of FedMoS's adaptive selection."""
    p = np.asarray(p, dtype=np.float64)
    p = p / p.sum()
    order = np.argsort(-p, kind="stable")
    edges = np.concatenate([[0.0], np.cumsum(m * p[order])])
    edges[-1] = m  # absorb rounding so the last slice is full
    counts = np.zeros(len(p), dtype=np.int64)
    for j in range(m):
        overlap = np.clip(np.minimum(edges[1:], j + 1) - np.maximum(edges[:-1], j), 0.0, None)
        counts[order[rng.choice(len(p), p=overlap / overlap.sum())]] += 1
    return counts


ESTIMATORS = ("storm", "authors")


def storm_direction(grad: torch.Tensor, grad_prev_point: torch.Tensor | None, d_prev: torch.Tensor | None,
                    a: float) -> torch.Tensor:
    """d_t = g(x_t; ξ_t) + (1 − a)(d_{t−1} − g(x_{t−1}; ξ_t)); d_0 = g(x_0; ξ_0). Under
    ``estimator: authors`` ``grad_prev_point`` is the previous step's own gradient (zero
    at d_0's step, so d_1 = g_1 + (1 − a) g_0)."""
    if d_prev is None:
        return grad.clone()
    return grad + (1.0 - a) * (d_prev - grad_prev_point)


def server_momentum_step(params: np.ndarray, momentum: np.ndarray, delta: np.ndarray, beta: float):
    """u ← β u + Δ; w ← w + u. Returns (w, u)."""
    momentum = beta * momentum + delta
    return (params + momentum).astype(np.float32), momentum.astype(np.float32)


def _flat_grad(model, names) -> torch.Tensor:
    params = dict(model.named_parameters())
    # a federated statistic (batch norm's running mean) has no gradient: zeros, and none is set
    return torch.cat([(params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])).reshape(-1)
                      for n in names])


class FedMoSClient(Client):
    """Hooks: ``before_step`` swaps the gradient for d_t and notes μ(x_t − w);
    ``after_step`` applies that pull once the optimizer has stepped."""

    def __init__(self, cfg, spec, model_factory):
        super().__init__(cfg, spec, model_factory)
        self._prev_model = None  # holds x_{t−1} for ∇f(x_{t−1}; ξ_t); built once

    def begin(self, ctx, model) -> None:
        super().begin(ctx, model)
        r = ctx.derived
        r.d = None  # local momentum, reset every round
        r.prev_flat = None  # x_{t−1}
        r.prev_grad = None  # estimator authors: the previous step's gradient, g_{t−1}
        r.device = model_device(model)
        r.global_t = torch.from_numpy(ctx.global_flat.copy()).to(r.device)

    def loss(self, ctx, model, output, y, x):
        ctx.derived.batch = (x, y)
        return super().loss(ctx, model, output, y, x)

    def before_step(self, ctx, model, optimizer) -> None:
        r, spec = ctx.derived, ctx.spec
        a = self.cfg["algorithm"]["a"]
        grad = _flat_grad(model, spec.names)
        if self.cfg["algorithm"]["estimator"] == "authors":
            grad_prev = r.prev_grad
            # the authors' optimizer keeps its stored gradient at zero over d_0's step, not g_0
            r.prev_grad = torch.zeros_like(grad) if r.d is None else grad.clone()
        else:
            grad_prev = self.grad_at_previous_point(ctx, model) if r.d is not None else None
        r.d = storm_direction(grad, grad_prev, r.d, a)
        r.prev_flat = spec.get(model)
        x_t = torch.from_numpy(r.prev_flat).to(r.device)
        r.prox = self.cfg["algorithm"]["mu"] * (x_t - r.global_t)
        params = dict(model.named_parameters())
        for name, sl in spec.slices().items():
            if params[name].grad is not None:
                params[name].grad.copy_(r.d[sl].view_as(params[name]))

    def after_step(self, ctx, model, optimizer) -> None:
        if not self.cfg["algorithm"]["mu"]:
            return
        params = dict(model.named_parameters())
        with torch.no_grad():
            for name, sl in ctx.spec.slices().items():
                params[name].sub_(ctx.derived.prox[sl].view_as(params[name]))

    def grad_at_previous_point(self, ctx, model) -> torch.Tensor:
        """∇f(x_{t−1}; ξ_t) on the same encoded minibatch, in a second model."""
        if self._prev_model is None:
            self._prev_model = self.model_factory()
        prev = quantization.for_round(self._prev_model, ctx.round, self.cfg["federation"]["rounds"])  # as the model's
        prev.train(model.training)
        ctx.spec.set(prev, ctx.derived.prev_flat)
        prev.zero_grad(set_to_none=True)
        x, y = ctx.derived.batch
        Client.loss(self, ctx, prev, prev(x), y, x).backward()
        return _flat_grad(prev, ctx.spec.names)


class FedMoSServer(Server):
    def __init__(self, cfg, spec, initial, context):
        super().__init__(cfg, spec, initial, context)
        self.momentum = np.zeros_like(self.params)
        self.draws: dict[int, int] = {}

    def configure(self, rnd: int) -> list[tuple[int, dict]]:
        # n_k of every client (from the partition); without them p_k is uniform
        sizes = self.context.client_sizes if self.context.client_sizes is not None else np.ones(self.num_clients)
        counts = adaptive_selection(sizes, self.num_to_sample(), rng_for(self.cfg["seed"], "select", rnd))
        self.draws = {int(c): int(counts[c]) for c in np.flatnonzero(counts)}
        return [(c, self.client_config(rnd, c)) for c in sorted(self.draws)]

    def aggregate(self, rnd: int, results: list) -> dict:
        q = np.array([self.draws.get(r.cid, 1) for r in results], dtype=np.float64)
        delta = (q / q.sum()) @ (np.stack([r.params for r in results]) - self.params)
        if rnd == 1:  # the authors' first round: w += Δ, u stays 0
            self.params = (self.params + delta).astype(np.float32)
        else:
            self.params, self.momentum = server_momentum_step(self.params, self.momentum, delta,
                                                              self.cfg["algorithm"]["beta"])
        return {"aggregated": sorted(r.cid for r in results), "draws": [int(x) for x in q]}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "momentum": self.momentum}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.momentum = np.asarray(state["momentum"], dtype=np.float32).copy()


class FedMoS(Algorithm):
    name = "fedmos"
    Server = FedMoSServer
    Client = FedMoSClient
    # Defaults of the authors' code (utils/options.py): a = 0.2, mu = 1e-4, beta = 0.5.
    config_defaults = {"a": 0.2, "mu": 0.0001, "beta": 0.5, "estimator": "storm"}
    config_checks = {
        "estimator": choice(ESTIMATORS),
        "a": number(0, 1, lo_open=True),
        "mu": number(0, 1),
        "beta": number(0, 1),
    }
