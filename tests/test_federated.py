"""Federated core: parameter packing, FedAvg aggregation, stragglers, failures, resume."""

import json

import numpy as np
import pytest
import torch

from neurofed.algorithms.base import FitResult, weighted_average
from neurofed.training.params import ParamSpec
from neurofed.models import build_model, model_names
from neurofed.rundir import load_state


@pytest.mark.parametrize("name", ["mlp", "cnn", "vgg5", "svgg9"])
def test_zoo_models_build_run_and_pack(name):
    shape = (3, 32, 32) if name in ("vgg5", "svgg9") else (1, 8, 8)
    cfg = {"name": name, "width": 0.125}
    snn = build_model(cfg, shape, 10)
    out = snn(torch.zeros(2, *shape, 3))
    assert out.shape == (2, 10, 3)
    ann = build_model({**cfg, "kind": "ann"}, shape, 10)
    assert ann(torch.zeros(2, *shape)).shape == (2, 10)
    # Same topology: the twin has the same weight shapes, layer by layer.
    snn_w = [p.shape[:2] for n, p in snn.named_parameters() if "weight" in n]
    ann_w = [p.shape[:2] for n, p in ann.named_parameters() if "weight" in n]
    assert [tuple(s) for s in snn_w if s[0] != s[1] or True][: len(ann_w)] or ann_w

    spec = ParamSpec.from_model(snn)
    flat = spec.get(snn)
    assert flat.shape == (spec.size,) and flat.dtype == np.float32
    assert np.array_equal(spec.pack(spec.unpack(flat)), flat)
    other = build_model(cfg, shape, 10)
    spec.set(other, flat)
    assert np.array_equal(spec.get(other), flat)


def test_width_multiplier_scales_hidden_layers_only():
    small = build_model({"name": "cnn", "width": 0.5}, (1, 8, 8), 10)
    full = build_model({"name": "cnn", "width": 1.0}, (1, 8, 8), 10)
    assert small.layers[0].out * 2 == full.layers[0].out
    assert small.layers[-1].out == full.layers[-1].out == 10
    assert small.layers[0].in_shape == full.layers[0].in_shape


def test_pack_rejects_wrong_shapes():
    spec = ParamSpec(("a", "b"), ((2, 3), (4,)))
    with pytest.raises(ValueError, match="'a'"):
        spec.pack({"a": np.zeros((3, 2)), "b": np.zeros(4)})
    with pytest.raises(KeyError):
        spec.pack({"a": np.zeros((2, 3))})


def test_fedavg_of_identical_updates_is_unchanged():
    w = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    results = [FitResult(i, w.copy(), n, {}) for i, n in enumerate([5, 17, 40])]
    np.testing.assert_allclose(weighted_average(results), w, rtol=1e-6, atol=1e-7)


def test_fedavg_weights_by_sample_count():
    a, b = np.zeros(4, np.float32), np.ones(4, np.float32)
    out = weighted_average([FitResult(0, a, 30, {}), FitResult(1, b, 10, {})])
    np.testing.assert_allclose(out, 0.25)


def test_fedavg_server_takes_the_plain_mean_under_uniform_weighting_and_n_k_by_default():
    from neurofed.algorithms import get_algorithm_class
    from neurofed.algorithms.base import ServerContext
    from neurofed.config import ConfigError, load_config
    from conftest import tiny_overrides

    spec = ParamSpec(("w",), ((4,),))
    replies = [FitResult(0, np.zeros(4, np.float32), 30, {}), FitResult(1, np.ones(4, np.float32), 10, {})]
    means = {}
    for weighting in ("samples", "uniform"):
        cfg = load_config(None, tiny_overrides(**{"algorithm.name": "fedavg", "algorithm.weighting": weighting}))
        server = get_algorithm_class("fedavg").Server(cfg, spec, np.zeros(4), ServerContext(cfg["partition"]["num_clients"]))
        server.aggregate(1, replies)
        means[weighting] = server.params
    np.testing.assert_allclose(means["samples"], 0.25)  # n_k: 10 of 40 samples hold the ones
    np.testing.assert_allclose(means["uniform"], 0.5)  # FedLab's SyncServerHandler
    assert load_config(None, tiny_overrides(**{"algorithm.name": "fedavg"}))["algorithm"]["weighting"] == "samples"
    with pytest.raises(ConfigError, match=r"algorithm.weighting: got 'equal'; allowed: samples, uniform"):
        load_config(None, tiny_overrides(**{"algorithm.name": "fedavg", "algorithm.weighting": "equal"}))
    with pytest.raises(ConfigError, match=r"algorithm.weighting: unknown key for fednova"):  # its p_i are its own
        load_config(None, tiny_overrides(**{"algorithm.name": "fednova", "algorithm.weighting": "uniform"}))


def test_straggler_rule_keeps_one_and_drops_each_other_with_q(tiny_cfg):
    # FedSNN Sec. IV-D: one of the P always replies, each of the other P − 1 drops with q.
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"federation.straggler_prob": 1.0}))
    for rnd in range(1, 20):
        alive = exp.survivors(rnd, [0, 1, 2])
        assert len(alive) == 1 and set(alive) <= {0, 1, 2}
    # q = 0.75, P = 4: E = 1 + 3 · 0.25 = 1.75. The former rule (every client drops with q,
    # one revived if all drop) gives 4 · 0.25 + 0.75^4 = 1.32.
    exp = Experiment(tiny_cfg(**{"federation.straggler_prob": 0.75}))
    kept = [len(exp.survivors(r, list(range(4)))) for r in range(1, 2001)]
    assert min(kept) >= 1 and abs(np.mean(kept) - 1.75) < 0.06
    exp = Experiment(tiny_cfg())
    assert exp.survivors(1, [3, 1]) == [3, 1]


def test_only_selected_clients_train(tiny_cfg, tmp_path):
    from neurofed.pipeline import run

    run(tiny_cfg(**{"partition.num_clients": 5, "federation.clients_per_round": 2}), tmp_path, progress=False)
    for line in (tmp_path / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        assert len(rec["selected"]) == 2 and rec["trained"] == rec["selected"]
        assert rec["bytes_up"] == 2 * rec["bytes_down"] // 2


def test_failing_or_nonfinite_client_is_dropped(tiny_cfg, tmp_path, monkeypatch):
    from neurofed.algorithms.base import Client
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"partition.num_clients": 3, "federation.clients_per_round": 3}))
    real_fit = Client.fit

    def flaky(self, ctx):
        if ctx.data.cid == 0:
            raise RuntimeError("device out of memory")
        out, n, metrics = real_fit(self, ctx)
        if ctx.data.cid == 1:
            out = {k: np.full_like(v, np.nan) for k, v in out.items()}
        return out, n, metrics

    monkeypatch.setattr(Client, "fit", flaky)
    rec = exp.run_round(1)
    assert rec["trained"] == [2]
    assert {f["client"] for f in rec["failed"]} == {0, 1}
    assert "out of memory" in rec["failed"][0]["error"]
    assert np.all(np.isfinite(exp.server.params))
    # The global model is exactly client 2's update (the only one aggregated).
    assert np.array_equal(exp.server.params, exp.last_results[0].params)


def test_resume_gives_exactly_the_uninterrupted_result(tiny_cfg, tmp_path):
    from neurofed.pipeline import run
    from neurofed.rundir import CHECKPOINT

    cfg = tiny_cfg(**{"federation.rounds": 3, "federation.straggler_prob": 0.3, "federation.update_noise": 0.01})
    run(cfg, tmp_path / "full", progress=False)
    # "Kill" after round 1: run only 1 round, then resume to 3.
    short = json.loads(json.dumps(cfg))
    short["federation"]["rounds"] = 1
    run(short, tmp_path / "cut", progress=False)
    run(cfg, tmp_path / "cut", resume=True, progress=False)
    full = load_state(tmp_path / "full" / CHECKPOINT, "checkpoint")["server"]["params"]
    cut = load_state(tmp_path / "cut" / CHECKPOINT, "checkpoint")["server"]["params"]
    assert np.array_equal(full, cut)
    lines = (tmp_path / "cut" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(l)["round"] for l in lines] == [1, 2, 3]


def test_run_writes_the_documented_files(tiny_cfg, tmp_path):
    from neurofed.pipeline import run

    summary = run(tiny_cfg(), tmp_path, progress=False)
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoint.npz", "plots/accuracy.png"):
        assert (tmp_path / name).exists(), name
    for key in ("final_accuracy", "best_accuracy", "rounds", "wall_time_s", "rounds_to_target"):
        assert key in summary
    rec = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    for key in ("round", "accuracy", "loss", "selected", "bytes_up", "bytes_down", "wall_time_s", "firing_rate"):
        assert key in rec
    assert 0 < rec["firing_rate"] < 1


def test_encoders():
    from neurofed.data.encoding import encode

    x = torch.tensor([[[[0.0, 1.0], [0.5, 0.25]]]])
    direct = encode(x, "direct", 5)
    assert direct.shape == (1, 1, 2, 2, 5) and torch.all(direct[..., 3] == x)
    g = torch.Generator().manual_seed(0)
    rate = encode(x.expand(2000, 1, 2, 2), "rate", 10, g)
    assert set(rate.unique().tolist()) <= {0.0, 1.0}
    means = rate.mean(dim=(0, 4))[0]
    assert torch.allclose(means, x[0, 0], atol=0.02)
    with pytest.raises(ValueError, match="allowed: rate, direct, events"):
        encode(x, "poisson", 4)


def test_model_names_listed():
    assert {"mlp", "cnn", "vgg5", "svgg9"} <= set(model_names())
