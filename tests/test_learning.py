"""Networks that learn (issue 31): the stand-in data sets, the data-driven initialization,
the voltage readout, the papers' pools, and the run's health checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import tiny_overrides

REPO = Path(__file__).resolve().parents[1]


def _model(**model_cfg):
    from neurofed.models import MODEL_DEFAULTS, build_model

    cfg = {**MODEL_DEFAULTS, "quantize": False, "delay_shift": False, **model_cfg}
    return build_model(cfg, (1, 8, 8), 10, logit_scale=1.0)


# --------------------------------------------------------------------------- stand-ins
@pytest.mark.parametrize("name,shape,classes", [
    ("standin_mnist", (1, 28, 28), 10), ("standin_fashion_mnist", (1, 28, 28), 10),
    ("standin_cifar10", (3, 32, 32), 10), ("standin_svhn", (3, 32, 32), 10), ("standin_cifar100", (3, 32, 32), 100),
])
def test_standins_have_their_paper_data_sets_shape_and_say_they_are_standins(name, shape, classes):
    from neurofed.data import load_dataset
    from neurofed.data.catalog import catalog

    ds = load_dataset({"name": name})
    assert ds.input_shape == shape and ds.num_classes == classes and ds.x_train.dtype == np.uint8
    assert set(np.unique(ds.y_train)) == set(range(classes)) == set(np.unique(ds.y_test))
    assert ds.info["standin_for"] == name.removeprefix("standin_") and "STAND-IN" in ds.info["note"]
    again = load_dataset({"name": name})  # a fixed seed: every run sees the same images
    assert np.array_equal(ds.x_train, again.x_train) and np.array_equal(ds.y_test, again.y_test)
    row = next(r for r in catalog() if r["name"] == name)
    assert "STAND-IN" in row["where"] and row["train"] == len(ds.y_train) and row["test"] == len(ds.y_test)


def test_standin_images_carry_their_label():
    """A linear classifier on the pixels beats chance (10 %) by far: the signal is there."""
    from sklearn.linear_model import LogisticRegression

    from neurofed.data import load_dataset

    ds = load_dataset({"name": "standin_mnist"})
    xtr, xte = ds.x_train.reshape(len(ds.x_train), -1) / 255.0, ds.x_test.reshape(len(ds.x_test), -1) / 255.0
    clf = LogisticRegression(max_iter=300).fit(xtr, ds.y_train)
    assert clf.score(xte, ds.y_test) > 0.6


# --------------------------------------------------------------------------- voltage readout
def test_voltage_readout_is_the_accumulated_input_of_a_non_spiking_output_layer():
    torch.manual_seed(0)
    model = _model(name="mlp", readout="voltage")
    x = (torch.rand(6, 1, 8, 8, 12) < 0.3).float()
    model.record = True
    out = model(x)
    last = model.blocks[-1]
    # the output layer's input, step by step, from the blocks before it
    h = x
    for block in model.blocks[:-1]:
        h = block(h)
    z = last.synapse(h)
    expected = torch.cumsum(z.reshape(out.shape), -1)  # lambda = 1, no reset (FedSNN Eq. 6-7)
    assert torch.allclose(out, expected, atol=2e-3)  # up to SLAYER's fixed-point voltage
    logits = model.readout(out)
    assert torch.equal(logits, out[..., -1] / 12)
    # analog logits: many more values than the T + 1 of a spike count
    assert len(torch.unique(logits)) > 13
    # it emits no spikes: it counts 0, and the layer list keeps its length
    assert len(model.layer_spikes) == len(model.neurons_per_layer) and float(model.layer_spikes[-1].sum()) == 0
    # TET's per-step outputs (SFedHIFI Eq. 14): the head's input at each step, whose mean over T
    # is the logits above
    per_step = model.readout_per_step(out)
    assert torch.allclose(per_step, z.reshape(out.shape), atol=2e-3)
    assert torch.allclose(per_step.mean(-1), logits, atol=1e-6)


def test_voltage_readout_needs_a_dense_output_layer_and_is_a_config_choice():
    from neurofed.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.readout"):
        load_config(None, tiny_overrides(**{"model.readout": "membrane"}))
    assert load_config(None, tiny_overrides(**{"model.readout": "voltage"}))["model"]["readout"] == "voltage"


# --------------------------------------------------------------------------- pools
def _pool_model(kind):
    from neurofed.models.snn import SpikingNet
    from neurofed.models.spec import Layer, resolve

    layers = resolve([Layer("pool", kernel=2, stride=2), Layer("flatten"), Layer("dense", 4)], (3, 8, 8))
    from neurofed.models import MODEL_DEFAULTS

    return SpikingNet(layers, {**MODEL_DEFAULTS, "pool": kind, "delay_shift": False, "quantize": True})


def test_max_pool_is_the_exact_max_of_binary_spikes_every_step():
    torch.manual_seed(1)
    pool = _pool_model("max").blocks[0]
    x = (torch.rand(5, 3, 8, 8, 16) < 0.2).float()
    out = pool(x)
    ref = torch.nn.functional.max_pool2d(x.permute(0, 4, 1, 2, 3).reshape(-1, 3, 8, 8), 2)
    assert torch.equal(out, ref.reshape(5, 16, 3, 4, 4).permute(0, 2, 3, 4, 1))


def test_avg_pool_fires_once_per_window_area_of_input_spikes():
    pool = _pool_model("avg").blocks[0]
    # one spike per window per step, at random steps: the count of each window's output is
    # the window's input count // 4 (integrate and fire, reset to 0)
    gen = torch.Generator().manual_seed(2)
    x = torch.zeros(4, 3, 8, 8, 40)
    pick = torch.randint(0, 4, (4, 3, 4, 4, 40), generator=gen)
    on = torch.rand(4, 3, 4, 4, 40, generator=gen) < 0.6
    for dy in range(2):
        for dx in range(2):
            x[:, :, dy::2, dx::2, :] = ((pick == 2 * dy + dx) & on).float()
    counts_in = torch.nn.functional.avg_pool2d(x.sum(-1), 2) * 4
    out = pool(x)
    assert torch.equal(out.sum(-1), torch.div(counts_in, 4, rounding_mode="floor"))


def test_the_papers_pools_export_as_netx_pool_layers(tmp_path):
    import h5py

    model = _pool_model("max")
    model(torch.zeros(1, 3, 8, 8, 4))  # SLAYER learns a block's shape from its first input
    with h5py.File(tmp_path / "p.net", "w") as f:
        model.blocks[0].export_hdf5(f.create_group("layer/0"))
        g = f["layer/0"]
        assert g["type"][0].decode() == "pool"
        w = np.asarray(g["weight"])
        assert np.all(w == 2)  # one step of the 8-bit grid (x 64)
        assert int(g["neuron/vThMant"][()]) == 1 and int(g["neuron/vDecay"][()]) == 4096


# --------------------------------------------------------------------------- data-driven init
def test_firing_init_puts_every_layer_in_its_band_by_scaling_weights_only(tiny_cfg):
    from neurofed.data import load_dataset
    from neurofed.data.encoding import as_tensor
    from neurofed.fl.health import start_rates
    from neurofed.models import build_run_model
    from neurofed.models.init import initialize

    # a deep net at a high threshold: SLAYER's initialization leaves its later layers silent
    cfg = tiny_cfg(**{"model.name": "cnn", "model.width": 0.5, "model.threshold": 4.0, "data.timesteps": 8,
                      "model.quantize": True})
    ds = load_dataset(cfg["data"])
    x = as_tensor(ds.x_train)
    torch.manual_seed(0)
    model = build_run_model(cfg, ds)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert min(start_rates(model, cfg, x)) < 1e-4  # silent somewhere
    cfg["model"]["init"] = "firing"
    report = initialize(model, cfg, x)
    lo, hi = cfg["model"]["init_rates"]
    rates = start_rates(model, cfg, x)
    assert all(lo * 0.5 <= r <= hi * 1.5 for r in rates), rates
    for name, p in model.named_parameters():  # each tensor is its old self times one positive factor
        ratio = (p.detach() / before[name])[before[name] != 0]
        assert torch.allclose(ratio, ratio[0].expand_as(ratio), rtol=1e-5) and float(ratio[0]) > 0
    assert any(r["gain"] > 1 for r in report)
    # the 8-bit hook still puts every weight on SLAYER's grid (export stays 8-bit)
    w = model.blocks[0].synapse.pre_hook_fx(model.blocks[0].synapse.weight)
    assert torch.equal(w * 32, torch.round(w * 32))


def test_firing_init_gives_a_voltage_readout_unit_logit_std(tiny_cfg):
    from neurofed.data import load_dataset
    from neurofed.data.encoding import as_tensor
    from neurofed.models import build_run_model
    from neurofed.models.init import READOUT_STD, calibration_batch, initialize

    cfg = tiny_cfg(**{"model.name": "cnn", "model.readout": "voltage", "model.init": "firing", "data.timesteps": 8})
    ds = load_dataset(cfg["data"])
    x = as_tensor(ds.x_train)
    torch.manual_seed(0)
    model = build_run_model(cfg, ds)
    head = [p for p in model.blocks[-1].parameters() if p.requires_grad]
    head_before = [p.detach().clone() for p in head]
    report = initialize(model, cfg, x)
    last = report[-1]
    assert last["layer"] == len(model.layers) - 1 and last["logit_std_after"] == pytest.approx(READOUT_STD, rel=0.05)
    # one positive factor on the readout's weights, the one that moved the std to READOUT_STD
    gain = last["gain"]
    for p, b in zip(head, head_before):
        assert torch.allclose(p.detach(), b * gain, rtol=1e-5)
    model.eval()
    with torch.no_grad():
        logits = model.readout(model(calibration_batch(model, cfg, x)))
    assert float(logits.std()) == pytest.approx(READOUT_STD, rel=0.05)  # 8-bit weights, fixed-point voltage


# --------------------------------------------------------------------------- health
def _run(tmp_path, name, *extra):
    out = tmp_path / name
    res = subprocess.run([sys.executable, "-m", "neurofed.cli", "run", "examples/digits_fedavg.yaml", "--out", str(out),
                          "--quiet", *[a for o in tiny_overrides() for a in ("--set", o)], *extra],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    return res, out


def test_a_silent_network_is_named_recorded_and_fails_strict(tmp_path):
    res, out = _run(tmp_path, "silent", "--set", "model.threshold=50", "--set", "federation.rounds=3", "--strict")
    assert res.returncode == 1, res.stderr
    assert res.stderr.count("warning: layers silent at the start") == 1  # said once
    assert "--strict: the run is not healthy" in res.stderr
    health = json.loads((out / "summary.json").read_text())["health"]
    assert health["ok"] is False and health["silent_at_start"]
    assert health["output_silent_rounds"] == [1, 2, 3]
    assert health["chance_loss_rounds"] == [1, 2, 3]  # equal logits: loss ln 10 every round
    assert any("not learning" in p for p in health["problems"])


def test_a_healthy_run_passes_strict(tmp_path):
    # the tiny net at T = 4 is silent under SLAYER's initialization; the data-driven one wakes it
    res, out = _run(tmp_path, "ok", "--strict", "--set", "model.init=firing", "--set", "data.timesteps=8")
    assert res.returncode == 0, res.stderr
    health = json.loads((out / "summary.json").read_text())["health"]
    assert health["ok"] is True and health["problems"] == [] and "silent" not in res.stderr


def test_a_lowered_min_size_is_said_once(tmp_path):
    res, _ = _run(tmp_path, "minsize", "--set", "partition.scheme=dirichlet", "--set", "partition.alpha=0.5",
                  "--set", "partition.num_clients=100", "--set", "partition.min_size=10",
                  "--set", "federation.rounds=1")
    assert res.stderr.count("partition.min_size 10 lowered to") == 1, res.stderr


def test_a_voltage_readout_maps_to_netx():
    from neurofed.deploy.constraints import structure_problems

    # read from the Lava neuron's voltage (tests/test_lava_mechanisms.py)
    assert structure_problems(_model(name="mlp", readout="voltage")) == []
    assert structure_problems(_model(name="mlp")) == []


def test_accuracy_is_the_exact_fraction_so_a_target_met_exactly_counts(tiny_cfg):
    # 19 of 20 right is 0.95; a float32 mean gives 0.94999999, and "rounds to 95 %" missed it
    from neurofed.data import load_dataset
    from neurofed.data.encoding import as_tensor
    from neurofed.models import build_run_model
    from neurofed.seeds import seed_for
    from neurofed.training.local import evaluate, forward_dataset

    cfg = tiny_cfg()
    ds = load_dataset(cfg["data"])
    torch.manual_seed(0)
    model = build_run_model(cfg, ds)
    x = as_tensor(ds.x_test)[:20]
    logits, _ = forward_dataset(model, x, cfg["data"], seed_for(cfg["seed"], "eval"))
    y = logits.argmax(1).clone()
    y[0] = (y[0] + 1) % ds.num_classes  # exactly one of the 20 wrong
    accuracy = evaluate(model, x, y, cfg, seed_for(cfg["seed"], "eval"))["accuracy"]
    assert accuracy >= 0.95 and accuracy == 19 / 20
    assert float(torch.tensor([1.0] * 19 + [0.0]).mean()) < 0.95  # what the float32 mean gave
