"""FedProx: mu = 0 is FedAvg; the proximal term is half mu times the squared distance."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from algorithm_helpers import one_round
from neurofed.algorithms.base import FitContext


def test_fedprox_with_mu_zero_is_fedavg(tiny_cfg):
    skew = {"partition.scheme": "cnum", "partition.classes_per_client": 2}
    avg = one_round(tiny_cfg(**skew))
    prox = one_round(tiny_cfg(**skew, **{"algorithm.name": "fedprox", "algorithm.mu": 0.0}))
    assert np.array_equal(avg.server.params, prox.server.params)


def test_fedprox_adds_half_mu_squared_distance(tiny_cfg):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": "fedprox", "algorithm.mu": 0.3}))
    client, spec = exp.client, exp.spec
    model = client.model()
    ctx = FitContext(spec.unpack(exp.initial), {"seed": 0}, exp.client_data(0), spec=spec, global_flat=exp.initial)
    client.cfg = exp.cfg
    delta = np.random.default_rng(0).normal(0, 0.01, spec.size).astype(np.float32)
    spec.set(model, exp.initial + delta)
    client.begin(ctx, model)
    out = torch.rand(3, 10, 4)
    y = torch.tensor([0, 3, 9])
    extra = (client.loss(ctx, model, out, y, None) - F.cross_entropy(model.readout(out), y)).detach()
    expected = 0.5 * 0.3 * float(np.sum(delta.astype(np.float64) ** 2))
    assert float(extra) == pytest.approx(expected, rel=1e-4)
