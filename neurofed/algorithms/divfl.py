"""DivFL (Balakrishnan et al., "Diverse Client Selection for Federated Learning via
Submodular Maximization", ICLR 2022, https://openreview.net/forum?id=nwKXyFvaUm).

The aggregate of a subset S should approximate the aggregate of all N clients. The
paper bounds the approximation error by G(S) = Σ_{k∈[N]} min_{i∈S} ||∇f_k − ∇f_i||
and minimizes it greedily, i.e. maximizes the (monotone submodular) facility-location
function

    F(S) = Σ_{k∈[N]} max_{i∈S} sim(k, i),   sim(k, i) = C − ||Δ_k − Δ_i||,  C = max_{k,i} ||Δ_k − Δ_i||

with the greedy rule S ← S ∪ {argmax_j F(S ∪ {j}) − F(S)} until |S| = P. (C only
makes sim ≥ 0 so that F(∅) = 0; the greedy picks are those of minimizing G.)

Practical variant ("DivFL without overhead"): the server keeps each client's last
update Δ_k = w_k − w (the local model minus the global model it started from) and
selects on these stale vectors; the selected clients' entries are replaced by their
fresh updates every round. Choice made here: the table is filled in round 1 by
letting all N clients train once (the authors' code instead probes every client's
full-batch gradient at the initial model); that round aggregates the greedy P of
those N fresh updates. Aggregation is FedAvg's n_k-weighted average of the selected
clients, as in the authors' released trainer (the γ-weighted form of the analysis
is not used there). The ground set is every client ([N] in F(S)): a client that
straggled or failed in round 1 has no update yet and enters with Δ_k = 0 (the update
of a client that has not moved from the global model), so it can be selected, and its
row is filled the first time it replies.
"""

from __future__ import annotations

import numpy as np

from neurofed.algorithms.base import Algorithm, Server, weighted_average


def greedy_facility_location(sim: np.ndarray, budget: int, ground: list[int] | None = None) -> list[int]:
    """Greedy maximization of F(S) = Σ_k max_{i∈S} sim[k, i] over columns in ``ground``.

    ``sim`` is (rows to represent) × (candidate columns), non-negative. Returns the
    picks in the order chosen; ties go to the earliest candidate in ``ground``.
    """
    sim = np.asarray(sim, dtype=np.float64)
    remaining = list(range(sim.shape[1])) if ground is None else list(ground)
    best = np.zeros(sim.shape[0])  # max_{i∈S} sim[k, i]; F(∅) = 0
    picks: list[int] = []
    for _ in range(min(budget, len(remaining))):
        gains = np.maximum(sim[:, remaining], best[:, None]).sum(0) - best.sum()
        j = remaining.pop(int(np.argmax(gains)))
        picks.append(j)
        best = np.maximum(best, sim[:, j])
    return picks


def update_similarity(updates: np.ndarray) -> np.ndarray:
    """sim(k, i) = C − ||Δ_k − Δ_i||₂ with C the largest distance (so sim ≥ 0)."""
    u = np.asarray(updates, dtype=np.float64)
    sq = (u * u).sum(1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * (u @ u.T), 0.0))
    np.fill_diagonal(dist, 0.0)
    return dist.max() - dist


class DivFLServer(Server):
    def __init__(self, cfg, spec, initial, num_clients):
        super().__init__(cfg, spec, initial, num_clients)
        self.updates = np.zeros((num_clients, spec.size), dtype=np.float32)
        self.known = np.zeros(num_clients, dtype=bool)

    def configure(self, rnd: int) -> list[tuple[int, dict]]:
        if not self.known.any():  # round 1: every client fills its row of the table
            chosen = list(range(self.num_clients))
        else:
            chosen = sorted(self.select(list(range(self.num_clients))))  # ground set: all N
        return [(c, self.client_config(rnd, c)) for c in chosen]

    def select(self, clients: list[int]) -> list[int]:
        sim = update_similarity(self.updates[clients])
        return [clients[i] for i in greedy_facility_location(sim, self.num_to_sample())]

    def aggregate(self, rnd: int, results: list) -> dict:
        fresh = not self.known.any()
        for r in results:
            self.updates[r.cid] = r.params - self.params
            self.known[r.cid] = True
        if fresh:  # round 1 trained everyone; aggregate the greedy P of the fresh updates
            picked = set(self.select([r.cid for r in results]))
            results = [r for r in results if r.cid in picked]
        self.params = weighted_average(results)
        return {"aggregated": sorted(r.cid for r in results)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "updates": self.updates, "known": self.known}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.updates = np.asarray(state["updates"], dtype=np.float32).copy()
        self.known = np.asarray(state["known"], dtype=bool).copy()


class DivFL(Algorithm):
    name = "divfl"
    Server = DivFLServer
