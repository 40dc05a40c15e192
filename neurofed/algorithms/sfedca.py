"""SFedCA (Zhan et al., "SFedCA: Credit Assignment-Based Active Client Selection
Strategy for Spiking Federated Learning", 2024; sources: docs/papers.md).

Server (Algorithm 1): each round it samples S random candidates
(``algorithm.candidates``, P < S <= N), every candidate trains, and only the P
(``federation.clients_per_round``) with the largest firing-rate difference ΔR_k are
aggregated, by a plain average of their models (Alg. 1 line 11, "Average";
``algorithm.weighting: samples`` gives the n_k-weighted average of Eq. 6 instead).

Client: loads the global model W^r, measures its per-class average firing rate
(Eq. 11)

    R_kc(W) = 1/|D_kc| Σ_{ξ∈D_kc} 1/L Σ_l 1/(n_l T) Σ_t Σ_neurons o^{l,t}(ξ; W)

with one no-grad forward pass over its data, trains as in FedAvg, measures again
with W_k^{r+1} under the same input encoding (same seed, so the difference is due to
the weights alone), and reports (Eq. 12)

    ΔR_k = Σ_c (R_kc(W_k^{r+1}) - R_kc(W^r))²

as ``metrics["delta_r"]``. L counts the paper's layers, those with weights
(W = (w^1, …, w^L), §3.2: conv and dense, the output layer included; its pooling layers
have no neurons); ``algorithm.rate_layers: all`` also counts SLAYER's pool layers, which
do have neurons. A class the client does not hold has no rate and contributes 0.

Privacy: only the scalar ΔR_k leaves the client, but it is computed from per-class
rates, and a per-class rate vector (were a deployment to report it, e.g. to let the
server recompute Eq. 12) shows which classes a client holds: absent classes are
exactly the zero entries. ``algorithm.rate_noise`` = σ adds N(0, σ²) to every
class's rate, before and after training and for absent classes too (so the vector
has no zero pattern), and ΔR_k is computed from the noised rates. The noise raises
E[ΔR_k] by the same 2Cσ² for every client, so the ranking is kept in expectation
and only its variance grows. The noise comes from the OS's entropy unless
``federation.privacy_noise: seeded_not_private`` (:mod:`neurofed.training.privacy`). Each
rate is clipped to [0, ``algorithm.rate_clip``] first (1 = no-op for binary spikes),
so the 2C rates before and after training have L2 sensitivity rate_clip·√(2C) over
any two local datasets, and ΔR_k, a function of them, is (ε, δ)-DP with ε from the
analytic Gaussian mechanism at δ = ``algorithm.rate_delta`` (reported per round).
Cost: each candidate trains, so a round trains S
clients (not P) and runs two extra forward passes per candidate.
"""

from __future__ import annotations

import numpy as np
import torch

from neurofed.algorithms.base import Algorithm, Client, Server, weighted_average, weighting_check
from neurofed.config import choice, number
from neurofed.seeds import seed_for
from neurofed.training.local import forward_dataset


def rate_layer_mask(model, layers: str = "weights") -> np.ndarray:
    """Which of the model's spiking layers Eq. 11's mean runs over: ``weights`` (the paper:
    the L layers of W = (w^1, …, w^L), its conv and FC layers, the output layer included;
    its pooling has no neurons) or ``all`` (every SLAYER layer with neurons, pools too)."""
    kinds = [layer.kind for layer in model.layers if layer.has_neurons]
    return np.array([layers == "all" or kind != "pool" for kind in kinds])


def class_firing_rates(model, x: torch.Tensor, y: torch.Tensor, num_classes: int, data_cfg: dict,
                       seed: int, layers: str = "weights") -> np.ndarray:
    """Eq. 11: per-class mean over samples of the mean over layers of each layer's firing
    rate (spikes / (neurons × T)); (num_classes,) float64, 0 for absent classes. The layers
    are those of :func:`rate_layer_mask` (``algorithm.rate_layers``).

    One no-grad forward pass (:func:`neurofed.training.local.forward_dataset`): no
    parameter, buffer, gradient or optimizer changes; the encoding draws from ``seed``.
    """
    _, spikes = forward_dataset(model, x, data_cfg, seed, record=True)
    if spikes is None:
        raise ValueError(f"SFedCA needs a spiking model (model.kind: snn); got {getattr(model, 'kind', '?')!r}")
    neurons = torch.tensor(model.neurons_per_layer, dtype=torch.float64)
    keep = torch.from_numpy(rate_layer_mask(model, layers))
    per_sample = (spikes.double() / (neurons * data_cfg["timesteps"]))[:, keep].mean(1).numpy()
    labels = np.asarray(y)
    sums = np.bincount(labels, weights=per_sample, minlength=num_classes)
    counts = np.bincount(labels, minlength=num_classes)
    return np.divide(sums, counts, out=np.zeros(num_classes), where=counts > 0)


def delta_r(before: np.ndarray, after: np.ndarray) -> float:
    """Eq. 12: Σ_c (R_c(after) − R_c(before))²."""
    return float(np.sum((np.asarray(after) - np.asarray(before)) ** 2))


class SFedCAClient(Client):
    """FedAvg local training bracketed by the two firing-rate passes of Alg. 1 (lines 5, 8)."""

    def begin(self, ctx, model) -> None:
        super().begin(ctx, model)
        ctx.derived.rates_before = self.reported_rates(ctx, model, "before")

    def finish(self, ctx, model, local_flat: np.ndarray, metrics: dict) -> np.ndarray:
        metrics["delta_r"] = delta_r(ctx.derived.rates_before, self.reported_rates(ctx, model, "after"))
        return local_flat

    def reported_rates(self, ctx, model, when: str) -> np.ndarray:
        seed = ctx.seed
        d = ctx.data
        # The same encoding seed before and after training: ΔR reflects the weights only.
        rates = class_firing_rates(model, d.x, d.y, d.num_classes, self.cfg["data"], seed_for(seed, "rates"),
                                   self.cfg["algorithm"]["rate_layers"])
        algo = self.cfg["algorithm"]
        sigma = algo.get("rate_noise", 0.0)
        if sigma:
            rates = np.clip(rates, 0.0, algo.get("rate_clip", 1.0))
            rates = rates + self.noise(ctx, "rate_noise", when == "after").normal(sigma, rates.shape)
        return rates


class SFedCAServer(Server):
    """Random candidate set S (Step 1); aggregate the top-P by ΔR (Step 3)."""

    def num_to_sample(self) -> int:
        return min(self.cfg["algorithm"]["candidates"], self.num_clients)

    def aggregate(self, rnd: int, results: list) -> dict:
        p = self.cfg["federation"]["clients_per_round"]
        chosen = top_p(results, p)
        self.params = weighted_average(chosen, self.aggregation_weights(chosen))
        return {"aggregated": sorted(r.cid for r in chosen),
                "delta_r": [float(r.metrics["delta_r"]) for r in results]}


def top_p(results: list, p: int) -> list:
    """The ``p`` results with the largest ``metrics["delta_r"]`` (ties: lower client id)."""
    return sorted(results, key=lambda r: (-float(r.metrics["delta_r"]), r.cid))[:p]


class SFedCA(Algorithm):
    name = "sfedca"
    Server = SFedCAServer
    Client = SFedCAClient
    config_defaults = {"candidates": 10, "rate_noise": 0.0, "rate_clip": 1.0, "rate_delta": 1e-5,
                       "weighting": "uniform", "rate_layers": "weights"}
    config_checks = {
        "candidates": number(2, integer=True),
        "rate_noise": number(0),
        "rate_clip": number(0, 1, lo_open=True),
        "rate_delta": number(0, 1, lo_open=True),
        "weighting": weighting_check,
        "rate_layers": choice(("weights", "all")),
    }

    @classmethod
    def privacy_mechanisms(cls, cfg: dict, num_classes: int) -> list[dict]:
        from neurofed.training.privacy import gaussian_epsilon

        algo = cfg["algorithm"]
        sigma = algo.get("rate_noise", 0.0)
        if not sigma:  # ΔR_k from clean rates: no bound
            return [{"release": "firing-rate report (delta_r)", "mechanism": "none", "epsilon": None, "delta": 0.0}]
        sens = algo["rate_clip"] * np.sqrt(2 * num_classes)
        return [{"release": "firing-rate report (delta_r)", "mechanism": "gaussian", "sigma": sigma,
                 "clip": algo["rate_clip"], "sensitivity_l2": float(sens),
                 "epsilon": gaussian_epsilon(sigma, float(sens), algo["rate_delta"]), "delta": algo["rate_delta"]}]

    @classmethod
    def validate_config(cls, algo_cfg: dict, cfg: dict) -> list[str]:
        problems = super().validate_config(algo_cfg, cfg)
        s = algo_cfg.get("candidates")
        p = cfg.get("federation", {}).get("clients_per_round")
        n = cfg.get("partition", {}).get("num_clients")
        if not problems and isinstance(p, int) and isinstance(n, int) and not p < s <= n:
            problems.append(f"algorithm.candidates: got {s}; expected federation.clients_per_round ({p}) "
                            f"< candidates <= partition.num_clients ({n})")
        if cfg.get("model", {}).get("kind", "snn") != "snn":
            problems.append("model.kind: sfedca selects by firing rates; expected snn")
        return problems
