"""FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017, https://arxiv.org/abs/1602.05629); with SNN
clients this is FedSNN (Venkatesha et al. 2021).

Server: samples P of N clients uniformly each round and sets
w_{r+1} = Σ_k n_k w_k^{r+1} / Σ_k n_k over the clients that replied (McMahan's Alg. 1).
``algorithm.weighting: uniform`` takes the plain mean instead, as FedLab's
``SyncServerHandler`` does: the server SFedCA's authors ran their random-selection
baseline (FedSNN) on; see ``docs/fidelity.md``.
Client: E local epochs of the configured optimizer on cross-entropy of the
spike-rate logits; uploads its parameters. Both halves are the defaults in
:mod:`neurofed.algorithms.base`, which every other algorithm extends.
"""

from neurofed.algorithms.base import Algorithm, weighting_check


class FedAvg(Algorithm):
    name = "fedavg"
    config_defaults = {"weighting": "samples"}
    config_checks = {"weighting": weighting_check}
