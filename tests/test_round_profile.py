"""benchmarks/round_profile.py measures what it claims: counted client fits and
evaluations, the server's retained memory, and an aggregation baseline that computes
the same average. (No timings are asserted.)"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
round_profile = pytest.importorskip("round_profile")

from neurofed.algorithms import get_algorithm_class  # noqa: E402
from neurofed.algorithms.base import FitResult, ServerContext, weighted_average  # noqa: E402
from neurofed.training.params import ParamSpec  # noqa: E402

SPEC = ParamSpec(("a.weight", "b.weight", "b.bias"), ((3, 4), (5,), (2, 1)))


def test_per_tensor_baseline_computes_the_same_average():
    rng = np.random.default_rng(0)
    results = [FitResult(c, rng.standard_normal(SPEC.size).astype(np.float32), n) for c, n in enumerate((1, 3))]
    messages = [SPEC.unpack(r.params) for r in results]
    loop = round_profile.per_tensor_average(messages, [1, 3])
    flat = SPEC.pack({k: v.numpy() for k, v in loop.items()})
    by_hand = 0.25 * results[0].params.astype(np.float64) + 0.75 * results[1].params
    np.testing.assert_allclose(flat, by_hand, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(weighted_average(results), by_hand, rtol=1e-6, atol=1e-7)


def test_server_memory_is_model_sized(tiny_cfg):
    # FedAvg's server keeps the model (one flat vector); SCAFFOLD's adds c, still
    # O(model): the clients' c_i are client state, not server state.
    for name, copies in (("fedavg", 1), ("scaffold", 2)):
        cfg = tiny_cfg(**{"algorithm.name": name})
        server = get_algorithm_class(name).Server(cfg, SPEC, np.zeros(SPEC.size, np.float32), ServerContext(1000))
        server.aggregate(1, [FitResult(c, np.ones(SPEC.size, np.float32), 10, {"steps": 2}) for c in range(3)])
        assert round_profile.retained_bytes(server) == copies * SPEC.nbytes, name


def test_retained_bytes_counts_shared_arrays_once():
    a = np.zeros(100, np.float32)

    class Holder:
        def __init__(self):
            self.x, self.y, self.z = a, {"again": a, "view": a[:10]}, [np.zeros(7, np.float64)]

    assert round_profile.retained_bytes(Holder()) == 400 + 56


def test_profiled_run_counts_fits_and_evaluations(tiny_cfg, tmp_path):
    # with stragglers, only the selected clients that survive train; one evaluation per round
    cfg = tiny_cfg(**{"federation.straggler_prob": 0.5, "partition.num_clients": 6,
                      "federation.clients_per_round": 4})
    run = round_profile.profiled_run(cfg, str(tmp_path / "run"))
    exp = run["exp"]
    assert len(run["records"]) == 2
    for rec in run["records"]:
        survivors = [c for c in rec["selected"] if c not in rec["stragglers"]]
        assert sorted(run["fits"][rec["round"]]) == sorted(survivors) == sorted(rec["trained"])
        assert run["evals"][rec["round"]] == [(True, len(exp.y_test))]
    assert any(rec["stragglers"] for rec in run["records"])  # the case exercises dropped clients
