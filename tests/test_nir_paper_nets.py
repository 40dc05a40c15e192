"""NIR for the papers' networks (neurofed.deploy.nir_export, nir_run): folded batch norm,
direct (analog) input and the voltage readout, each run in the real snnTorch and Norse
importers against the torch deployable model (what the graph holds)."""

from __future__ import annotations

import json

import nir
import numpy as np
import pytest
import torch

from neurofed.config import DEFAULTS
from neurofed.deploy import DeployError
from neurofed.deploy.deployable import CURRENT_SCALE, deployable_copy, integer_bias
from neurofed.deploy.lava_run import input_spikes, torch_reference
from neurofed.deploy.nir_export import nir_model, nir_problems, node_names, read_nir, to_nir, write_nir
from neurofed.deploy.nir_run import nir_plan, simulate
from neurofed.deploy.nir_simulators import SIMULATORS
from neurofed.models import build_model
from neurofed.models.norm import ChannelBatchNorm

SIMS = sorted(SIMULATORS)
T = 12


def paper_cnn(**cfg):
    """The zoo cnn on 1x8x8 as the paper presets run it (no delay_shift), low threshold so every
    layer spikes; with batch norm, running statistics and affine drawn so the shift is nonzero."""
    torch.manual_seed(0)
    model = build_model({**DEFAULTS["model"], "name": "cnn", "threshold": 0.5, "delay_shift": False, **cfg},
                        (1, 8, 8), 10, logit_scale=10.0).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for norm in (m for m in model.modules() if isinstance(m, ChannelBatchNorm)):
            c = norm.weight.numel()
            norm.running_mean.copy_(torch.randn(c, generator=gen) * 0.3)
            norm.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
            norm.weight.copy_(torch.rand(c, generator=gen) + 0.5)
            norm.bias.copy_(torch.randn(c, generator=gen) * 0.5)
    return model


def images(n=4):
    return np.random.default_rng(1).random((n, 1, 8, 8)).astype(np.float32)


def rate_spikes(n=4):
    return input_spikes(images(n), {"encoding": "rate", "timesteps": T, "max_rate": 1.0}, 1)[0]


def direct_input(n=4):
    from neurofed.data.encoding import encode

    return encode(torch.from_numpy(images(n)), "direct", T, mean=[0.5], std=[0.3]).float().numpy()


def run_both(model, x, sim, tmp_path):
    """The simulator's statistics and torch's (the deployable model) on the same input."""
    graph = read_nir(write_nir(model, tmp_path / "m.nir"), model)
    deployable = nir_model(model)
    lifs = [lif for _, lif in node_names(deployable) if lif is not None]
    stats, _ = simulate(graph, SIMULATORS[sim], x, 5, lifs, deployable)
    return stats, torch_reference(deployable, x, 5, nir_plan(deployable, T))


def assert_like_torch(stats, ref, spiking_layers):
    assert ref.counts[:, :spiking_layers].min() > 0
    np.testing.assert_array_equal(stats.predictions, ref.predictions)
    # float32 in the simulators against SLAYER's fixed point: a few threshold crossings may move
    np.testing.assert_allclose(stats.counts, ref.counts, rtol=0.02, atol=2)
    assert stats.mismatch.sum() <= 0.02 * ref.counts.sum()


# ----------------------------------------------------------------------------- batch norm


def test_folded_batch_norm_is_the_synapse_bias_and_both_importers_load_it():
    model = paper_cnn(norm="batch", current_decay=0.25)  # a leaky current: Lava refuses, NIR is exact
    with pytest.raises(DeployError, match=r"layer 0 \(conv\).*model.current_decay: 1"):
        deployable_copy(model)  # the default (Lava's limit) is unchanged
    assert nir_problems(model) == []
    graph, deployable = to_nir(model), nir_model(model)
    folded = {}
    for (syn, _), layer, block in zip(node_names(deployable), deployable.layers, deployable.blocks):
        node = graph.nodes[syn]
        if layer.kind in ("conv", "dense") and layer is not deployable.layers[-1]:
            assert isinstance(node, nir.Conv2d if layer.kind == "conv" else nir.Affine)
            np.testing.assert_array_equal(node.bias, integer_bias(block.synapse).numpy() / CURRENT_SCALE)
            assert np.abs(node.bias).max() > 0
            folded[syn] = node.bias
    assert sorted(folded) == ["conv1", "conv2", "fc1"]
    assert isinstance(graph.nodes["fc2"], nir.Linear)  # the output layer is never normed
    assert not graph.nodes["pool1"].bias.any()
    for sim in SIMS:
        modules = dict(SIMULATORS[sim].load(graph, 1e-4).named_modules())
        for name, bias in folded.items():
            np.testing.assert_allclose(modules[name].bias.detach().numpy(), bias, rtol=0, atol=1e-7)


@pytest.mark.parametrize("sim", SIMS)
def test_batch_normed_net_runs_like_the_torch_deployable(sim, tmp_path):
    model = paper_cnn(norm="batch", current_decay=0.25)
    stats, ref = run_both(model, rate_spikes(), sim, tmp_path)
    assert_like_torch(stats, ref, 5)


def test_batch_norm_shift_behind_a_delay_shift_is_refused_in_one_line_per_layer():
    model = paper_cnn(norm="batch", delay_shift=True)
    problems = nir_problems(model)
    assert [p.split(":")[0] for p in problems] == ["layer 2 (conv)", "layer 4 (dense)"]  # conv1's input is on time
    assert all("\n" not in p and "model.delay_shift: false" in p for p in problems)
    with pytest.raises(DeployError, match=r"layer 2 \(conv\): its folded batch-norm shift"):
        to_nir(model)


# ----------------------------------------------------------------------------- direct input


@pytest.mark.parametrize("sim", SIMS)
def test_direct_input_runs_like_the_torch_deployable(sim, tmp_path):
    x = direct_input()
    assert x.dtype == np.float32 and (x < 0).any() and (x % 1 != 0).any()  # analog, normalized
    stats, ref = run_both(paper_cnn(), x, sim, tmp_path)
    assert_like_torch(stats, ref, 5)


# ----------------------------------------------------------------------------- voltage readout


@pytest.mark.parametrize("sim", SIMS)
def test_voltage_readout_gives_slayers_voltage(sim, tmp_path):
    model = paper_cnn(readout="voltage", norm="batch")
    graph = to_nir(model)
    node = graph.nodes["fc2_lif"]
    assert np.isinf(node.v_threshold).all() and np.allclose(node.tau_syn, 1e-4)
    stats, ref = run_both(model, rate_spikes(), sim, tmp_path)
    assert ref.counts[:, -1].sum() == 0 == stats.counts[:, -1].sum()  # it never fires
    assert np.abs(ref.output).max() > 1000
    # the voltage at the last step, in SLAYER's state units: equal, not only its argmax
    np.testing.assert_array_equal(stats.output, ref.output)
    assert_like_torch(stats, ref, 4)


def test_voltage_readout_with_delay_shift_reads_the_aligned_step(tmp_path):
    model = paper_cnn(readout="voltage", delay_shift=True)
    stats, ref = run_both(model, rate_spikes(), "norse", tmp_path)
    np.testing.assert_array_equal(stats.predictions, ref.predictions)
    same = stats.mismatch[:, -2] == 0  # the readout's input raster matches (float32 may move a few spikes)
    assert same.sum() >= 2
    np.testing.assert_array_equal(stats.output[same], ref.output[same])
    assert not np.array_equal(stats.output_full, ref.output)  # all T steps read: later spikes counted too


# ----------------------------------------------------------------------------- a whole run


def test_cli_runs_a_direct_input_voltage_readout_batch_normed_run(tmp_path, tiny_cfg, capsys):
    from neurofed.cli import main
    from test_nir import untrained_run

    out = tmp_path / "run"
    untrained_run(out, tiny_cfg(**{"model.threshold": 0.5, "data.encoding": "direct", "model.readout": "voltage",
                                   "model.norm": "batch", "model.delay_shift": False,
                                   "model.current_decay": 0.5}))
    for sim in SIMS:
        assert main(["nir", str(out), "--samples", "4", "--sim", sim, "--quiet"]) == 0
    result = json.loads((out / "nir.json").read_text())
    for sim, r in result.items():
        assert r["readout"] == "voltage" and r["encoding"] == "direct"
        assert r["agreement"] == 1.0 and r["predictions"] == r["torch_predictions"]
        assert np.allclose(r["layer_spikes"], r["torch_layer_spikes"], rtol=0.02, atol=2)
        assert r["energy"][0]["analog_input"] and r["energy"][0]["macs"] > 0
    capsys.readouterr()
