"""FedNova: equal steps without momentum is FedAvg; normalised by the effective steps."""

from __future__ import annotations

import numpy as np
import pytest

from algorithm_helpers import one_round
from neurofed.algorithms.base import FitResult, ServerContext, weighted_average
from neurofed.algorithms.fednova import effective_steps
from neurofed.training.params import ParamSpec


def test_fednova_with_equal_steps_and_no_momentum_is_fedavg(tiny_cfg):
    # iid over 4 clients: 336/337 samples each, batch 64 -> 6 steps for every client.
    avg = one_round(tiny_cfg())
    nova = one_round(tiny_cfg(**{"algorithm.name": "fednova"}))
    steps = {r.metrics["steps"] for r in nova.last_results}
    assert len(steps) == 1 and nova.record["tau_eff"] == pytest.approx(steps.pop())
    np.testing.assert_allclose(nova.server.params, avg.server.params, rtol=0, atol=1e-6)


def test_fednova_normalizes_by_effective_steps():
    from neurofed.algorithms.fednova import FedNovaServer

    spec = ParamSpec(("w",), ((2,),))
    x = np.array([1.0, 1.0], np.float32)
    server = FedNovaServer({"federation": {}}, spec, x, ServerContext(2))
    # Client 0: 1 step moving by (1, 0); client 1: 3 steps moving by (0, 3); n = 1 : 3.
    r = [FitResult(0, x - [1, 0], 1, {"fednova_a": 1.0}), FitResult(1, x - [0, 3], 3, {"fednova_a": 3.0})]
    metrics = server.aggregate(1, r)
    tau_eff = 0.25 * 1 + 0.75 * 3
    d = 0.25 * np.array([1, 0]) / 1 + 0.75 * np.array([0, 3]) / 3
    np.testing.assert_allclose(server.params, x - tau_eff * d, rtol=1e-6)
    assert metrics["tau_eff"] == pytest.approx(tau_eff)
    # FedAvg would give x - (0.25, 2.25); FedNova moves client 0's direction by 2.5x more.
    assert not np.allclose(server.params, weighted_average(r))


def test_fednova_momentum_steps_match_the_running_counter():
    for tau, rho in [(1, 0.9), (7, 0.5), (40, 0.9)]:
        counter, total = 0.0, 0.0
        for _ in range(tau):  # the FedNova authors' local_normalizing_vec
            counter = counter * rho + 1
            total += counter
        assert effective_steps(tau, rho) == pytest.approx(total)
    assert effective_steps(12, 0.0) == 12


def test_fednova_client_reports_momentum_steps(tiny_cfg):
    exp = one_round(tiny_cfg(**{"algorithm.name": "fednova", "federation.optimizer": "sgd",
                                "federation.lr": 0.05, "federation.momentum": 0.5}))
    for r in exp.last_results:
        assert r.metrics["fednova_a"] == pytest.approx(effective_steps(r.metrics["steps"], 0.5))
        assert r.metrics["fednova_a"] < r.metrics["steps"] / (1 - 0.5)
