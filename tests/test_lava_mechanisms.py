"""The papers' networks on Lava: graded (direct) input, the shifted window of a network
trained without SLAYER's per-layer delay, and the voltage readout — each spike for spike
(per-layer raster checksums, and the readout's integer voltage) against the torch model."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from neurofed.config import DEFAULTS
from neurofed.deploy import DeployError
from neurofed.deploy.deployable import deployable_copy
from neurofed.deploy.export import export_model, read_net
from neurofed.deploy.lava_plan import INPUT_BITS, graded_first_layer, input_spikes, plan_for, torch_reference
from neurofed.deploy.lava_run import simulate
from neurofed.models import build_model

DIRECT = {"encoding": "direct", "timesteps": 8}
RATE = {"encoding": "rate", "timesteps": 8, "max_rate": 1.0}


def tiny(name="cnn", **cfg):
    torch.manual_seed(0)
    model_cfg = {**DEFAULTS["model"], "name": name, "threshold": 0.5, **cfg}
    return build_model(model_cfg, (1, 8, 8), 10, logit_scale=10.0).eval()


def images(n=6, seed=1):
    return np.random.default_rng(seed).random((n, 1, 8, 8)).astype(np.float32)


def round_trip(model, data_cfg, path, n=6, seed=7):
    """Export, run on Lava, compare with torch; returns (lava, torch, plan, inputs)."""
    plan = plan_for(model, data_cfg["timesteps"], data_cfg["encoding"])
    export_model(model, path, timesteps=data_cfg["timesteps"], encoding=data_cfg["encoding"])
    assert read_net(path)["lava_plan"] == plan.to_meta()
    spikes, _ = input_spikes(images(n), data_cfg, seed)
    lava, _ = simulate(path, spikes, seed, progress=False)  # the plan recorded in the file
    ref = torch_reference(deployable_copy(model), spikes, seed, plan)  # as exported: 8-bit weights, norms folded
    assert ref.counts[:, :len(plan.lags) - plan.voltage].sum(0).min() > 0, "test input too weak: a layer never spikes"
    np.testing.assert_array_equal(lava.counts, ref.counts)
    np.testing.assert_array_equal(lava.checksums, ref.checksums)  # same spikes at the same neurons and steps
    np.testing.assert_array_equal(lava.output, ref.output)
    for a, b in zip(lava.neuron_totals, ref.neuron_totals):
        np.testing.assert_array_equal(a, b)
    return lava, ref, plan, spikes


def test_network_without_delay_runs_over_a_window_shifted_one_step_per_layer(tmp_path):
    model = tiny(delay_shift=False)
    lava, ref, plan, spikes = round_trip(model, RATE, tmp_path / "m.net")
    depth = len(model.neurons_per_layer)
    assert plan.lags == tuple(range(1, depth + 1)) and plan.window == RATE["timesteps"] + depth
    # the torch counts are the model's own spikes over its T steps (nothing cut by the shift)
    model.record = True
    model(torch.from_numpy(spikes).float())
    np.testing.assert_array_equal(ref.counts, torch.stack(model.layer_spikes, 1).long().numpy())


@pytest.mark.parametrize("delay_shift", [True, False])
def test_direct_input_enters_the_first_layer_as_graded_spikes(delay_shift, tmp_path):
    model = tiny(delay_shift=delay_shift)
    lava, ref, plan, values = round_trip(model, DIRECT, tmp_path / "m.net")
    assert plan.input_bits == INPUT_BITS
    assert len(np.unique(values)) > 2  # multi-bit values, not spikes
    np.testing.assert_array_equal(values[..., 0], np.round(images() * (1 << INPUT_BITS)))
    # the torch reference is the model on the fixed-point image: its first layer's state is only finer
    x = torch.from_numpy(values).float() / (1 << INPUT_BITS)
    with graded_first_layer(model, plan.input_bits):
        model.record = True
        model(x)
    np.testing.assert_array_equal(ref.counts, torch.stack(model.layer_spikes, 1).long().numpy())


def test_voltage_readout_is_read_from_the_lava_neuron_at_the_last_step(tmp_path):
    model = tiny("mlp", readout="voltage", delay_shift=False)
    lava, ref, plan, spikes = round_trip(model, RATE, tmp_path / "m.net")
    assert plan.voltage and plan.lags[-1] == len(plan.lags)
    x = torch.from_numpy(spikes).float()
    voltage = model(x)[..., -1].double() * model.blocks[-1].neuron.s_scale
    np.testing.assert_array_equal(lava.output, voltage.round().long().numpy())
    assert np.abs(lava.output).max() > 0
    np.testing.assert_array_equal(lava.predictions, model.readout(model(x)).argmax(1).numpy())


def test_a_paper_network_direct_input_no_delay_voltage_readout_runs_spike_for_spike(tmp_path):
    model = tiny(readout="voltage", delay_shift=False, quantize=False)
    lava, ref, plan, _ = round_trip(model, DIRECT, tmp_path / "m.net")
    assert plan.input_bits is not None and plan.voltage
    assert plan.lags == tuple(range(1, len(model.neurons_per_layer) + 1))
    np.testing.assert_array_equal(lava.predictions, ref.predictions)


@pytest.mark.parametrize("delay_shift", [False, True])
def test_voltage_tie_break_reads_the_output_neurons_after_the_last_counted_step(delay_shift, tmp_path):
    """``model.tie_break: voltage``: Lava's output voltage at the last counted step equals
    torch's, and both break the count's ties by it the same way."""
    model = tiny("mlp", tie_break="voltage", delay_shift=delay_shift, threshold=1.5)
    lava, ref, plan, spikes = round_trip(model, RATE, tmp_path / "m.net", n=12)
    assert plan.tie_voltage and not plan.voltage
    np.testing.assert_array_equal(lava.tie_voltage, ref.tie_voltage)
    lowest = lava.output.argmax(1)
    decided = np.nonzero(lava.predictions != lowest)[0]
    assert len(decided), "no tie decided by the voltage: the test input does not exercise the tie-break"
    tied = lava.output == lava.output.max(1, keepdims=True)
    for i in decided:  # a tied label, with a higher voltage than the lowest tied one
        label = lava.predictions[i]
        assert tied[i, label] and lava.tie_voltage[i, label] > lava.tie_voltage[i, lowest[i]]
    np.testing.assert_array_equal(lava.predictions, model.readout(model(torch.from_numpy(spikes).float())).argmax(1))
    with pytest.raises(DeployError, match="model.tie_break voltage: the voltage is read by a host process"):
        plan.check_backend("loihi2")


def test_graded_input_reaching_the_threshold_exactly_does_not_fire(tmp_path):
    """Lava fires on v > threshold; the scaled torch neuron must too (a float32 epsilon
    below one unit of its state would vanish and fire on v == threshold)."""
    model = tiny("mlp", current_decay=1.0, voltage_decay=0.0, threshold=1.0)
    first = next(b for b in model.blocks if hasattr(b, "synapse"))
    with torch.no_grad():
        first.synapse.weight.zero_()
        first.synapse.weight[0, 0] = 1.0  # neuron 0 sees pixel 0 only, at weight 1
    x = np.zeros((1, 1, 8, 8), dtype=np.float32)
    x[0, 0, 0, 0] = 0.5  # v = 0.5, 1.0 (== threshold: no spike), 1.5 (spike, reset to 0), 0.5, ...
    values, _ = input_spikes(x, DIRECT, 0)
    plan = plan_for(model, DIRECT["timesteps"], "direct")
    export_model(model, tmp_path / "m.net", timesteps=DIRECT["timesteps"], encoding="direct")
    lava, _ = simulate(tmp_path / "m.net", values, 0, progress=False)
    ref = torch_reference(deployable_copy(model), values, 0, plan)
    assert ref.counts[0, 0] == lava.counts[0, 0] == 2  # steps 2 and 5 of 0..7 (firing at v == 1.0: 4)
    np.testing.assert_array_equal(lava.checksums, ref.checksums)


def test_a_model_that_cannot_be_mapped_is_refused_in_one_line_before_anything_is_written(tmp_path):
    model = tiny("cnn", norm="batch", current_decay=0.25)  # a norm's shift on a current with memory
    with pytest.raises(DeployError) as err:
        export_model(model, tmp_path / "out" / "m.net")
    message = str(err.value)
    assert "\n" not in message and "layer 0 (conv): batch norm's shift" in message and "got 0.25" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("readout, tie_break", [("voltage", "lowest_label"), ("spikes", "voltage")])
def test_a_run_trained_as_the_papers_ends_with_its_lava_check(readout, tie_break, tmp_path, tiny_cfg):
    """`neurofed run` with direct input, no per-layer delay, a voltage readout (or a spike
    count with its ties broken by voltage) and float weights (the presets' settings) exports
    and runs on Lava, spike for spike."""
    import json

    from neurofed.pipeline import run

    out = tmp_path / "run"
    cfg = tiny_cfg(export=True, **{"lava.samples": 4, "data.encoding": "direct", "model.delay_shift": False,
                                   "model.readout": readout, "model.tie_break": tie_break, "model.quantize": False})
    run(cfg, out, progress=False)
    result = json.loads((out / "lava.json").read_text())
    assert result["spike_for_spike"] and result["agreement"] == 1.0
    assert result["readout"] == readout and result["tie_break"] == tie_break
    assert result["encoding"] == "direct" and result["input_bits"] == INPUT_BITS
    assert result["lava_window"] == cfg["data"]["timesteps"] + len(result["layer_kinds"])
    assert 0 <= result["trained_agreement"] <= 1 and "trained_accuracy" in result


def test_graded_input_warns_where_the_finer_first_state_can_pass_24_bits():
    from neurofed.deploy.lava_plan import graded_state_warning

    # the state is kept 2^6 finer: 2^23 / (4096 * 64) = 32 SLAYER units
    assert graded_state_warning(30.0, {"encoding": "direct"}) is None
    warning = graded_state_warning(20.0, {"encoding": "direct", "mean": [0.5], "std": [0.25]})  # |x| up to 2
    assert warning.startswith("layer 0: worst-case current 40") and "passes 32" in warning and "\n" not in warning


def test_batch_norm_folds_into_netx_weights_and_neuron_biases(tmp_path):
    """A normed chain exports through netx's own reader: the norm's scale in the weights, its
    shift as each neuron's bias (read by netx), spike for spike with direct input."""
    import h5py

    model = tiny(norm="batch", current_decay=1.0, delay_shift=False)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(16, 1, 8, 8, 8) * 2)
        for norm in (m for m in model.modules() if type(m).__name__ == "ChannelBatchNorm"):
            norm.bias.uniform_(-0.3, 0.3)
    model.eval()
    round_trip(model, DIRECT, tmp_path / "m.net")
    with h5py.File(tmp_path / "m.net") as h:
        biased = [k for k in h["layer"] if "bias" in h["layer"][k]]
    assert len(biased) == sum(type(b).__name__.startswith("BatchNormed") for b in model.blocks) > 0


def test_a_first_layer_past_the_grid_keeps_its_odd_norm_biases_under_graded_input(tmp_path):
    """A normed first layer whose weights pass the 8-bit grid (exponent -1: a coarser grid and
    state) under direct input (its state 2^6 finer on top): its bias is written with one shift
    of -1 + 6, so an odd bias stays exact and Lava runs spike for spike. Shifting by -1 first
    floored each odd bias (a VGG-5 on Fashion-MNIST lost 0.7 % of its first layer's spikes)."""
    import h5py

    from neurofed.deploy.deployable import integer_bias
    from neurofed.models.quantize import weight_exponent

    model = tiny(norm="batch", current_decay=1.0, voltage_decay=0.0, delay_shift=False, quantize=False)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.rand(16, 1, 8, 8, 8) * 2)
        first = model.blocks[0]
        scale, _ = first.norm.affine()
        folded = first.synapse.weight * scale.view(-1, *([1] * (first.synapse.weight.dim() - 1)))
        first.synapse.weight.mul_(6.0 / float(folded.abs().max()))  # folded weights past the grid's ±4
        odd = (torch.arange(scale.numel()) * 2 + 1 - scale.numel()).float()  # shifts of odd 1/64 units
        first.norm.bias.copy_(odd / 64 + scale * first.norm.running_mean)
    model.eval()
    copy = deployable_copy(model)
    k, bias = weight_exponent(copy.blocks[0].synapse), integer_bias(copy.blocks[0].synapse)
    assert k < 0 and bool((bias % 2 == 1).any()), (k, bias)
    round_trip(model, DIRECT, tmp_path / "m.net")
    with h5py.File(tmp_path / "m.net") as h:
        written = np.asarray(h["layer/1/bias"][()])
    np.testing.assert_array_equal(written, bias.numpy() << (INPUT_BITS + k))


@pytest.mark.parametrize("encoding", [RATE, DIRECT], ids=["rate", "direct"])
def test_float_layers_of_unlike_scales_export_on_their_own_exponents_spike_for_spike(encoding, tmp_path):
    """Per-layer exponents (neurofed.models.quantize): a layer of small weights (SLAYER's init)
    goes on a 2^k finer grid with its state 2^k finer, one past the grid on a coarser one; on leaky neurons
    (current and voltage decay < 1) Lava computes exactly what the torch reference does."""
    from neurofed.models.quantize import quantize_export, synapses, weight_exponent

    model = tiny(quantize=False, delay_shift=False, current_decay=0.5, voltage_decay=0.1)
    convs = [b for b, layer in zip(model.blocks, model.layers) if layer.kind in ("conv", "dense")]
    with torch.no_grad():  # the second layer's weights past the grid (±4)
        convs[1].synapse.weight.mul_(12.0 / float(convs[1].synapse.weight.abs().max()))
    copy = deployable_copy(model)
    exponents = [weight_exponent(s) for s in synapses(copy)]
    assert max(exponents) > 0 and min(exponents) < 0, exponents
    round_trip(model, encoding, tmp_path / "m.net")
    # the finer grid keeps what SLAYER's one grid rounds away
    first = copy.blocks[0].synapse
    w = first.weight.detach()
    assert (first.pre_hook_fx(w) - w).abs().max() < (quantize_export(w) - w).abs().max()
