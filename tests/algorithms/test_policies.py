"""neurofed.algorithms.policies: FedSNN's update noise and lr milestones."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.algorithms.base import Client, FitContext, ServerContext
from neurofed.config import ConfigError, load_config
from neurofed.training.params import ParamSpec


def test_update_noise_is_relative_to_each_tensor_s_mean_update_by_default():
    # FedSNN Fig. 8b (authors' code): noise_t = N(0,1) · s · mean|Δ_t| per tensor.
    from neurofed.seeds import seed_for

    spec = ParamSpec(("a", "b"), ((2,), (2,)))
    glob = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    upload = np.array([2.0, -2.0, 0.5, -0.5], np.float32)  # mean|Δ|: a = (1 + 3)/2 = 2, b = 0.5
    z = np.random.default_rng(seed_for(1234, "update_noise")).normal(0.0, 1.0, 4)

    def noised(**fed):
        cfg = load_config(None, [f"federation.{k}={v}" for k, v in fed.items()])
        client = Client(cfg, spec, lambda: None)
        ctx = FitContext({}, {"seed": 1234}, None, spec=spec, global_flat=glob)
        return client.add_update_noise(ctx, upload).astype(np.float64)

    np.testing.assert_allclose(noised(update_noise=0.5), upload + z * 0.5 * np.array([2, 2, 0.5, 0.5]), rtol=1e-6)
    np.testing.assert_allclose(noised(update_noise=0.5, update_noise_mode="absolute"), upload + z * 0.5, rtol=1e-6)
    assert np.array_equal(noised(update_noise=0.0), upload)
    with pytest.raises(ConfigError, match="federation.update_noise_mode"):
        load_config(None, ["federation.update_noise_mode=gaussian"])


def test_step_lr_schedule_multiplies_by_gamma_after_each_milestone(tiny_cfg):
    # FedSNN Sec. IV-A: "reduced by a factor of 5 after 40, 60, and 80 epochs".
    from neurofed.algorithms.base import Server, ServerContext
    from neurofed.algorithms.policies import round_lr

    fed = {"lr": 0.1, "lr_milestones": [40, 60, 80], "lr_gamma": 0.2}
    assert [round_lr(fed, r) for r in (1, 40)] == [0.1, 0.1]
    assert round_lr(fed, 41) == pytest.approx(0.02)
    assert round_lr(fed, 61) == pytest.approx(0.004)
    assert round_lr(fed, 100) == pytest.approx(0.1 / 125)
    assert round_lr({**fed, "lr_decay": 0.5}, 41) == pytest.approx(0.02 * 0.5 ** 40)
    cfg = tiny_cfg(**{"federation.lr": 0.1, "federation.lr_milestones": "[1]", "federation.lr_gamma": 0.2})
    server = Server(cfg, ParamSpec(("w",), ((1,),)), np.zeros(1), ServerContext(4))
    assert "lr" not in server.client_config(1, 0)  # round 1 trains at federation.lr
    assert server.client_config(2, 0)["lr"] == pytest.approx(0.02)
    with pytest.raises(ConfigError, match="federation.lr_milestones"):
        load_config(None, ["federation.lr_milestones=[60, 40]"])
