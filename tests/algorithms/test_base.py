"""neurofed.algorithms.base: Laplace LDP on any algorithm's upload; the client keeps no per-call state."""

from __future__ import annotations

import math

import numpy as np
import pytest

from algorithm_helpers import BUILT_ONCE, privatized, one_round


def test_laplace_noise_has_the_requested_scale():
    n, delta = 200_000, 0.3
    for source in ("os_entropy", "seeded_not_private"):
        noise = privatized(delta, n, np.zeros(n, np.float32), privacy_noise=source).astype(np.float64)
        # Laplace(0, b): E|X| = b, Var = 2b², E|X|/std = 1/√2 (a Gaussian gives √(2/π) ≈ 0.80)
        assert abs(noise.mean()) < 4 * math.sqrt(2) * delta / math.sqrt(n)
        assert np.abs(noise).mean() == pytest.approx(delta, rel=0.01)
        assert noise.std() == pytest.approx(math.sqrt(2) * delta, rel=0.01)
        assert np.abs(noise).mean() / noise.std() == pytest.approx(1 / math.sqrt(2), rel=0.01)
        again = privatized(delta, n, np.zeros(n, np.float32), privacy_noise=source)
        # seeded: the round's client seed fixes the noise; OS entropy: never the same twice
        assert np.array_equal(noise, again) == (source == "seeded_not_private")
    assert np.array_equal(privatized(0.0, 5, np.ones(5, np.float32)), np.ones(5, np.float32))


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_laplace_noise_is_added_to_the_upload_of_any_algorithm(tiny_cfg, name):
    clean = one_round(tiny_cfg(**{"algorithm.name": name}))
    noisy = one_round(tiny_cfg(**{"algorithm.name": name, "federation.ldp_laplace": 0.05}))
    for c, z in zip(clean.last_results, noisy.last_results):
        diff = (z.params - c.params).astype(np.float64)
        assert np.abs(diff).mean() == pytest.approx(0.05, rel=0.15)


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "fednova", "fedlc", "fedrs", "fedlec",
                                  "fedmos", "sfedca", "divfl"])
def test_client_keeps_no_per_call_state(tiny_cfg, name):
    # a round's values (download, config, data, state, what begin derives) live in the FitContext
    skew = {"partition.scheme": "cnum", "partition.classes_per_client": 2}  # FedLEC distils
    extra = {"algorithm.candidates": 3} if name == "sfedca" else {}
    exp = one_round(tiny_cfg(**skew, **extra, **{"algorithm.name": name}))
    assert exp.record["trained"] and not exp.record["failed"], exp.record
    assert set(vars(exp.client)) <= BUILT_ONCE, set(vars(exp.client)) - BUILT_ONCE
