"""netx export, hardware constraint check and Lava runs (neurofed.deploy).

The Lava tests run the real netx network in Lava's fixed_pt CPU simulator and
compare it with the SLAYER model spike for spike (per-layer raster checksums).
"""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from neurofed.config import DEFAULTS
from neurofed.deploy import DeployError
from neurofed.deploy.constraints import check_model, load_profile
from neurofed.deploy.export import export_model, fresh_copy, load_global_model, read_net
from neurofed.deploy.lava_procs.streaming import raster_weights
from neurofed.deploy.lava_run import (check_encoding, input_spikes, layer_seeds, predict, run_config,
                                      simulate, torch_reference)
from neurofed.models import build_model
from neurofed.models.snn import SpikingNet
from neurofed.models.spec import Layer, resolve

RATE = {"encoding": "rate", "timesteps": 12, "max_rate": 1.0}


def tiny_model(name: str, **cfg) -> SpikingNet:
    """A zoo model on 1x8x8 input, width 0.25 for the VGGs, a low threshold so that
    random weights make every layer spike."""
    torch.manual_seed(0)
    model_cfg = {**DEFAULTS["model"], "name": name, "width": 0.25 if name in ("vgg5", "svgg9") else 1.0,
                 "threshold": 0.5, **cfg}
    return build_model(model_cfg, (1, 8, 8), 10, logit_scale=10.0).eval()


def random_spikes(n: int, shape=(1, 8, 8), data_cfg=RATE, seed=1) -> np.ndarray:
    x = np.random.default_rng(seed).random((n, *shape)).astype(np.float32)
    return input_spikes(x, data_cfg, seed)[0]


def assert_round_trip(model, spikes, path, seed=7):
    export_model(model, path)
    read_net(path, model)  # the file holds exactly this model's layers
    lava, timing = simulate(path, spikes, seed, progress=False)
    ref = torch_reference(model, spikes, seed)
    n, k = len(spikes), model.layers[-1].out
    assert lava.output.shape == (n, k)
    assert lava.counts.shape == (n, len(model.neurons_per_layer))
    assert ref.counts[:, :-1].min() > 0, "test input too weak: some hidden layer never spikes"
    np.testing.assert_array_equal(lava.counts, ref.counts)
    np.testing.assert_array_equal(lava.checksums, ref.checksums)  # same spikes at the same neurons and steps
    np.testing.assert_array_equal(lava.output, ref.output)
    np.testing.assert_array_equal(lava.predictions, ref.predictions)
    shapes = [tuple(layer.out_shape) for layer in model.layers if layer.has_neurons]
    for a, b, shape in zip(lava.neuron_totals, ref.neuron_totals, shapes):  # per neuron, torch's (C, H, W)
        assert a.shape == shape
        np.testing.assert_array_equal(a, b)
    assert timing["compile_s"] > 0 and timing["samples_per_s"] > 0
    return lava


# ----------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("name, width", [("mlp", 1.0), ("cnn", 1.0), ("vgg5", 0.25), ("vgg5", 1.0),
                                         pytest.param("svgg9", 0.25, marks=pytest.mark.slow),
                                         pytest.param("svgg9", 1.0, marks=pytest.mark.slow)])
def test_zoo_model_runs_spike_for_spike_in_lava(name, width, tmp_path):
    model = tiny_model(name, width=width)
    t = 32 if name == "svgg9" else 12  # its 12 layers need more steps than that to reach the output
    # three samples back to back: the second and third start right after a busy one
    assert_round_trip(model, random_spikes(3, data_cfg={**RATE, "timesteps": t}), tmp_path / f"{name}.net")


@pytest.mark.parametrize("channels", [128, 131])  # 128: Lava holds groups as int8; 131: prime
def test_pool_over_more_than_127_channels_runs_spike_for_spike(channels, tmp_path):
    # Lava's CPU conv keeps `groups` in an int8: a depthwise pool over 128 channels
    # (vgg5 and hifi_cnn at width 1) went silent until pools were written with fewer groups
    torch.manual_seed(0)
    layers = resolve([Layer("conv", channels, 3, padding=1), Layer("pool", kernel=2, stride=2),
                      Layer("flatten"), Layer("dense", 10)], (1, 4, 4))
    model = SpikingNet(layers, {**DEFAULTS["model"], "name": "wide", "threshold": 0.5}).eval()
    assert_round_trip(model, random_spikes(2, shape=(1, 4, 4)), tmp_path / "wide.net")
    with h5py.File(tmp_path / "wide.net", "r") as h:
        groups = int(h["layer/2/groups"][()])
    assert groups <= 127 and channels % groups == 0


def test_weight_norm_model_round_trips_and_export_leaves_it_intact(tmp_path):
    model = tiny_model("mlp", weight_norm=True)
    spikes = random_spikes(2)
    before = torch_reference(model, spikes, 3)
    assert_round_trip(model, spikes, tmp_path / "wn.net", seed=3)
    # export_hdf5 disables weight norm on what it writes: that must be a copy
    assert all(b.synapse.weight_norm_enabled for b in model.blocks if hasattr(b, "synapse"))
    np.testing.assert_array_equal(torch_reference(model, spikes, 3).checksums, before.checksums)


def hand_net() -> SpikingNet:
    """2 inputs -> dense 2 -> dense 1; no current memory (current_decay 1), no voltage
    leak (voltage_decay 0), threshold 1, weights on SLAYER's 1/32 grid."""
    layers = resolve([Layer("flatten"), Layer("dense", 2), Layer("dense", 1)], (2, 1, 1))
    cfg = {"name": "hand", "threshold": 1.0, "current_decay": 1.0, "voltage_decay": 0.0, "quantize": True}
    model = SpikingNet(layers, cfg).eval()
    with torch.no_grad():
        model.blocks[1].synapse.weight.copy_(torch.tensor([[0.75, 0.0], [0.375, 0.0]]).reshape(2, 2, 1, 1, 1))
        model.blocks[2].synapse.weight.copy_(torch.tensor([[0.75, 0.75]]).reshape(1, 2, 1, 1, 1))
    return model


def test_hand_built_network_gives_hand_computed_spikes(tmp_path):
    t = 8
    a = np.zeros((2, 1, 1, t), np.uint8)
    a[0] = 1  # input 0 spikes every step, input 1 never
    b = np.zeros_like(a)
    b[1] = 1  # only input 1, whose weights are 0: the network must stay silent
    spikes = np.stack([a, a, b])
    # By hand (a block's output is its neuron's spike one step later):
    # layer 0, neuron 0: v = .75, 1.5 -> spikes at 1,3,5,7 -> output at 2,4,6 (8 is past T)
    #          neuron 1: v = .375, .75, 1.125 -> spikes at 2,5 -> output at 3,6
    # layer 1: input .75 at 2,3,4,6 and 1.5 at 6: v = .75, 1.5* | .75, .75, 2.25* -> spikes 3,6 -> output 4,7
    r0 = np.zeros((2, t), np.int64)
    r0[0, [2, 4, 6]] = 1
    r0[1, [3, 6]] = 1
    r1 = np.zeros((1, t), np.int64)
    r1[0, [4, 7]] = 1
    seed = 11
    s0, s1 = layer_seeds(seed, 2)
    # a layer-j counter sums raster x weight from step j+1 on
    checksum = [int((r0 * raster_weights(s0, (2,), t))[:, 1:].sum()),
                int((r1 * raster_weights(s1, (1,), t))[:, 2:].sum())]

    model = hand_net()
    export_model(model, tmp_path / "hand.net")
    lava, _ = simulate(tmp_path / "hand.net", spikes, seed, progress=False)
    np.testing.assert_array_equal(lava.counts, [[5, 2], [5, 2], [0, 0]])
    np.testing.assert_array_equal(lava.checksums, [checksum, checksum, [0, 0]])
    np.testing.assert_array_equal(lava.output, [[2], [2], [0]])
    np.testing.assert_array_equal(lava.neuron_totals[0], [6, 4])
    # and SLAYER agrees with the hand computation too
    np.testing.assert_array_equal(torch_reference(model, spikes, seed).checksums, lava.checksums)


def test_predictions_break_ties_to_the_lowest_label():
    counts = np.array([[3, 5, 5, 1], [0, 0, 0, 0], [2, 1, 2, 2]])
    np.testing.assert_array_equal(predict(counts), [1, 0, 0])
    logits = torch.from_numpy(counts).float() / 16 * 10.0  # the model's readout: rate x logit_scale
    np.testing.assert_array_equal(logits.argmax(1).numpy(), predict(counts))


# ----------------------------------------------------------------------------- inputs


def test_rate_input_is_drawn_once_from_the_seed():
    x = np.random.default_rng(0).random((4, 1, 8, 8)).astype(np.float32)
    s1, notes = input_spikes(x, RATE, 5)
    s2, _ = input_spikes(x, RATE, 5)
    np.testing.assert_array_equal(s1, s2)
    assert s1.shape == (4, 1, 8, 8, 12) and set(np.unique(s1)) <= {0, 1}
    assert not np.array_equal(s1, input_spikes(x, RATE, 6)[0])
    assert notes["input_seed"] == 5


def test_event_input_feeds_lava_as_binary_spikes():
    ev = np.zeros((1, 2, 4, 4, 6), np.float32)
    ev[0, 0, 1, 2, 3] = 3  # a bin holding three events
    ev[0, 1, 0, 0, 0] = 1
    s, notes = input_spikes(ev, {"encoding": "events", "timesteps": 6}, 0)
    np.testing.assert_array_equal(s, ev > 0)
    assert notes["event_bins_clipped"] == 0.5


def test_unknown_encoding_is_refused_and_direct_input_beyond_the_graded_spike_too():
    with pytest.raises(DeployError, match="'phase'.*rate, events, direct"):
        check_encoding({"encoding": "phase"})
    check_encoding({"encoding": "direct"})  # graded spikes (tests/test_lava_mechanisms.py)
    with pytest.raises(DeployError, match="16-bit graded spike.*normalize"):
        input_spikes(np.full((1, 1, 2, 2), 1000.0, dtype=np.float32), {"encoding": "direct", "timesteps": 4}, 0)


def test_too_few_timesteps_for_the_depth_is_refused(tmp_path):
    model = tiny_model("cnn")
    export_model(model, tmp_path / "cnn.net")
    with pytest.raises(DeployError, match="timesteps is 4.*5-layer"):
        simulate(tmp_path / "cnn.net", random_spikes(1, data_cfg={**RATE, "timesteps": 4}), 0, progress=False)


# ----------------------------------------------------------------------------- bad files


def test_corrupted_net_file_gives_a_clear_error(tmp_path):
    model = tiny_model("mlp")
    path = tmp_path / "model.net"
    export_model(model, path)
    path.write_bytes(path.read_bytes()[:300])  # truncated
    with pytest.raises(DeployError, match="not a readable HDF5 file"):
        read_net(path, model)
    path.write_bytes(b"not hdf5 at all")
    with pytest.raises(DeployError, match="not a readable HDF5 file"):
        read_net(path, model)


def test_foreign_or_stale_net_file_gives_a_clear_error(tmp_path):
    path = tmp_path / "foreign.net"
    with h5py.File(path, "w") as h:
        h.create_group("layer/0").create_dataset("type", data=[b"dense"])
    with pytest.raises(DeployError, match="not a network written by `neurofed export`"):
        read_net(path)
    export_model(tiny_model("mlp"), path)
    with pytest.raises(DeployError, match="entry 1 is .*the run's model has.*stale or foreign"):
        read_net(path, tiny_model("cnn"))


# ----------------------------------------------------------------------------- hardware check


def tiny_profile(**limits):
    return {"name": "tiny", "limits": {k: {"value": v, "source": "test"} for k, v in limits.items()}}


def test_constraint_check_counts_cores_and_flags_a_too_large_layer(tmp_path):
    model = tiny_model("cnn")  # conv 16x8x8, pool 16x4x4, conv 32x4x4 (fan-in 144), dense 64, dense 10
    report = check_model(model, tiny_profile(neurons_per_core=256, cores_per_chip=16, chips=1, max_fan_in=100))
    assert [l.cores for l in report.layers] == [4, 1, 2, 1, 1]
    assert [l.fan_in for l in report.layers] == [9, 4, 144, 512, 64]
    assert report.cores == 9 and report.chips == 1
    assert len(report.violations) == 2
    assert "layer 2 (conv 32x4x4): fan-in 144 exceeds 100" in report.violations[0]
    assert "layer 3 (dense 64): fan-in 512" in report.violations[1]
    with pytest.raises(DeployError, match="cannot be mapped to tiny"):
        export_model(model, tmp_path / "x.net", profile=tiny_profile(max_fan_in=100))
    assert not (tmp_path / "x.net").exists()
    # too many cores for the chips
    report = check_model(model, tiny_profile(neurons_per_core=256, cores_per_chip=8, chips=1))
    assert report.violations == ["the network needs 9 cores; 1 chip(s) have 8"]


def test_assumed_limits_only_warn(tmp_path):
    profile = {"name": "guess", "limits": {"max_fan_in": {"value": 100, "assumption": "a guess"}}}
    report = check_model(tiny_model("cnn"), profile)
    assert report.ok and any("fan-in 144 exceeds 100" in w and "assumption" in w for w in report.warnings)
    export_model(tiny_model("cnn"), tmp_path / "ok.net", profile=profile)


def test_weights_beyond_8_bits_are_refused():
    model = tiny_model("mlp")
    with torch.no_grad():
        model.blocks[1].synapse.weight[0, 0] = 6.0  # 6.0 x 64 = 384 > 254
    report = check_model(model, "loihi2")
    assert any("layer 0 (dense 128)" in v and "8-bit" in v for v in report.violations)


def test_blocks_netx_cannot_load_are_refused():
    from neurofed.models.snn import slayer

    model = tiny_model("mlp")
    params = {"threshold": 1.0, "current_decay": 0.25, "voltage_decay": 0.03, "tau_grad": 0.1, "scale_grad": 1.0}
    model.blocks[1] = slayer.block.alif.Dense({**params, "threshold_step": 0.1, "refractory_decay": 0.1,
                                               "threshold_decay": 0.1},
                                              64, 128)
    with pytest.raises(DeployError, match=r"layer 1 \(dense\): block .*alif.Dense does not load in netx"):
        check_model(model).raise_for_violations()


def test_shipped_profiles_have_sourced_limits():
    for name in ("loihi2", "loihi"):
        prof = load_profile(name)
        assert prof.limits["weight_bits"].value == 8 and prof.limits["weight_bits"].sourced
        assert prof.limits["cores_per_chip"].sourced
    with pytest.raises(DeployError, match="profile 'nope' not found"):
        load_profile("nope")


# ----------------------------------------------------------------------------- backends


def test_loihi2_backend_without_lava_loihi_says_what_is_missing():
    from neurofed.compat import lava

    if lava("lava.utils.loihi").is_installed():
        pytest.skip("lava-loihi is installed here")
    with pytest.raises(DeployError, match="lava-loihi.*--backend fixed_pt"):
        run_config("loihi2")
    with pytest.raises(DeployError, match="allowed: fixed_pt, loihi2"):
        run_config("floating_pt")


# ----------------------------------------------------------------------------- a whole run


def test_run_exports_and_runs_on_lava_then_cli_reruns(tmp_path, tiny_cfg, capsys):
    from neurofed.cli import main
    from neurofed.pipeline import run
    from neurofed.seeds import seed_for
    from neurofed.training.local import evaluate

    out = tmp_path / "run"
    cfg = tiny_cfg(export=True, **{"lava.samples": 4})
    run(cfg, out, progress=False)
    assert (out / "model.net").is_file() and (out / "hardware.json").is_file()
    result = json.loads((out / "lava.json").read_text())
    for key in ("accuracy", "torch_accuracy", "agreement", "samples", "layer_spikes", "layer_raster_agreement",
                "samples_per_s", "compile_s"):
        assert key in result
    assert result["samples"] == 4 and result["agreement"] == 1.0 and result["spike_for_spike"]
    assert result["accuracy"] == result["torch_accuracy"]
    assert np.array(result["layer_spikes"]).shape == (4, 2)
    np.testing.assert_array_equal(np.load(out / "lava_layer_spikes.npy"), result["layer_spikes"])
    assert (out / "plots" / "lava_spikes.png").is_file()
    totals = np.load(out / "lava_neuron_spikes.npz")
    assert [int(totals[f"layer{j}"].sum()) for j in range(2)] == np.sum(result["layer_spikes"], 0).tolist()

    # load_global_model rebuilds exactly the model the runner evaluated last
    model, cfg2, ds, rnd = load_global_model(out)
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    ev = evaluate(model, torch.as_tensor(ds.x_test), torch.as_tensor(ds.y_test), cfg2, seed_for(cfg2["seed"], "eval"))
    assert rnd == last["round"] and ev["accuracy"] == last["accuracy"]

    assert main(["export", str(out)]) == 0  # rewrite while nothing holds it open
    assert main(["lava", str(out), "--samples", "3", "--quiet"]) == 0
    assert json.loads((out / "lava.json").read_text())["samples"] == 3
    capsys.readouterr()
    assert main(["lava", str(out), "--backend", "loihi2"]) == 2
    assert "lava-loihi" in capsys.readouterr().err
    assert main(["lava", str(tmp_path / "missing")]) == 2
    assert "missing: no such folder" in capsys.readouterr().err


def test_fresh_copy_matches_the_model():
    model = tiny_model("cnn")
    copy = fresh_copy(model)
    spikes = random_spikes(2)
    np.testing.assert_array_equal(torch_reference(copy, spikes, 0).checksums,
                                  torch_reference(model, spikes, 0).checksums)
