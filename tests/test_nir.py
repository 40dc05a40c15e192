"""NIR export and runs in other simulators (neurofed.deploy.nir_export, nir_run).

The simulators are the real ones (snnTorch, Norse), each loading the written file
with its own NIR importer.
"""

from __future__ import annotations

import json

import nir
import numpy as np
import pytest
import torch

from neurofed.config import DEFAULTS
from neurofed.deploy import DeployError
from neurofed.deploy.lava_run import input_spikes, torch_reference
from neurofed.deploy.nir_export import (STEP_SECONDS, cuba_lif_params, graph_meta, nir_problems, node_names,
                                        read_nir, to_nir, write_nir)
from neurofed.deploy.nir_energy import synaptic_ops
from neurofed.deploy.nir_run import simulate
from neurofed.deploy.nir_simulators import SIMULATORS
from neurofed.models import build_model, model_names
from neurofed.models.snn import SpikingNet, slayer
from neurofed.models.spec import Layer, resolve

RATE = {"encoding": "rate", "timesteps": 12, "max_rate": 1.0}
SIMS = sorted(SIMULATORS)


def tiny_model(name: str, **cfg) -> SpikingNet:
    """A zoo model on 1x8x8 input (16x16 for the nets whose valid convolutions need it;
    narrow for the big ones), a low threshold so that random weights make every layer spike."""
    torch.manual_seed(0)
    width = 0.25 if name in ("vgg5", "svgg9", "hifi_cnn", "hifi_cnn_small") else 1.0
    model_cfg = {**DEFAULTS["model"], "name": name, "width": width, "threshold": 0.5, **cfg}
    side = 16 if name == "sfedca_mnist" else 8  # two 5x5 valid convolutions and a pool
    return build_model(model_cfg, (1, side, side), 10, logit_scale=10.0).eval()


def random_spikes(n: int, shape=(1, 8, 8), timesteps=12, seed=1) -> np.ndarray:
    x = np.random.default_rng(seed).random((n, *shape)).astype(np.float32)
    return input_spikes(x, {**RATE, "timesteps": timesteps}, seed)[0]


def real_weight(block) -> np.ndarray:
    w = block.synapse.pre_hook_fx(block.synapse.weight).detach().double().numpy()  # SLAYER's forward weight
    return w[..., 0]


# ----------------------------------------------------------------------------- round trips


EXPORTABLE = [name for name in model_names() if "resnet" not in name]  # residual models are refused (below)


def test_residual_zoo_models_are_refused_for_their_skip_path():
    residual = [name for name in model_names() if "resnet" in name]  # (other tests register models of their own)
    assert residual
    for name in residual:
        with pytest.raises(DeployError, match=r"residual connection: SLAYER's main path reaches the join one step "
                                              r"after the shortcut.*do not load Delay"):
            to_nir(tiny_model(name))


@pytest.mark.parametrize("name", EXPORTABLE)
def test_every_exportable_zoo_model_round_trips_through_a_nir_file(name, tmp_path):
    model = tiny_model(name)
    assert nir_problems(model) == []
    path = write_nir(model, tmp_path / f"{name}.nir", meta={"model": name})
    graph = nir.read(path)  # NIR's own reader, with its type check
    assert graph_meta(graph)["model"] == name and graph_meta(graph)["dt"] == STEP_SECONDS
    read_nir(path, model)
    names = node_names(model)
    chain = ["input"] + [n for pair in names for n in pair if n is not None] + ["output"]
    assert graph.edges == list(zip(chain[:-1], chain[1:]))
    assert tuple(graph.nodes["input"].output_type["output"]) == tuple(model.layers[0].in_shape)
    assert tuple(graph.nodes["output"].input_type["input"]) == tuple(model.layers[-1].out_shape)
    for (syn, lif), layer, block in zip(names, model.layers, model.blocks):
        node = graph.nodes[syn]
        if layer.kind == "flatten":
            assert isinstance(node, nir.Flatten)
            assert tuple(node.output_type["output"]) == tuple(layer.out_shape)
            continue
        assert tuple(node.output_type["output"]) == tuple(layer.out_shape)
        w = real_weight(block)
        if layer.kind == "dense":
            assert isinstance(node, nir.Linear)
            np.testing.assert_array_equal(node.weight, w.reshape(layer.out, -1))
        elif layer.kind == "conv":
            assert isinstance(node, nir.Conv2d) and node.groups == 1
            np.testing.assert_array_equal(node.weight, w)
            assert tuple(node.padding) == (layer.padding,) * 2 and tuple(node.stride) == (layer.stride,) * 2
            assert not node.bias.any()
        else:  # pool: channel o pools only channel o, with SLAYER's pool weight
            c = layer.in_shape[0]
            assert isinstance(node, nir.Conv2d) and node.weight.shape == (c, c, layer.kernel, layer.kernel)
            for o in range(c):
                np.testing.assert_array_equal(node.weight[o, o], w.reshape(layer.kernel, layer.kernel))
                assert not np.delete(node.weight[o], o, axis=0).any()
        assert np.abs(node.weight * 32 - np.round(node.weight * 32)).max() == 0  # 8-bit weights: SLAYER's 1/32 grid
        lif_node = graph.nodes[lif]
        assert isinstance(lif_node, nir.CubaLIF)
        for key, value in cuba_lif_params(block.neuron, tuple(layer.out_shape)).items():
            np.testing.assert_array_equal(getattr(lif_node, key), value)


def test_cuba_parameters_follow_the_euler_derivation():
    neuron = slayer.neuron.cuba.Neuron(threshold=1.25, current_decay=0.25, voltage_decay=0.03)
    p = cuba_lif_params(neuron, (3,), dt=1e-4)
    c, d = 1024 / 4096, 123 / 4096  # SLAYER's 12-bit decays (0.03 rounds to 123/4096)
    np.testing.assert_allclose(p["tau_syn"], 1e-4 / c)
    np.testing.assert_allclose(p["w_in"], 1 / c)
    np.testing.assert_allclose(p["tau_mem"], 1e-4 / d)
    np.testing.assert_allclose(p["r"], p["tau_mem"] / 1e-4)
    np.testing.assert_array_equal(p["v_threshold"], 1.25)
    np.testing.assert_array_equal(p["v_reset"], 0.0)


# ----------------------------------------------------------------------------- two neurons by hand


def two_neuron_graph():
    """input -> w 1.0 -> neuron A -> w 0.75 -> neuron B; current decay 1/4, voltage decay 1/2, threshold 1."""
    neuron = slayer.neuron.cuba.Neuron(threshold=1.0, current_decay=0.25, voltage_decay=0.5)
    p = cuba_lif_params(neuron, (1,))
    nodes = {"input": nir.Input(input_type={"input": np.array([1])}),
             "wa": nir.Linear(weight=np.array([[1.0]])), "a": nir.CubaLIF(**p),
             "wb": nir.Linear(weight=np.array([[0.75]])), "b": nir.CubaLIF(**p),
             "output": nir.Output(output_type={"output": np.array([1])})}
    edges = [("input", "wa"), ("wa", "a"), ("a", "wb"), ("wb", "b"), ("b", "output")]
    return nir.NIRGraph(nodes=nodes, edges=edges, metadata={"dt": STEP_SECONDS})


# Input spikes at steps 0 and 1. By hand, i = 3/4 i + x, v = v/2 + i, spike when v > 1, then v = 0:
#   A: i = 1, 1.75, 1.3125, .984, .738 ...; v = 1.0 (not > 1), 2.25*, 1.3125*, .984, 1.23* -> spikes 1, 2, 4
#   B (input .75 at 1, 2, 4, same step): i = 0, .75, 1.3125, .984, 1.488, 1.116, .837, .628, .471 ...
#      v = 0, .75, 1.6875*, .984, 1.980*, 1.116*, .837, 1.046*, .471, .589 -> spikes 2, 4, 5, 7
HAND_A = [1, 2, 4]
HAND_B = [2, 4, 5, 7]


@pytest.mark.parametrize("sim", SIMS)
def test_two_neuron_graph_spikes_as_computed_by_hand(sim, tmp_path):
    path = tmp_path / "two.nir"
    nir.write(path, two_neuron_graph())
    simulator = SIMULATORS[sim]
    net = simulator.load(nir.read(path), STEP_SECONDS)
    modules = dict(net.named_modules())
    seen = {"a": [], "b": []}
    for name in seen:
        modules[name].register_forward_hook(
            lambda m, i, o, name=name: seen[name].append(float((o[0] if isinstance(o, tuple) else o).sum())))
    state = simulator.reset(net)
    with torch.no_grad():
        for t in range(10):
            state = simulator.step(net, torch.tensor([1.0 if t < 2 else 0.0]), state)
    assert [t for t, s in enumerate(seen["a"]) if s] == HAND_A
    assert [t for t, s in enumerate(seen["b"]) if s] == HAND_B


def test_slayer_gives_the_hand_spikes_one_step_per_block_later():
    layers = resolve([Layer("flatten"), Layer("dense", 1), Layer("dense", 1)], (1, 1, 1))
    model = SpikingNet(layers, {"name": "two", "threshold": 1.0, "current_decay": 0.25, "voltage_decay": 0.5}).eval()
    with torch.no_grad():
        model.blocks[1].synapse.weight.fill_(1.0)
        model.blocks[2].synapse.weight.fill_(0.75)
    x = torch.zeros(1, 1, 1, 1, 12)
    x[..., :2] = 1
    with torch.no_grad():
        a = model.blocks[1](model.blocks[0](x))
        b = model.blocks[2](a)
    assert torch.nonzero(a.flatten()).flatten().tolist() == [t + 1 for t in HAND_A]
    assert torch.nonzero(b.flatten()).flatten().tolist() == [t + 2 for t in HAND_B]
    # and the export writes the hand-built graph's parameters
    graph, hand = to_nir(model), two_neuron_graph()
    np.testing.assert_array_equal(graph.nodes["fc1"].weight, hand.nodes["wa"].weight)
    np.testing.assert_array_equal(graph.nodes["fc2"].weight, hand.nodes["wb"].weight)
    for key in ("tau_syn", "tau_mem", "r", "w_in", "v_threshold", "v_reset", "v_leak"):
        np.testing.assert_array_equal(getattr(graph.nodes["fc2_lif"], key), getattr(hand.nodes["b"], key))
    assert graph_meta(graph)["latency_steps"] == [1, 2]


# ----------------------------------------------------------------------------- simulators vs torch


@pytest.mark.parametrize("sim", SIMS)
def test_simulator_runs_the_exported_cnn_like_slayer(sim, tmp_path):
    model = tiny_model("cnn")
    spikes = random_spikes(3)
    graph = read_nir(write_nir(model, tmp_path / "cnn.nir"), model)
    lifs = [lif for _, lif in node_names(model) if lif is not None]
    stats, _ = simulate(graph, SIMULATORS[sim], spikes, 5, lifs, model)
    ref = torch_reference(model, spikes, 5)
    assert ref.counts.min() > 0
    # float32 against SLAYER's fixed point: a few threshold crossings may move; the
    # time alignment must hold, so counts agree to within a fraction of a percent
    np.testing.assert_allclose(stats.counts, ref.counts, rtol=0.02, atol=2)
    assert stats.mismatch.sum() <= 0.02 * ref.counts.sum()
    # without the alignment the graph's spikes come 1..5 steps earlier: counting all T
    # steps finds more output spikes than torch does
    assert stats.output_full.sum() > ref.output.sum()


# ----------------------------------------------------------------------------- energy


def test_nir_synaptic_ops_match_neurofeds_count():
    from neurofed.models.opcounts import count_layers, synapse_masks

    model = tiny_model("cnn")
    spikes = random_spikes(4)
    ref = torch_reference(model, spikes, 1)
    graph = to_nir(model)
    first = torch.from_numpy(spikes.sum((0, -1)).astype(np.float64))
    per_layer, nir_maps, j, prev = [], {}, 0, first
    for (syn, lif), layer in zip(node_names(model), model.layers):
        per_layer.append(prev.reshape(tuple(layer.in_shape)))
        if lif is not None:
            nir_maps[syn] = per_layer[-1].numpy()
            prev = torch.from_numpy(ref.neuron_totals[j].astype(np.float64))
            j += 1
    with torch.no_grad():
        model(torch.zeros(1, 1, 8, 8, 2))
    rows = count_layers(model.layers, per_layer, [None] * len(model.layers), 4, 12, masks=synapse_masks(model))
    ops = synaptic_ops(graph, nir_maps)
    assert [r["name"] for r in rows] == list(ops)
    for r in rows:
        assert r["synaptic_ops"] > 0
        assert ops[r["name"]] / 4 == r["synaptic_ops"]  # exact: both count integer spike x fan-out pairs


# ----------------------------------------------------------------------------- refusals


def test_what_nir_cannot_hold_is_refused_with_the_reason():
    ann = build_model({**DEFAULTS["model"], "name": "mlp", "kind": "ann"}, (1, 8, 8), 10)
    assert nir_problems(ann) == ["model.kind is 'ann': only spiking models export to NIR"]

    params = {"threshold": 1.0, "current_decay": 0.25, "voltage_decay": 0.03, "tau_grad": 0.1, "scale_grad": 1.0}
    model = tiny_model("mlp")
    model.blocks[1] = slayer.block.cuba.Dense(params, 64, 128, delay=True)
    with pytest.raises(DeployError, match=r"layer 1 \(dense\): learned axonal delays would need NIR Delay nodes"):
        to_nir(model)

    model = tiny_model("mlp")
    model.blocks[2] = slayer.block.alif.Dense({**params, "threshold_step": 0.1, "refractory_decay": 0.1,
                                               "threshold_decay": 0.1}, 128, 10)
    with pytest.raises(DeployError, match=r"layer 2 \(dense\): block Dense is not SLAYER's cuba.Dense.*residual"):
        to_nir(model)

    with pytest.raises(DeployError, match=r"voltage_decay 0 \(no decay\) has no finite NIR time constant"):
        to_nir(tiny_model("mlp", voltage_decay=0.0))

    # a pool that does not tile its map is refused before NIR: the model is not built (SLAYER would pad it)
    with pytest.raises(ValueError, match=r"layer 1 \(pool 2x2\) gets a 7x7 map, which 2 does not divide"):
        build_model({**DEFAULTS["model"], "name": "cnn"}, (1, 7, 7), 10)


def test_stale_or_foreign_nir_file_is_refused(tmp_path):
    path = write_nir(tiny_model("cnn"), tmp_path / "cnn.nir")
    with pytest.raises(DeployError, match="stale or foreign"):
        read_nir(path, tiny_model("cnn", width=0.5))
    (tmp_path / "bad.nir").write_bytes(b"not hdf5")
    with pytest.raises(DeployError, match="not a readable NIR graph"):
        read_nir(tmp_path / "bad.nir")


# ----------------------------------------------------------------------------- a whole run


def untrained_run(out, cfg) -> None:
    """A run directory as `neurofed run` leaves it (config.yaml, model_last.npz,
    model_best.npz), holding a freshly initialised global model: the commands below
    only read those files."""
    import yaml

    from neurofed.data import load_dataset
    from neurofed.training.params import ParamSpec
    from neurofed.models import build_run_model
    from neurofed.rundir import MODEL_BEST, MODEL_LAST, save_state

    torch.manual_seed(0)
    model = build_run_model(cfg, load_dataset(cfg["data"], cfg["seed"]))
    out.mkdir()
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    params = np.asarray(ParamSpec.from_model(model).get(model), dtype=np.float32)
    for name in (MODEL_LAST, MODEL_BEST):
        save_state(out / name, {"round": 0, "accuracy": None, "params": params}, "model")


def test_cli_exports_nir_and_runs_both_simulators(tmp_path, tiny_cfg, capsys):
    from neurofed.cli import main
    from neurofed.deploy.nir_run import summary_line as nir_summary_line

    out = tmp_path / "run"
    untrained_run(out, tiny_cfg(**{"model.threshold": 0.5}))
    assert main(["export", str(out), "--format", "nir", "--round", "best"]) == 0
    assert (out / "model.nir").is_file() and not (out / "model.net").exists()
    for sim in SIMS:
        assert main(["nir", str(out), "--samples", "4", "--sim", sim, "--quiet"]) == 0
    result = json.loads((out / "nir.json").read_text())
    assert sorted(result) == SIMS
    for sim, r in result.items():
        assert r["samples"] == 4 and r["sim"] == sim
        assert np.array(r["layer_spikes"]).shape == (4, 2) == np.array(r["torch_layer_spikes"]).shape
        assert 0 <= r["agreement"] <= 1 and len(r["energy"]) == 2
        assert (out / "plots" / f"nir_{sim}.png").is_file()
        # the line names what its figures count (919f94d: "layer rasters 0.000, 0.200" beside Lava's 1.000)
        assert r["accuracy_measured_on"]["samples"] == 4 and r["accuracy_measured_on"]["input_draw"] == "lava"
        line = nir_summary_line(r)
        assert "layer rasters" not in line and "first 4 of" in line and "draw 'lava'" in line
        assert "spikes differing from torch per layer " + ", ".join(f"{100 * a:.1f}%" for a in r["layer_spike_mismatch"]) in line
    # a second check of one simulator replaces its entry; the history keeps both
    assert main(["nir", str(out), "--samples", "2", "--sim", SIMS[0], "--quiet"]) == 0
    assert json.loads((out / "nir.json").read_text())[SIMS[0]]["samples"] == 2
    history = [json.loads(line) for line in (out / "nir_checks.jsonl").read_text().splitlines()]
    assert [(h["sim"], h["samples"]) for h in history] == [*((sim, 4) for sim in SIMS), (SIMS[0], 2)]
    assert all(h["checked"] and "predictions" not in h for h in history)
    capsys.readouterr()
    assert main(["nir", str(out), "--sim", "brian2"]) == 2
    assert "allowed: snntorch, norse" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing"), "--format", "nir"]) == 2
