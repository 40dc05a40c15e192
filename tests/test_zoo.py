"""The papers' backbones: layer lists, SLAYER forward/backward, residual blocks (trained,
energy-counted, refused by export), and the refusal of inputs a model shrinks to nothing."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from neurofed.deploy.constraints import check_model, structure_problems
from neurofed.models.opcounts import count_layers, count_macs
from neurofed.energy.spikes import measure_torch
from neurofed.models import Layer, build_model, register_topology, topology
from neurofed.models.residual import EXPORT_REFUSAL, ResidualJoin
from neurofed.models.norm import ChannelBatchNorm
from neurofed.models.spec import ZOO

RATE = {"encoding": "rate", "timesteps": 4, "max_rate": 1.0}


def _spikes(shape, n=2, t=4, p=0.3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, *shape, t, generator=g) < p).float()


def _kinds(layers):
    return [(l.kind, l.out, l.kernel, l.stride) if l.kind != "flatten" else ("flatten",) for l in layers]


# ----------------------------------------------------------------------------- layer lists

def test_svgg9_is_fedsnn_vgg9_for_32x32():
    # FedSNN Sec. IV (7 conv + 2 FC, average pooling); the authors' BNTT VGG9:
    # 64,64,P,128,128,P,256,256,256,P, FC1024, FC K (3x3 same convs, 2x2 pools).
    layers = topology("svgg9", 1.0, 10, (3, 32, 32))
    convs = [l.out for l in layers if l.kind == "conv"]
    assert convs == [64, 64, 128, 128, 256, 256, 256]
    assert [l.kind for l in layers].count("pool") == 3
    assert [l.out for l in layers if l.kind == "dense"] == [1024, 10]
    assert layers[-4].out_shape == (256, 4, 4) and layers[-3].out_shape == (4096,)


def test_vgg5_and_hifi_cnn_layer_lists():
    # VGG5 (SFedCA's Fashion-MNIST backbone): 64C3-P2-128C3-128C3-P2-FC1024-FC.
    assert _kinds(topology("vgg5", 1.0, 10, (1, 28, 28))) == [
        ("conv", 64, 3, 1), ("pool", 0, 2, 2), ("conv", 128, 3, 1), ("conv", 128, 3, 1), ("pool", 0, 2, 2),
        ("flatten",), ("dense", 1024, 1, 1), ("dense", 10, 1, 1)]
    # SFedHIFI "Model Selection": 64C3-128C3-MP2-128C3-MP2-FC (SLAYER average pools).
    layers = topology("hifi_cnn", 1.0, 10, (1, 28, 28))
    assert [(l.kind, l.out) for l in layers if l.kind in ("conv", "dense")] == [
        ("conv", 64), ("conv", 128), ("conv", 128), ("dense", 10)]
    assert layers[-2].out_shape == (128 * 7 * 7,)


def test_sfedca_nets_have_the_papers_layer_counts():
    mnist = topology("sfedca_mnist", 1.0, 10, (1, 28, 28))  # "2 Conv layers and 2 FC layers"
    assert [l.kind for l in mnist].count("conv") == 2 and [l.kind for l in mnist].count("dense") == 2
    alex = topology("sfedca_alexnet", 1.0, 10, (3, 32, 32))  # AlexNet: 5 conv + 3 dense
    assert [l.out for l in alex if l.kind == "conv"] == [48, 128, 192, 192, 128]  # sizes: paper_nets.py
    assert [l.out for l in alex if l.kind == "dense"] == [2048, 1024, 10]
    assert alex[-5].out_shape == (128, 8, 8)


def test_resnet18_stages_and_shortcuts():
    layers = topology("resnet18", 1.0, 100, (3, 32, 32))
    convs = [l for l in layers if l.kind == "conv"]
    assert len(convs) == 17 and sum(1 for l in layers if l.kind == "dense") == 1  # 18 weight layers
    joins = [l for l in layers if l.options.get("residual") == "close"]
    assert [l.out_shape for l in joins] == [(64, 32, 32)] * 2 + [(128, 16, 16)] * 2 + [(256, 8, 8)] * 2 + \
        [(512, 4, 4)] * 2
    assert [l.options["skip_stride"] for l in joins] == [1, 1, 2, 1, 2, 1, 2, 1]
    assert layers[-1].out_shape == (100,) and layers[-3].out_shape == (512, 1, 1)
    # width p scales the blocks, not the stem (as the authors' net_fraction)
    half = topology("resnet18", 0.5, 10, (3, 32, 32))
    assert half[0].out == 64 and [l.out for l in half if l.options.get("residual") == "close"][-1] == 256


# ----------------------------------------------------------------------------- forward / backward

@pytest.mark.parametrize("name,shape", [("sfedca_mnist", (1, 28, 28)), ("sfedca_alexnet", (3, 32, 32)),
                                        ("hifi_resnet18", (3, 16, 16))])  # resnet18: the tests below
def test_backbones_forward_backward(name, shape):
    # delay_shift off: the papers' T (with SLAYER's one-step delay per block, a deep net's
    # output would stay silent for its first L-1 steps of a 4-step window)
    model = build_model({"name": name, "width": 0.125, "delay_shift": False}, shape, 10)
    x = _spikes(shape)
    out = model(x)
    assert out.shape == (2, 10, 4) and set(out.unique().tolist()) <= {0.0, 1.0}
    loss = F.cross_entropy(model.readout(out) + 0.0, torch.tensor([1, 2]))
    (loss + out.sum()).backward()  # the output alone may be silent at init; spikes still carry gradient
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


def test_residual_join_adds_the_shortcut():
    model = build_model({"name": "resnet18", "width": 0.125, "quantize": False}, (3, 16, 16), 10)
    joins = [b for b in model.blocks if isinstance(b, ResidualJoin)]
    assert len(joins) == 8 and joins[0].shortcut is not None  # stem 64 -> 8 channels at p = 1/8
    assert joins[1].shortcut is None  # identity inside a stage
    # The join's current is conv(h) + shortcut(skip delayed one step): with a silent h, a
    # strong identity shortcut alone must make the neurons fire, one step after the input.
    j = joins[1]
    c = j.synapse.in_channels
    h = torch.zeros(1, c, 4, 4, 6)
    skip = torch.zeros(1, c, 4, 4, 6)
    skip[..., 0:3] = 1.0
    with torch.no_grad():
        quiet = j(h, torch.zeros_like(skip))
        loud = j(h, skip * 10)
    assert float(quiet.sum()) == 0 and float(loud.sum()) > 0
    assert float(loud[..., 0].sum()) == 0  # shortcut delayed one step, output one more


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_the_residual_ann_twin_adds_each_blocks_input_before_its_relu(norm):
    # the ANN twin of SFedHIFI's ResNet-18 (twin_curves compares the SNN with it): a block's
    # output is relu(norm(conv2(h)) + shortcut(x)), x the block's input; computed here by hand
    # from the twin's own modules, the identity shortcut and the 1x1 one with its stride
    from neurofed.models.residual import AnnResidualJoin

    model = build_model({"name": "hifi_resnet18", "kind": "ann", "width": 0.125, "norm": norm}, (3, 16, 16), 10)
    model.eval()
    joins = [m for m in model.net if isinstance(m, AnnResidualJoin)]
    assert len(joins) == 8 and joins[0].shortcut is not None and joins[1].shortcut is None
    assert joins[2].shortcut.stride == (2, 2)
    x = torch.randn(2, 3, 16, 16)
    seen = {}
    for i, parts in enumerate(model.parts):
        for m in parts:
            m.register_forward_hook(lambda mod, args, out, i=i: seen.setdefault(i, []).append((args, out)))
    out = model(x)
    assert out.shape == (2, 10)
    layers = model.layers
    for i, layer in enumerate(layers):
        if layer.options.get("residual") != "close":
            continue
        block_input = seen[i - 2][-1][1]  # the open layer's input is the output of the layer before it
        conv_input = seen[i - 1][-1][1]  # the open layer's ReLU output
        join = model.parts[i][0]
        short = block_input if join.shortcut is None else join.shortcut_norm(join.shortcut(block_input))
        expected = torch.relu(join.norm(join.conv(conv_input)) + short)
        assert torch.allclose(seen[i][-1][1], expected, atol=1e-6)
    model.train()
    F.cross_entropy(model(x), torch.tensor([1, 2])).backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


# ----------------------------------------------------------------------------- export and energy

def test_resnet_export_refused_with_the_reason():
    model = build_model({"name": "resnet18", "width": 0.125}, (3, 16, 16), 10)
    problems = structure_problems(model)
    joins = [str(i) for i, b in enumerate(model.blocks) if isinstance(b, ResidualJoin)]
    assert len(joins) == 8  # one line naming the 8 joins (919f94d: the same sentence 8 times)
    assert problems == [f"layers {', '.join(joins)}: {EXPORT_REFUSAL}"]
    report = check_model(model)
    assert not report.ok
    assert "needs 0 cores" not in report.summary() and EXPORT_REFUSAL in report.summary()
    with pytest.raises(Exception, match="residual connection"):
        report.raise_for_violations()
    # the feed-forward zoo models still pass the structure check
    assert structure_problems(build_model({"name": "sfedca_mnist", "width": 0.25}, (1, 28, 28), 10)) == []


def test_resnet_energy_counts_the_shortcuts():
    shape = (3, 16, 16)
    model = build_model({"name": "resnet18", "width": 0.125}, shape, 10)
    x = torch.rand(3, *shape)
    maps = measure_torch(model, x, RATE, seed=0)
    rows = count_layers(model.layers, maps.input_maps, maps.output_spikes, maps.samples, maps.timesteps,
                        skip_maps=maps.skip_maps)
    joins = [r for r in rows if r.get("shortcut")]
    assert [r["shortcut"] for r in joins] == ["conv1x1", "identity", "conv1x1", "identity"] * 2
    for i, layer in enumerate(model.layers):
        if layer.options.get("residual") != "close":
            continue
        row = next(r for r in rows if r["index"] == i)
        # own 3x3 synapse (as a plain conv layer) + the shortcut's ops, recomputed here
        plain = count_layers([replace(layer, options={})], [maps.input_maps[i]], [maps.output_spikes[i]], maps.samples,
                             maps.timesteps)[0]
        skip = maps.skip_maps[i]
        assert skip is not None and skip.shape == model.layers[i - 1].in_shape
        if row["shortcut"] == "identity":
            extra_ops, extra_macs = float(skip.sum()) / maps.samples, 0
        else:
            c_out, s = layer.out, layer.options["skip_stride"]
            reached = F.conv2d(skip[None], torch.ones(c_out, skip.shape[0], 1, 1, dtype=torch.float64), stride=s)
            extra_ops = float(reached.sum()) / maps.samples
            extra_macs = layer.out_shape[1] * layer.out_shape[2] * skip.shape[0] * c_out
        assert row["synaptic_ops_all_weights"] == pytest.approx(plain["synaptic_ops_all_weights"] + extra_ops)
        assert row["macs"] == plain["macs"] + extra_macs
    assert sum(r["macs"] for r in rows) == sum(count_macs(model.layers)) + sum(r["shortcut_macs"] for r in joins)


# ----------------------------------------------------------------------------- input too small

def test_too_small_input_refused_naming_model_and_size():
    with pytest.raises(ValueError) as err:
        build_model({"name": "svgg9"}, (1, 4, 4), 10)
    msg = str(err.value)
    assert "\n" not in msg and "svgg9" in msg and "1x4x4" in msg


def test_a_pool_over_an_odd_map_is_refused_naming_the_layer_and_size():
    # SLAYER's pool would pad 11x11 to 6x6 where the layer list counts 5x5: refused, not built wrong
    odd = [Layer("conv", 4, kernel=4), Layer("pool", kernel=2, stride=2), Layer("flatten"), Layer("dense", 10)]
    register_topology("odd_pool", lambda p, k: odd)
    try:
        with pytest.raises(ValueError) as err:
            build_model({"name": "odd_pool"}, (1, 14, 14), 10)
        build_model({"name": "odd_pool"}, (1, 15, 15), 10)  # 12x12: the pool divides it
    finally:
        ZOO.pop("odd_pool")
    msg = str(err.value)
    assert "\n" not in msg and "odd_pool" in msg and "layer 1 (pool 2x2)" in msg and "11x11" in msg


def test_too_small_input_refused_before_training(tmp_path, capsys):
    # digits are 8x8; a net with four 2x2 pools shrinks them to nothing: the run stops with
    # one line (exit 2) before any round.
    from neurofed.cli import main

    pool = Layer("pool", kernel=2, stride=2)
    register_topology("four_pools", lambda p, k: [Layer("conv", 4, 3, padding=1), pool, pool, pool, pool,
                                                  Layer("flatten"), Layer("dense", k)])
    try:
        rc = main(["run", "examples/digits_fedavg.yaml", "--out", str(tmp_path / "r"),
                   "--set", "model.name=four_pools", "--set", "federation.rounds=1",
                   "--set", "federation.fast_kernels=false"])  # no kernel build before the refusal
    finally:
        ZOO.pop("four_pools")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert "four_pools" in err[0] and "1x8x8" in err[0]
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_hifi_resnet18_factorizes_both_convs_of_every_block():
    from neurofed.models.factorized import FactorizedConvSynapse, factorized_synapses

    model = build_model({"name": "hifi_resnet18", "width": 0.125}, (3, 16, 16), 10)
    marked = [i for i, l in enumerate(model.layers) if l.options.get("block") == "factorized_conv"]
    assert len(marked) == 16  # what SFedHIFI's server reads as its B·M layers
    syns = factorized_synapses(model)
    assert len(syns) == 16 and all(isinstance(model.blocks[i].synapse, FactorizedConvSynapse) for i in marked)
    names = [n for n, _ in model.named_parameters() if n.endswith(".mix")]
    assert [int(n.split(".")[1]) for n in names] == marked  # parameter order = layer order


def test_block_modules_do_not_import_the_model_builder():
    # issue 22: models.snn imports the block modules, never the reverse (no import circle)
    import ast
    from pathlib import Path

    models = Path(__file__).resolve().parents[1] / "neurofed" / "models"
    for name in ("factorized.py", "residual.py", "paper_nets.py", "hifi_cnn.py", "spec.py"):
        tree = ast.parse((models / name).read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert "neurofed.models.snn" not in imported, name


# ----------------------------------------------------------------------------- batch norm, analog global pool

# as the presets: no per-block delay (a 17-layer net's one-step delays would use up T = 4)
NORMED = {"name": "resnet18", "width": 0.125, "quantize": False, "norm": "batch", "global_pool": "analog",
          "delay_shift": False}


def test_batch_norm_sets_each_hidden_current_to_mean_0_std_1():
    from neurofed.models.norm import BatchNormed, ChannelBatchNorm

    model = build_model(NORMED, (3, 16, 16), 10)
    normed = [i for i, b in enumerate(model.blocks) if isinstance(b, BatchNormed)]
    joins = [b for b in model.blocks if isinstance(b, ResidualJoin)]
    assert normed == [0] + [i for i, l in enumerate(model.layers) if l.options.get("residual") == "open"]
    assert all(isinstance(j.norm, ChannelBatchNorm) for j in joins)
    # the 1x1 conv shortcuts are normed as the authors' downsample (conv + BN); identities add spikes as they are
    assert [isinstance(j.shortcut_norm, ChannelBatchNorm) for j in joins] == [j.shortcut is not None for j in joins]
    assert not hasattr(model.blocks[-1], "norm")  # the readout's current is the logit
    seen = {}
    model.blocks[0].neuron.register_forward_pre_hook(lambda _m, args: seen.setdefault("z", args[0].detach()))
    x = torch.rand(8, 3, 16, 16, 4) * 0.2  # too weak to fire SLAYER's init without a norm
    with torch.no_grad():
        model(x)
    z = seen["z"].transpose(0, 1).reshape(model.layers[0].out, -1)
    assert torch.allclose(z.mean(1), torch.zeros(len(z)), atol=1e-4)
    assert torch.allclose(z.std(1, unbiased=False), torch.ones(len(z)), atol=1e-2)  # (eps 1e-5 on a small variance)
    # a current normed on its batch does not depend on the input's scale: the stem fires the same
    # (but for the few neurons the norm's eps moves across threshold)
    with torch.no_grad():
        weak = model.blocks[0](x)
        strong = model.blocks[0](x * 5)
    assert float(weak.sum()) > 0 and float((weak != strong).float().mean()) < 1e-3


def test_batch_norm_parameters_are_shared_and_trained():
    from neurofed.training.params import ParamSpec

    model = build_model(NORMED, (3, 16, 16), 10)
    spec = ParamSpec.from_model(model)
    names = [n for n in spec.names if ".norm." in n or "shortcut_norm" in n]
    norms = [n for n in names if n.endswith((".weight", ".bias"))]
    assert "blocks.0.norm.weight" in norms and "blocks.0.norm.bias" in norms
    assert "blocks.0.norm.running_mean" in names  # running statistics, averaged too (tests/test_batch_norm.py)
    assert not [n for n, _ in model.named_buffers() if "norm" in n]  # nothing outside the shared vector
    out = model(torch.rand(4, 3, 16, 16, 4))
    F.cross_entropy(model.readout(out), torch.arange(4)).backward()
    grads = dict(model.named_parameters())
    assert all(grads[n].grad is not None for n in norms)
    moved = [n for n in norms if float(grads[n].grad.abs().sum()) > 0]  # (a join silent on 4 samples may get none)
    assert len(moved) >= 0.9 * len(norms)


def test_analog_global_pool_passes_the_mean_of_each_step():
    model = build_model(NORMED, (3, 16, 16), 10)
    i = next(i for i, l in enumerate(model.layers) if l.options.get("global_pool"))
    spikes = (torch.rand(2, model.layers[i].in_shape[0], 2, 2, 5) < 0.3).float()
    pooled = model.blocks[i](spikes)
    assert pooled.shape == (2, spikes.shape[1], 1, 1, 5)
    assert torch.allclose(pooled[:, :, 0, 0], spikes.mean(dim=(2, 3)))
    assert 0 < len(torch.unique(pooled)) and set(torch.unique(pooled).tolist()) <= {0, 0.25, 0.5, 0.75, 1.0}


def test_normed_and_analog_models_refused_by_export_with_the_reasons():
    from neurofed.deploy.nir_export import nir_problems
    from neurofed.models.norm import EXPORT_REFUSAL as NORM_REFUSAL
    from neurofed.models.snn import AnalogGlobalPool

    problems = structure_problems(build_model(NORMED, (3, 16, 16), 10))
    assert any(p.endswith(NORM_REFUSAL) for p in problems)
    assert any(p.endswith(AnalogGlobalPool.export_refusal) for p in problems)
    # a feed-forward net is refused for the norm alone by the unfolded netx check; NIR folds it
    # (tests/test_nir_paper_nets.py: the shift as the synapse bias)
    cnn = build_model({"name": "sfedca_mnist", "width": 0.25, "norm": "batch"}, (1, 28, 28), 10)
    assert [p.split(": ", 1)[1] for p in structure_problems(cnn)] == [NORM_REFUSAL]
    assert nir_problems(cnn) == []
    plain = build_model({"name": "sfedca_mnist", "width": 0.25}, (1, 28, 28), 10)
    assert structure_problems(plain) == [] and nir_problems(plain) == []


def with_running_statistics(model, shape):
    """``model`` whose norms hold the statistics of one training batch (evaluation uses them)."""
    from neurofed.models.norm import ChannelBatchNorm

    norms = [m for m in model.modules() if isinstance(m, ChannelBatchNorm)]
    for m in norms:
        m.momentum = 1.0
    with torch.no_grad():
        model.train()(torch.bernoulli(torch.rand(8, *shape, RATE["timesteps"])))
    for m in norms:
        m.momentum = 0.1
    return model.eval()


def test_energy_prices_the_layer_after_an_analog_pool_as_macs():
    torch.manual_seed(0)
    shape = (3, 16, 16)
    model = with_running_statistics(build_model(NORMED, shape, 10), shape)
    maps = measure_torch(model, torch.rand(3, *shape), RATE, seed=0)
    rows = count_layers(model.layers, maps.input_maps, maps.output_spikes, maps.samples, maps.timesteps,
                        skip_maps=maps.skip_maps)
    pool, fc = rows[-2], rows[-1]
    assert pool["kind"] == "pool" and pool["output"] == "analog" and pool["input"] == "spikes"
    assert fc["kind"] == "dense" and fc["input"] == "analog"
    assert fc["analog_macs"] == fc["macs"] == model.layers[-1].in_shape[0] * 10 and fc["synaptic_ops"] == 0
    assert all(r["input"] == "spikes" for r in rows[1:-1])
    assert pool["output_spikes"] == 0 and pool["input_spikes"] > 0  # it passes a value, not spikes
    voltage = with_running_statistics(build_model({**NORMED, "readout": "voltage"}, shape, 10), shape)
    maps = measure_torch(voltage, torch.rand(3, *shape), RATE, seed=0)
    assert maps.output_spikes[-1] == 0  # nor does a voltage readout (it counted its voltage before)


def test_the_firing_init_scales_only_the_layers_no_norm_scales_and_keeps_the_running_statistics():
    """With model.norm: batch the norm sets a normed layer's scale (a gain would be undone), so
    the firing init scales the un-normed output layer alone, measured as the first training
    step runs the normed ones (on the batch's statistics); it leaves the running statistics
    as built. The start-up health check measures the same way."""
    from neurofed.config import load_config
    from neurofed.fl.health import start_rates
    from neurofed.models.init import calibrate_firing
    from neurofed.models.norm import ChannelBatchNorm

    torch.manual_seed(0)
    model = build_model({"name": "sfedca_mnist", "width": 0.25, "norm": "batch"}, (1, 28, 28), 10)
    with torch.no_grad():  # an output layer too quiet to fire: the init must raise it
        model.blocks[-1].synapse.weight.mul_(0.01)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.rand(64, 1, 28, 28)
    cfg = load_config("examples/digits_fedavg.yaml", ["model.norm=batch", "model.init=firing", "data.timesteps=6",
                                                      "data.encoding=direct"])
    before = start_rates(model, cfg, x)
    record = calibrate_firing(model, x.unsqueeze(-1).repeat(1, 1, 1, 1, 6), (0.02, 0.2))
    after = start_rates(model, cfg, x)
    normed = [r for r in record if r.get("normed")]
    assert [r["layer"] for r in normed] == [i for i, b in enumerate(model.blocks)
                                            if isinstance(getattr(b, "norm", None), ChannelBatchNorm)] == [0, 1, 4]
    assert all(r["gain"] == 1.0 for r in normed) and min(before[:3]) > 0.01  # normed layers fire as built
    out = record[-1]
    assert out["layer"] == 5 and out["rate_before"] < 0.02 <= out["rate_after"] <= 0.2 and out["gain"] > 1
    assert before[-1] < 0.02 and abs(after[-1] - out["rate_after"]) < 1e-6  # the health check sees what it saw
    for name, p in model.named_parameters():
        if name.startswith("blocks.5.") and name.endswith("weight"):
            assert torch.allclose(p, weights[name] * out["gain"])
        else:  # normed layers' weights and every running statistic as built
            assert torch.equal(p, weights[name]), name


@pytest.mark.parametrize("norm", ["none", "batch"])
def test_lsuv_gives_each_twin_layer_no_norm_follows_unit_std_and_leaves_the_normed_ones(norm):
    """model.ann_init: lsuv, the ANN form of the firing init: in order from the input, every
    convolution and linear layer not followed by a norm is rescaled (weight and bias by one
    factor) until its output has std 1 on the batch; a normed layer is left as built."""
    from torch import nn

    from neurofed.models.init import calibrate_unit_std
    from neurofed.models.norm import as_training_starts

    torch.manual_seed(0)
    model = build_model({"name": "vgg5", "width": 0.25, "kind": "ann", "norm": norm}, (1, 28, 28), 10)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.rand(32, 1, 28, 28)
    record = calibrate_unit_std(model, x)
    outputs = {}
    hooks = [m.register_forward_hook(lambda m, _i, out, name=name: outputs.__setitem__(name, out))
             for name, m in model.net.named_children() if isinstance(m, (nn.Conv2d, nn.Linear))]
    with torch.no_grad(), as_training_starts(model):  # normed layers on the batch's statistics, as calibrated
        model(x)
    for h in hooks:
        h.remove()
    normed = {name for name, m in model.net.named_children() if isinstance(m, (nn.Conv2d, nn.Linear))
              and int(name) + 1 < len(model.net) and isinstance(model.net[int(name) + 1], ChannelBatchNorm)}
    assert len(outputs) == 5 and len(record) == 5 - len(normed)
    assert len(normed) == (4 if norm == "batch" else 0)
    for name, out in outputs.items():
        if name in normed:
            assert torch.equal(model.net[int(name)].weight, weights[f"net.{name}.weight"])
        else:
            assert abs(float(out.std()) - 1.0) < 1e-4, name
    assert any(r["std_before"] < 0.5 for r in record)  # PyTorch's init shrinks the signal: there was work to do


def test_the_twin_is_calibrated_only_when_asked_and_the_snn_ignores_ann_init():
    from neurofed.config import load_config
    from neurofed.models.init import calibrates, initialize

    ann = load_config("examples/digits_fedavg.yaml", ["model.kind=ann", "model.ann_init=lsuv"])
    assert calibrates(ann) and not calibrates(load_config("examples/digits_fedavg.yaml", ["model.kind=ann"]))
    assert not calibrates(load_config("examples/digits_fedavg.yaml", ["model.ann_init=lsuv"]))  # an SNN
    torch.manual_seed(0)
    model = build_model(ann["model"], (1, 8, 8), 10)
    record = initialize(model, ann, torch.randint(0, 17, (100, 1, 8, 8)).float())
    assert record and all(r["gain"] > 0 for r in record)


def test_a_twin_reading_the_encoded_input_sees_the_snns_own_poisson_draws_averaged_over_t():
    """model.ann_input: encoded gives the twin the very spikes its SNN reads (same encoding, same
    generator), averaged over T by the twin's forward; image (the default) the normalized image."""
    from neurofed.config import load_config
    from neurofed.data.encoding import encode_for

    sets = ["data.encoding=rate", "data.timesteps=16", "model.kind=ann"]
    cfg = load_config("examples/digits_fedavg.yaml", [*sets, "model.ann_input=encoded"])
    image_cfg = load_config("examples/digits_fedavg.yaml", sets)
    snn_cfg = load_config("examples/digits_fedavg.yaml", sets[:2])
    x = torch.randint(0, 17, (8, 1, 8, 8)).float()
    twin, image_twin = build_model(cfg["model"], (1, 8, 8), 10), build_model(image_cfg["model"], (1, 8, 8), 10)
    snn = build_model(snn_cfg["model"], (1, 8, 8), 10)
    seen = encode_for(twin, x, cfg["data"], torch.Generator().manual_seed(3))
    spikes = encode_for(snn, x, snn_cfg["data"], torch.Generator().manual_seed(3))
    assert seen.shape == (8, 1, 8, 8, 16) and torch.equal(seen, spikes)
    assert set(seen.unique().tolist()) <= {0.0, 1.0} and 0 < float(seen.mean()) < 1  # Bernoulli draws
    image = encode_for(image_twin, x, image_cfg["data"], torch.Generator().manual_seed(3))
    assert image.shape == (8, 1, 8, 8) and not torch.equal(image, seen.mean(-1))
    twin.load_state_dict(image_twin.state_dict())
    with torch.no_grad():  # the twin's logits are those of the spikes' time average
        assert torch.allclose(twin(seen), image_twin(seen.mean(-1)))


def test_model_choices_refused_in_one_line():
    from neurofed.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="model.global_pool: got 'mean'; allowed: spikes, analog"):
        load_config("examples/digits_fedavg.yaml", ["model.global_pool=mean"])


def test_normed_resnet_fits_digits_under_the_authors_sgd_where_the_plain_one_stays_at_ln10():
    """The reason the ResNet-18 presets set model.norm: batch and model.global_pool: analog
    (issue 31): under SFedHIFI's SGD (lr 0.1, momentum 0.9) the plain net does not move."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = F.interpolate(torch.tensor(digits.images[:32], dtype=torch.float32)[:, None] / 16, size=16)
    x = x.repeat(1, 3, 1, 1)[..., None].repeat(1, 1, 1, 1, 4)  # direct input, T = 4
    y = torch.tensor(digits.target[:32])
    preset = {"name": "resnet18", "width": 0.125, "quantize": False, "readout": "voltage", "threshold": 1.0,
              "current_decay": 1.0, "voltage_decay": 0.5, "tau_grad": 0.01, "scale_grad": 10.0,
              "delay_shift": False, "pool": "max"}
    losses = {}
    for norm, pool in (("batch", "analog"), ("none", "spikes")):
        torch.manual_seed(0)
        model = build_model({**preset, "norm": norm, "global_pool": pool}, (3, 16, 16), 10)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(25):
            logits = model.readout(model(x))
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        losses[norm] = float(loss)
        if norm == "batch":
            assert float((logits.argmax(1) == y).float().mean()) >= 0.5
    assert losses["batch"] < losses["none"] - 0.5, losses
