"""Client selection: SFedCA (firing-rate credit), DivFL (facility location), FedMoS
(double momentum, adaptive selection), and the rounds-to-target / class-coverage
reporting they are judged by."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from torch import nn

from neurofed.algorithms.base import Client, ClientData, FitContext, FitResult, ServerContext
from neurofed.algorithms.divfl import DivFLServer, greedy_facility_location, update_similarity
from neurofed.algorithms.fedmos import (FedMoSClient, FedMoSServer, adaptive_selection,
                                        server_momentum_step, storm_direction)
from neurofed.algorithms.sfedca import SFedCAServer, class_firing_rates, delta_r
from neurofed.config import ConfigError, load_config
from neurofed.training.params import ParamSpec
from neurofed.seeds import seed_for
from neurofed.models.snn import SpikingNet
from neurofed.models.spec import Layer, resolve
from neurofed.plots import class_coverage, coverage_gap
from neurofed.rundir import load_state

from conftest import tiny_overrides

# --------------------------------------------------------------------------- SFedCA

T = 6


def two_layer_net(w1, w2) -> SpikingNet:
    """2 inputs -> dense(2) -> dense(2), no quantization. With current and voltage decay
    1 (no memory) a neuron spikes at a step iff its input current that step is >= the
    threshold (1); SLAYER's delay shift moves each block's output one step later. So a
    neuron driven by a weight of 5 from an active input spikes T-1 times in layer 1 and
    T-2 times in layer 2; an undriven one never."""
    layers = resolve([Layer("flatten"), Layer("dense", 2), Layer("dense", 2)], (2, 1, 1))
    net = SpikingNet(layers, {"quantize": False, "threshold": 1.0, "current_decay": 1.0, "voltage_decay": 1.0})
    p = dict(net.named_parameters())
    with torch.no_grad():
        p["blocks.1.synapse.weight"].copy_(torch.tensor(w1, dtype=torch.float32).reshape(2, 2, 1, 1, 1))
        p["blocks.2.synapse.weight"].copy_(torch.tensor(w2, dtype=torch.float32).reshape(2, 2, 1, 1, 1))
    return net


DIRECT = {"encoding": "direct", "timesteps": T}
# class 0: [1,0] and [1,1]; class 1: [0,1]; class 2: absent
X = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]]).reshape(3, 2, 1, 1)
Y = torch.tensor([0, 0, 1])


def test_firing_rates_and_delta_r_by_hand():
    # Eq. 11: per sample, mean over the 2 layers of spikes / (2 neurons * T).
    # Before (both layers diagonal): [1,0] -> layer counts (5, 4) -> (5/12 + 4/12)/2 = 0.375;
    # [1,1] -> (10, 8) -> 0.75; [0,1] -> (5, 4) -> 0.375.
    # R_before = [(0.375 + 0.75)/2, 0.375, 0] = [0.5625, 0.375, 0].
    before = class_firing_rates(two_layer_net([[5, 0], [0, 5]], [[5, 0], [0, 5]]), X, Y, 3, DIRECT, seed=1)
    np.testing.assert_allclose(before, [0.5625, 0.375, 0.0], rtol=0, atol=1e-12)
    # After: layer-1 neuron 0 listens to both inputs, neuron 1 to input 0:
    # [1,0] -> (10, 8) -> 0.75; [1,1] -> 0.75; [0,1] -> (5, 4) -> 0.375. R_after = [0.75, 0.375, 0].
    after = class_firing_rates(two_layer_net([[5, 5], [5, 0]], [[5, 0], [0, 5]]), X, Y, 3, DIRECT, seed=1)
    np.testing.assert_allclose(after, [0.75, 0.375, 0.0], rtol=0, atol=1e-12)
    # Eq. 12: (0.75 - 0.5625)^2 = 0.03515625; unchanged and absent classes add nothing.
    assert delta_r(before, after) == pytest.approx(0.03515625, abs=1e-12)


def test_rate_pass_changes_nothing_and_is_one_forward_pass(tiny_cfg):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg())
    model = exp.new_model()
    data = exp.client_data(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    out = model(torch.rand(4, *exp.dataset.input_shape, 4))
    nn.functional.cross_entropy(model.readout(out), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()  # optimizer now has state (step, exp_avg, exp_avg_sq)
    model.train()
    params = copy.deepcopy(model.state_dict())
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt_state = copy.deepcopy(opt.state_dict())
    rng = torch.random.get_rng_state()
    seen = []
    model.register_forward_pre_hook(lambda m, inp: seen.append(inp[0].shape[0]))

    class_firing_rates(model, data.x, data.y, 10, exp.cfg["data"], seed=3)

    assert sum(seen) == len(data.y)  # one pass over the client's data
    assert model.training
    for k, v in model.state_dict().items():
        assert torch.equal(v, params[k]), k
    for n, p in model.named_parameters():
        if n in grads:
            assert torch.equal(p.grad, grads[n]), n
    after = opt.state_dict()
    assert after["param_groups"] == opt_state["param_groups"]
    for i, st in opt_state["state"].items():
        for k, v in st.items():
            assert torch.equal(after["state"][i][k], v), (i, k)
    assert torch.equal(torch.random.get_rng_state(), rng)


def test_sfedca_client_reports_delta_r_of_global_vs_trained(tiny_cfg):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3}))
    data = exp.client_data(1)
    config = exp.server.client_config(1, 1)
    params, n, metrics = exp.client.fit(FitContext(exp.server.message(), config, data))
    seed = seed_for(config["seed"], "rates")
    model = exp.new_model()
    exp.spec.set(model, exp.server.params)
    r0 = class_firing_rates(model, data.x, data.y, 10, exp.cfg["data"], seed)
    exp.spec.set(model, exp.spec.pack(params))
    r1 = class_firing_rates(model, data.x, data.y, 10, exp.cfg["data"], seed)
    assert metrics["delta_r"] == pytest.approx(delta_r(r0, r1), rel=1e-12, abs=1e-15)
    assert metrics["delta_r"] > 0

    seeded = Experiment(tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3,
                                    "algorithm.rate_noise": 0.05, "federation.privacy_noise": "seeded_not_private"}))
    _, _, m1 = seeded.client.fit(FitContext(seeded.server.message(), config, data))
    _, _, m2 = seeded.client.fit(FitContext(seeded.server.message(), config, data))
    assert m1["delta_r"] == m2["delta_r"] != metrics["delta_r"]  # seeded noise on the rates
    private = Experiment(tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3,
                                     "algorithm.rate_noise": 0.05}))
    _, _, m3 = private.client.fit(FitContext(private.server.message(), config, data))
    _, _, m4 = private.client.fit(FitContext(private.server.message(), config, data))
    assert len({m1["delta_r"], m3["delta_r"], m4["delta_r"]}) == 3  # OS entropy: never the same noise


def _spec(size=3):
    return ParamSpec(("w",), ((size,),))


def _cfg(p=2, weighting="uniform"):
    return {"seed": 0, "federation": {"clients_per_round": p},
            "algorithm": {"name": "sfedca", "candidates": 4, "weighting": weighting}}


def test_sfedca_server_aggregates_the_top_p_by_delta_r():
    server = SFedCAServer(_cfg(), _spec(), np.zeros(3), ServerContext(10))
    assert len(server.configure(1)) == 4  # the candidate set
    results = [FitResult(3, np.full(3, 1.0, np.float32), 10, {"delta_r": 0.2}),
               FitResult(5, np.full(3, 2.0, np.float32), 30, {"delta_r": 0.9}),
               FitResult(7, np.full(3, 4.0, np.float32), 50, {"delta_r": 0.1}),
               FitResult(8, np.full(3, 8.0, np.float32), 10, {"delta_r": 0.5})]
    metrics = server.aggregate(1, results)
    assert metrics["aggregated"] == [5, 8]
    np.testing.assert_allclose(server.params, np.full(3, 5.0))  # plain average of 2 and 8 (Alg. 1)
    weighted = SFedCAServer(_cfg(weighting="samples"), _spec(), np.zeros(3), ServerContext(10))
    weighted.aggregate(1, results)
    np.testing.assert_allclose(weighted.params, np.full(3, (30 * 2 + 10 * 8) / 40))  # Eq. 6


def test_sfedca_candidates_are_checked():
    with pytest.raises(ConfigError, match=r"algorithm.candidates: got 2; expected federation.clients_per_round \(2\)"):
        load_config(None, tiny_overrides(**{"algorithm.name": "sfedca", "algorithm.candidates": 2}))
    with pytest.raises(ConfigError, match="partition.num_clients"):
        load_config(None, tiny_overrides(**{"algorithm.name": "sfedca", "algorithm.candidates": 5}))


# --------------------------------------------------------------------------- DivFL

SIM = np.array([[5, 3, 2, 0, 0, 0],
                [3, 5, 1, 0, 1, 0],
                [2, 1, 5, 0, 0, 0],
                [0, 0, 0, 5, 3, 1],
                [0, 1, 0, 3, 5, 3],
                [0, 0, 0, 1, 3, 5]], dtype=float)


def test_greedy_facility_location_by_hand():
    # F({j}) = column sums 10, 10, 8, 9, 12, 9 -> 4. Then gains over best=[0,1,0,3,5,3]:
    # j=0: 9, j=1: 8, j=2: 7, j=3: 2, j=5: 2 -> 0. Then over [5,3,2,3,5,3]:
    # j=1: 2, j=2: 3, j=3: 2, j=5: 2 -> 2 (not 1, whose column sum is larger: diversity).
    assert greedy_facility_location(SIM, 3) == [4, 0, 2]
    assert greedy_facility_location(SIM, 1, ground=[1, 2, 3, 5]) == [1]
    picks = greedy_facility_location(SIM, 10)  # budget above the ground set: every column once
    assert picks[:3] == [4, 0, 2] and sorted(picks) == list(range(6))


def test_update_similarity_is_max_distance_minus_distance():
    sim = update_similarity(np.array([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0]]))
    d = np.array([[0, 5, 1], [5, 0, np.sqrt(18)], [1, np.sqrt(18), 0]])
    np.testing.assert_allclose(sim, 5.0 - d, atol=1e-12)


def test_divfl_server_fills_its_table_then_picks_diverse_clients():
    cfg = {"seed": 0, "federation": {"clients_per_round": 2}, "algorithm": {"name": "divfl"}}
    server = DivFLServer(cfg, ParamSpec(("w",), ((2,),)), np.zeros(2), ServerContext(5))
    assert [c for c, _ in server.configure(1)] == [0, 1, 2, 3, 4]  # round 1: everyone
    ups = {0: [1.0, 0.0], 1: [1.1, 0.0], 2: [0.9, 0.1], 3: [0.0, 1.0], 4: [0.0, 1.2]}
    results = [FitResult(c, np.array(u, np.float32), 10, {}) for c, u in ups.items()]
    metrics = server.aggregate(1, results)
    agg = metrics["aggregated"]
    assert len(agg) == 2 and len(set(agg) & {0, 1, 2}) == 1 and len(set(agg) & {3, 4}) == 1
    np.testing.assert_allclose(server.params, np.mean([ups[c] for c in agg], 0), atol=1e-6)
    np.testing.assert_allclose(server.updates[4], [0.0, 1.2])  # Δ_k = w_k − w (w was 0)
    # Round 2 selects on the stored (stale) updates, before anyone trains.
    chosen = [c for c, _ in server.configure(2)]
    assert len(chosen) == 2 and len(set(chosen) & {0, 1, 2}) == 1 and len(set(chosen) & {3, 4}) == 1


def test_divfl_weights_its_picks_by_n_k_or_uniformly_as_asked():
    from neurofed.config import ConfigError, load_config
    from conftest import tiny_overrides

    ups = {0: [1.0, 0.0], 1: [0.0, 1.0]}
    sizes = {0: 30, 1: 10}
    means = {}
    for weighting in ("samples", "uniform"):
        cfg = {"seed": 0, "federation": {"clients_per_round": 2}, "algorithm": {"name": "divfl", "weighting": weighting}}
        server = DivFLServer(cfg, ParamSpec(("w",), ((2,),)), np.zeros(2), ServerContext(2))
        server.aggregate(1, [FitResult(c, np.array(u, np.float32), sizes[c], {}) for c, u in ups.items()])
        means[weighting] = server.params
    np.testing.assert_allclose(means["samples"], [0.75, 0.25], atol=1e-6)  # 30 of 40 samples
    np.testing.assert_allclose(means["uniform"], [0.5, 0.5], atol=1e-6)
    assert load_config(None, tiny_overrides(**{"algorithm.name": "divfl"}))["algorithm"]["weighting"] == "samples"
    with pytest.raises(ConfigError, match=r"algorithm.weighting: got 'equal'; allowed: samples, uniform"):
        load_config(None, tiny_overrides(**{"algorithm.name": "divfl", "algorithm.weighting": "equal"}))


# --------------------------------------------------------------------------- FedMoS


def test_storm_direction_and_server_momentum_by_hand():
    g, g_prev, d_prev = torch.tensor([1.0, 2.0]), torch.tensor([0.5, 1.0]), torch.tensor([2.0, 2.0])
    # d = g + (1 - a)(d_prev - g_prev) = [1, 2] + 0.75 * [1.5, 1.0]
    assert torch.allclose(storm_direction(g, g_prev, d_prev, a=0.25), torch.tensor([2.125, 2.75]))
    assert torch.equal(storm_direction(g, None, None, a=0.25), g)  # d_0 = g_0
    assert torch.equal(storm_direction(g, g_prev, d_prev, a=1.0), g)  # a = 1: plain gradient
    # u = 0.5 * [0.2, -0.2] + [0.1, 0.3] = [0.2, 0.2]; w = [1, 1] + u
    w, u = server_momentum_step(np.array([1.0, 1.0]), np.array([0.2, -0.2]), np.array([0.1, 0.3]), beta=0.5)
    np.testing.assert_allclose(u, [0.2, 0.2], atol=1e-7)
    np.testing.assert_allclose(w, [1.2, 1.2], atol=1e-7)


def test_fedmos_server_keeps_the_first_rounds_move_out_of_its_momentum():
    # The authors' main_fed.py, iter == 0: w += Δ and u stays 0; from round 2, u = β u + Δ, w += u.
    # Had round 1's Δ entered u, round 2 would repeat it β-scaled and end at [1.5, 1.0].
    cfg = {"seed": 0, "federation": {"clients_per_round": 1}, "algorithm": {"name": "fedmos", "beta": 0.5}}
    server = FedMoSServer(cfg, ParamSpec(("w",), ((2,),)), np.zeros(2), ServerContext(1))
    for rnd, move, expected in [(1, [1.0, 0.0], [1.0, 0.0]), (2, [0.0, 1.0], [1.0, 1.0]),
                                (3, [0.0, 1.0], [1.0, 2.5])]:  # round 3: u = 0.5 [0, 1] + [0, 1]
        server.configure(rnd)
        server.aggregate(rnd, [FitResult(0, (server.params + np.array(move)).astype(np.float32), 10, {})])
        np.testing.assert_allclose(server.params, expected, atol=1e-6)


class Linear(nn.Module):
    """A tiny non-spiking model the training loop can drive (kind 'ann': input as is)."""

    kind = "ann"

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2, bias=False)

    def forward(self, x):
        return self.fc(x)

    def readout(self, out):
        return out


def _fedmos_cfg(a, mu, epochs=2, estimator="storm"):
    return {"federation": {"rounds": 1, "local_epochs": epochs, "batch_size": 2, "optimizer": "sgd", "lr": 0.1,
                           "momentum": 0.0, "weight_decay": 0.0},
            "data": {"encoding": "direct", "timesteps": 1},
            "algorithm": {"a": a, "mu": mu, "beta": 0.0, "estimator": estimator}}


def _linear_data():
    g = torch.Generator().manual_seed(0)
    return ClientData(0, torch.randn(4, 3, generator=g), torch.tensor([0, 1, 1, 0]), 2)


def test_fedmos_client_follows_the_storm_recursion():
    a, mu, lr, seed = 0.3, 0.05, 0.1, 11
    spec = ParamSpec.from_model(Linear())
    w = torch.tensor([[0.2, -0.1, 0.3], [0.0, 0.4, -0.2]])
    data = _linear_data()
    client = FedMoSClient(_fedmos_cfg(a, mu), spec, Linear)
    params, _, _ = client.fit(FitContext({"fc.weight": w.numpy()}, {"seed": seed}, data))

    def grad(x, idx):
        x = x.clone().requires_grad_(True)
        nn.functional.cross_entropy(data.x[idx] @ x.T, data.y[idx]).backward()
        return x.grad

    gen = torch.Generator().manual_seed(seed)  # the loop's shuffling stream
    x, prev, d = w.clone(), None, None
    for _ in range(2):
        order = torch.randperm(4, generator=gen)
        for idx in (order[:2], order[2:]):
            g = grad(x, idx)
            d = g if d is None else g + (1 - a) * (d - grad(prev, idx))
            prev = x
            x = x - lr * d - mu * (x - w)
    np.testing.assert_allclose(params["fc.weight"], x.numpy(), rtol=1e-5, atol=1e-6)


def test_fedmos_client_follows_the_authors_recursion_under_estimator_authors():
    """The authors' FedMosOptimizer: the difference takes the previous step's own gradient,
    zero over the first step, so d_t = g_t + (1 − a)^t g_0 (one pass a step)."""
    a, mu, lr, seed = 0.3, 0.05, 0.1, 11
    spec = ParamSpec.from_model(Linear())
    w = torch.tensor([[0.2, -0.1, 0.3], [0.0, 0.4, -0.2]])
    data = _linear_data()
    client = FedMoSClient(_fedmos_cfg(a, mu, estimator="authors"), spec, Linear)
    params, _, _ = client.fit(FitContext({"fc.weight": w.numpy()}, {"seed": seed}, data))

    def grad(x, idx):
        x = x.clone().requires_grad_(True)
        nn.functional.cross_entropy(data.x[idx] @ x.T, data.y[idx]).backward()
        return x.grad

    gen = torch.Generator().manual_seed(seed)
    x, d, stored, first = w.clone(), None, torch.zeros_like(w), None
    for _ in range(2):
        order = torch.randperm(4, generator=gen)
        for idx in (order[:2], order[2:]):
            g = grad(x, idx)
            d, stored = (g, torch.zeros_like(g)) if d is None else (g + (1 - a) * (d - stored), g)
            first = g if first is None else first
            x = x - lr * d - mu * (x - w)
    torch.testing.assert_close(d, g + (1 - a) ** 3 * first)  # the closed form, 4 steps
    np.testing.assert_allclose(params["fc.weight"], x.numpy(), rtol=1e-5, atol=1e-6)


def test_fedmos_client_at_a1_mu0_is_fedavg():
    spec = ParamSpec.from_model(Linear())
    msg = {"fc.weight": np.array([[0.2, -0.1, 0.3], [0.0, 0.4, -0.2]], np.float32)}
    data = _linear_data()
    ours, _, _ = FedMoSClient(_fedmos_cfg(1.0, 0.0), spec, Linear).fit(FitContext(msg, {"seed": 5}, data))
    plain, _, _ = Client(_fedmos_cfg(1.0, 0.0), spec, Linear).fit(FitContext(msg, {"seed": 5}, data))
    np.testing.assert_array_equal(ours["fc.weight"], plain["fc.weight"])
    other, _, _ = FedMoSClient(_fedmos_cfg(0.3, 0.0), spec, Linear).fit(FitContext(msg, {"seed": 5}, data))
    assert not np.allclose(other["fc.weight"], plain["fc.weight"])


def test_adaptive_selection_slices():
    rng = np.random.default_rng(0)
    # p = [0.2, 0.5, 0.3], m = 2: sorted [0.5 (c1), 0.3 (c2), 0.2 (c0)] on [0, 2): edges 0, 1, 1.6, 2.
    # Draw 0 = slice [0, 1) -> always client 1; draw 1 = [1, 2) -> client 2 w.p. 0.6, client 0 w.p. 0.4.
    draws = np.array([adaptive_selection(np.array([0.2, 0.5, 0.3]), 2, rng) for _ in range(4000)])
    assert (draws[:, 1] == 1).all() and (draws.sum(1) == 2).all()
    assert draws[:, 2].mean() == pytest.approx(0.6, abs=0.03)
    # A client whose share exceeds 1/m can be drawn twice; E[count] = m p.
    draws = np.array([adaptive_selection(np.array([70, 20, 10]), 2, rng) for _ in range(4000)])
    np.testing.assert_allclose(draws.mean(0), [1.4, 0.4, 0.2], atol=0.03)


# --------------------------------------------------------------------------- reporting


def test_rounds_to_target_is_the_first_round_at_or_above_target(tiny_cfg):
    from neurofed.fl.summary import summarize

    hist = [{"round": r, "accuracy": a, "bytes_up": 0, "bytes_down": 0, "failed": [], "loss": 1.0}
            for r, a in enumerate([0.3, 0.79, 0.8, 0.6, 0.9], start=1)]
    cfg = tiny_cfg(**{"federation.target_accuracy": 0.8})
    assert summarize(hist, cfg, 0.0)["rounds_to_target"] == 3
    cfg = tiny_cfg(**{"federation.target_accuracy": 0.95})
    assert summarize(hist, cfg, 0.0)["rounds_to_target"] is None


def test_class_coverage_by_hand():
    counts = [[4, 0, 0], [0, 2, 2], [1, 1, 0]]
    hist = [{"round": 1, "trained": [0, 1, 2], "aggregated": [0]},  # aggregated wins over trained
            {"round": 2, "trained": [1, 2]},  # no 'aggregated': all trained clients entered
            {"round": 3, "aggregated": [0, 1]}]
    cov = class_coverage(hist, counts)
    assert cov["rounds"] == [1, 2, 3]
    np.testing.assert_allclose(cov["proportions"][0], [1, 0, 0])
    np.testing.assert_allclose(cov["proportions"][1], [5 / 10, 3 / 10, 2 / 10])  # [4,0,0]+[0,2,2]+[1,1,0]
    np.testing.assert_allclose(cov["proportions"][2], [9 / 18, 5 / 18, 4 / 18])  # + [4,0,0] + [0,2,2]
    np.testing.assert_allclose(cov["global"], [5 / 10, 3 / 10, 2 / 10])
    gap = coverage_gap(cov)  # total variation ½ Σ_c |p_c − q_c| of the final share
    assert gap["tv_to_train_set"] == pytest.approx(0.5 * (0 + abs(5 / 18 - 0.3) + abs(4 / 18 - 0.2)))
    third = 1 / 3
    assert gap["tv_to_uniform"] == pytest.approx(0.5 * (abs(9 / 18 - third) + abs(5 / 18 - third) + abs(4 / 18 - third)))


def test_coverage_command(tmp_path, capsys):
    from neurofed.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "partition.json").write_text(json.dumps({"label_counts": [[4, 0], [0, 2]]}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"round": r, "aggregated": [r - 1]}) + "\n"
                                               for r in (1, 2)))
    assert main(["coverage", str(run), "--out", str(tmp_path / "cov.png")]) == 0
    assert (tmp_path / "cov.png").is_file()
    assert "| run | 2 | 67 33 |" in capsys.readouterr().out
    assert main(["coverage", str(tmp_path / "missing"), "--out", str(tmp_path / "x.png")]) == 2
    assert "missing: no such folder" in capsys.readouterr().err
    (run / "config.yaml").write_text("- a list, not a run's config\n")  # a label only: the name stays
    assert main(["coverage", str(run), "--out", str(tmp_path / "cov2.png")]) == 0
    assert "| run | 2 | 67 33 |" in capsys.readouterr().out


# --------------------------------------------------------------------------- runs


@pytest.mark.parametrize("extra", [{"algorithm.name": "divfl"}, {"algorithm.name": "fedmos"}])
def test_resume_is_exact_and_run_writes_coverage(tmp_path, tiny_cfg, extra):
    """The stateful servers (DivFL's update table, FedMoS's momentum) resume exactly."""
    from neurofed.pipeline import run

    cfg = tiny_cfg(**{"federation.rounds": 2, "partition.scheme": "dirichlet", **extra})
    full = run(cfg, tmp_path / "full", progress=False, after=False)
    run(tiny_cfg(**{"federation.rounds": 1, "partition.scheme": "dirichlet", **extra}), tmp_path / "part",
        progress=False, after=False)
    resumed = run(cfg, tmp_path / "part", resume=True, progress=False, after=False)
    assert resumed["final_accuracy"] == full["final_accuracy"]
    lines = [json.loads(l) for l in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert all(len(h["aggregated"]) <= 2 for h in lines)
    assert (tmp_path / "full" / "plots" / "class_coverage.png").is_file()
    cov = json.loads((tmp_path / "full" / "class_coverage.json").read_text())
    assert len(cov["proportions"]) == 2 and sum(cov["proportions"][-1]) == pytest.approx(1.0)
    sa = load_state(tmp_path / "full" / "checkpoint.npz", "checkpoint")["server"]
    sb = load_state(tmp_path / "part" / "checkpoint.npz", "checkpoint")["server"]
    for k in sa:
        np.testing.assert_array_equal(np.asarray(sa[k]), np.asarray(sb[k]))


def test_divfl_round_one_straggler_stays_in_the_ground_set():
    # Client 3 straggled in round 1 (no update: Δ_3 = 0). Updates 0: (1, 0), 1: (1, 0),
    # 2: (1, 0.1). Distances to 3: 1, 1, √1.01; C = √1.01. Greedy P = 2: column sums of
    # sim pick 0 first (4C − 1.1); then client 3 gains C − (C − 1) = 1 on its own row,
    # client 2 only 0.1 on row 2, so S = {0, 3}. Selecting among repliers only gave {0, 2}.
    cfg = {"seed": 0, "federation": {"clients_per_round": 2}, "algorithm": {"name": "divfl"}}
    server = DivFLServer(cfg, ParamSpec(("w",), ((2,),)), np.zeros(2), ServerContext(4))
    ups = {0: [1.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 0.1]}
    server.aggregate(1, [FitResult(c, np.array(u, np.float32), 10, {}) for c, u in ups.items()])
    assert [c for c, _ in server.configure(2)] == [0, 3]


def test_sfedca_rates_average_the_weight_layers_only_by_default():
    # Eq. 11's L layers are those of W = (w^1..w^L): conv and FC; SLAYER's pool has neurons too.
    from neurofed.algorithms.sfedca import rate_layer_mask
    from neurofed.training.local import forward_dataset

    layers = resolve([Layer("conv", 2, kernel=3, padding=1), Layer("pool", kernel=2, stride=2), Layer("flatten"),
                      Layer("dense", 3)], (1, 4, 4))
    torch.manual_seed(0)
    net = SpikingNet(layers, {"quantize": False, "threshold": 0.5, "current_decay": 1.0, "voltage_decay": 1.0})
    with torch.no_grad():
        for p in net.parameters():
            p.abs_().mul_(3.0)  # every layer fires
    x, y = torch.rand(6, 1, 4, 4), torch.tensor([0, 0, 1, 1, 2, 2])
    assert rate_layer_mask(net).tolist() == [True, False, True]
    assert rate_layer_mask(net, "all").tolist() == [True, True, True]
    _, spikes = forward_dataset(net, x, DIRECT, 1)
    per_layer = spikes.double() / (torch.tensor(net.neurons_per_layer, dtype=torch.float64) * T)
    assert per_layer[:, 1].sum() > 0 and not torch.allclose(per_layer[:, 1], per_layer[:, [0, 2]].mean(1))
    for mask, name in (([0, 2], "weights"), ([0, 1, 2], "all")):
        expected = per_layer[:, mask].mean(1).reshape(3, 2).mean(1).numpy()
        np.testing.assert_allclose(class_firing_rates(net, x, y, 3, DIRECT, 1, name), expected, rtol=1e-12)
