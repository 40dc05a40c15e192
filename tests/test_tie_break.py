"""``model.tie_break: voltage``: a spike-count readout's ties broken by the output neurons'
voltage at evaluation, never a count overruled, training's logits untouched. (On Lava:
tests/test_lava_mechanisms.py.)"""

from __future__ import annotations

import pytest
import torch

from neurofed.config import DEFAULTS, ConfigError, load_config
from neurofed.models import Layer, build_model, register_topology
from neurofed.models.spec import ZOO

from conftest import tiny_overrides

T = 6


def _pair(**cfg):
    """The same weights read with argmax's rule and with the voltage tie-break."""
    models = []
    for tie_break in ("lowest_label", "voltage"):
        torch.manual_seed(0)
        model_cfg = {**DEFAULTS["model"], "name": "mlp", "threshold": 1.5, "tie_break": tie_break, **cfg}
        models.append(build_model(model_cfg, (1, 8, 8), 10, logit_scale=float(T)))
    return models


@pytest.mark.parametrize("delay_shift", [False, True])
def test_ties_go_to_the_highest_voltage_and_no_count_is_overruled(delay_shift):
    plain, tie = _pair(delay_shift=delay_shift)
    x = (torch.rand(64, 1, 8, 8, T, generator=torch.Generator().manual_seed(3)) < 0.5).float()
    plain.eval(), tie.eval()
    with torch.no_grad():
        out = tie(x)
        counts = out.sum(-1)
        logits = tie.readout(out)
        voltage = tie.tie_voltage
        assert torch.equal(out, plain(x))  # the same spikes: the tie-break reads, it does not change the net
        lowest = plain.readout(out).argmax(1)
    picked = logits.argmax(1)
    top = counts.max(1, keepdim=True).values
    assert torch.all(counts.gather(1, picked[:, None]) == top)  # the most spikes first, always
    decided = torch.nonzero(picked != lowest).flatten()
    assert len(decided), "no tie decided by the voltage: the test input does not exercise it"
    for i in decided:
        tied = counts[i] == top[i]
        assert voltage[i, picked[i]] == voltage[i][tied].max() and voltage[i, picked[i]] > voltage[i, lowest[i]]
    assert torch.all(voltage < tie.blocks[-1].neuron.threshold)  # after the step's reset, as a Lava neuron holds it
    # training's loss reads the rates alone
    tie.train(), plain.train()
    assert torch.equal(tie.readout(tie(x)), plain.readout(plain(x))) and tie.tie_voltage is None


def test_tie_break_voltage_refused_where_there_are_no_counts_to_order():
    with pytest.raises(ConfigError, match=r"model.tie_break: voltage with model.readout 'voltage'"):
        load_config(None, tiny_overrides(**{"model.tie_break": "voltage", "model.readout": "voltage"}))
    with pytest.raises(ConfigError, match=r"model.tie_break: got 'nearest'; allowed: lowest_label, voltage"):
        load_config(None, tiny_overrides(**{"model.tie_break": "nearest"}))
    assert load_config(None, tiny_overrides(**{"model.tie_break": "voltage"}))["model"]["tie_break"] == "voltage"
    # a topology that ends in a pool has no output neurons of its own to read
    register_topology("ends_in_pool", lambda width, k: [Layer("conv", k, 3, padding=1), Layer("pool", kernel=2, stride=2)])
    try:
        with pytest.raises(ValueError, match="model.tie_break: voltage reads the output layer's neurons; "
                                             "'ends_in_pool' ends in a pool layer, not a dense one"):
            build_model({**DEFAULTS["model"], "name": "ends_in_pool", "tie_break": "voltage"}, (1, 8, 8), 10)
    finally:
        ZOO.pop("ends_in_pool")


def test_lava_tie_break_flag_reads_a_run_trained_without_the_key_spike_for_spike(tmp_path, tiny_cfg):
    """``neurofed lava --tie-break voltage`` on a run trained with argmax's rule: both sides
    break ties by voltage, spike for spike, on the same exported network (not re-exported)."""
    import json

    from neurofed.cli import main
    from neurofed.deploy.export import NET_FILE
    from neurofed.pipeline import run

    out = tmp_path / "run"
    run(tiny_cfg(export=True, **{"lava.samples": 12, "model.threshold": 0.6, "data.timesteps": 8}), out, progress=False)
    plain = json.loads((out / "lava.json").read_text())
    net = (out / NET_FILE).read_bytes()
    assert plain["tie_break"] == "lowest_label"

    assert main(["lava", str(out), "--samples", "12", "--tie-break", "voltage", "--workers", "1", "--quiet"]) == 0
    tied = json.loads((out / "lava.json").read_text())
    assert tied["tie_break"] == "voltage" and tied["spike_for_spike"] and tied["agreement"] == 1.0
    assert (out / NET_FILE).read_bytes() == net  # a way of reading the output: the network is the same
    assert tied["layer_spikes"] == plain["layer_spikes"]  # the same spikes, read by another rule
    for lowest, voltage, counts in zip(plain["predictions"], tied["predictions"], _output_counts(out, 12)):
        top = [k for k, c in enumerate(counts) if c == max(counts)]
        assert lowest == top[0] and voltage in top  # never a count overruled
    # lava.json now holds the second check; the first one's figures are kept beside it
    history = [json.loads(line) for line in (out / "lava_checks.jsonl").read_text().splitlines()]
    assert [h["tie_break"] for h in history] == ["lowest_label", "voltage"]
    assert [h["accuracy"] for h in history] == [plain["accuracy"], tied["accuracy"]]
    assert all(h["checked"] and "predictions" not in h for h in history)


def _output_counts(run_dir, n):
    """The exported network's output counts on the Lava input, from torch (the same spikes)."""
    from neurofed.deploy.deployable import deployable_copy
    from neurofed.deploy.export import load_global_model
    from neurofed.deploy.lava_plan import input_spikes, plan_for, torch_reference
    from neurofed.seeds import seed_for

    model, cfg, ds, _ = load_global_model(run_dir)
    deployable = deployable_copy(model)
    seed = seed_for(cfg["seed"], "lava")
    spikes, _ = input_spikes(ds.x_test[:n], cfg["data"], seed)
    return torch_reference(deployable, spikes, seed, plan_for(deployable, cfg["data"]["timesteps"])).output.tolist()
