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
is not used there); ``algorithm.weighting: uniform`` takes their plain mean, as
FedLab's server (on which SFedCA's authors ran this baseline) does. The ground set
is every client ([N] in F(S)): a client that straggled or failed in round 1 has no
update yet and enters with Δ_k = 0 (the update of a client that has not moved from
the global model), so it can be selected, and its row is filled the first time it
replies.

Memory: the table of N stale updates (float32, N × P) is the only copy of them the server
keeps; the distances come from their Gram matrix (N × N, float64), whose rows are
recomputed for the clients that replied, a block of parameters at a time
(:func:`gram_rows`). The former code took a float64 copy of the whole table and its
square at every selection: at the papers' scale (N = 100, SFedCA's CIFAR-10 AlexNet,
7.5 M parameters) that is ~18 GB beside the 3 GB table
(``benchmarks/divfl_memory.py``).
"""

from __future__ import annotations

import numpy as np

from neurofed.algorithms.base import Algorithm, Server, weighted_average, weighting_check


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


GRAM_BLOCK_BYTES = 1 << 26  # float64 temporaries of gram_rows: 64 MB per block of columns


def gram_rows(table: np.ndarray, rows) -> np.ndarray:
    """``table[rows] @ table.T`` in float64, accumulated over blocks of columns, so that no
    float64 copy of the whole (N × P, float32) table is ever made."""
    rows = list(rows)
    every = rows == list(range(table.shape[0]))
    block = max(1, GRAM_BLOCK_BYTES // (8 * table.shape[0]))
    out = np.zeros((len(rows), table.shape[0]))
    for start in range(0, table.shape[1], block):
        part = table[:, start:start + block].astype(np.float64)
        out += (part if every else part[rows]) @ part.T
    return out


def similarity_from_gram(gram: np.ndarray) -> np.ndarray:
    """sim(k, i) = C − ||Δ_k − Δ_i||₂ with C the largest distance (so sim ≥ 0), from the
    Gram matrix G = Δ Δᵀ: ||Δ_k − Δ_i||² = G_kk + G_ii − 2 G_ki."""
    gram = np.asarray(gram, dtype=np.float64)
    sq = np.diag(gram)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0))
    np.fill_diagonal(dist, 0.0)
    return dist.max() - dist


def update_similarity(updates: np.ndarray) -> np.ndarray:
    """sim(k, i) = C − ||Δ_k − Δ_i||₂ of the rows of ``updates`` (see :func:`similarity_from_gram`)."""
    u = np.asarray(updates)
    return similarity_from_gram(gram_rows(u, range(u.shape[0])))


class DivFLServer(Server):
    def __init__(self, cfg, spec, initial, context):
        super().__init__(cfg, spec, initial, context)
        self.updates = np.zeros((self.num_clients, spec.size), dtype=np.float32)
        self.gram = np.zeros((self.num_clients, self.num_clients))  # Δ Δᵀ of the table, kept row by row
        self.known = np.zeros(self.num_clients, dtype=bool)

    def configure(self, rnd: int) -> list[tuple[int, dict]]:
        if not self.known.any():  # round 1: every client fills its row of the table
            chosen = list(range(self.num_clients))
        else:
            chosen = sorted(self.select(list(range(self.num_clients))))  # ground set: all N
        return [(c, self.client_config(rnd, c)) for c in chosen]

    def select(self, clients: list[int]) -> list[int]:
        sim = similarity_from_gram(self.gram[np.ix_(clients, clients)])
        return [clients[i] for i in greedy_facility_location(sim, self.num_to_sample())]

    def store(self, results: list) -> None:
        """Write the repliers' fresh updates into the table and their rows of the Gram matrix."""
        for r in results:
            np.subtract(r.params, self.params, out=self.updates[r.cid])
            self.known[r.cid] = True
        self.refresh_gram([r.cid for r in results])

    def refresh_gram(self, rows: list[int]) -> None:
        if rows:
            g = gram_rows(self.updates, rows)
            self.gram[rows, :] = g
            self.gram[:, rows] = g.T

    def aggregate(self, rnd: int, results: list) -> dict:
        fresh = not self.known.any()
        self.store(results)
        if fresh:  # round 1 trained everyone; aggregate the greedy P of the fresh updates
            picked = set(self.select([r.cid for r in results]))
            results = [r for r in results if r.cid in picked]
        self.params = weighted_average(results, self.aggregation_weights(results))
        return {"aggregated": sorted(r.cid for r in results)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "updates": self.updates, "known": self.known}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.updates = np.asarray(state["updates"], dtype=np.float32).copy()
        self.known = np.asarray(state["known"], dtype=bool).copy()
        self.refresh_gram(list(range(self.num_clients)))


class DivFL(Algorithm):
    name = "divfl"
    Server = DivFLServer
    config_defaults = {"weighting": "samples"}
    config_checks = {"weighting": weighting_check}
