"""Energy module: hand-computed op counts and energies, the papers' approximation,
profile schema errors, the first-layer MAC rule, and reports over real runs."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
import yaml

from neurofed.models.opcounts import count_layers, synapse_masks
from neurofed.energy.profiles import ProfileError, load_profile, load_profiles, parse_profile, profile_names
from neurofed.energy.pricing import price
from neurofed.models.spec import Layer, resolve

CMOS_INT = load_profile("cmos45_int")  # MAC 3.2 pJ, AC 0.1 pJ
PJ = 1e-12


def rows_for(layers, maps, outputs=None, samples=1, timesteps=1, masks=None, analog=False):
    outputs = outputs if outputs is not None else [0.0] * len(layers)
    return count_layers(layers, maps, outputs, samples, timesteps, masks=masks, analog_input=analog)


# --------------------------------------------------------------------------- dense


def test_dense_layer_hand_computed():
    # 3 inputs -> 2 outputs; input spikes over 1 sample: [2, 0, 1] -> 3 spikes x 2 outputs = 6 ACs
    layer = Layer("dense", 2, in_shape=(3,), out_shape=(2,))
    spikes = torch.tensor([2.0, 0.0, 1.0])
    (row,) = rows_for([layer], [spikes], timesteps=2)
    assert row["macs"] == 6
    assert row["synaptic_ops"] == 6.0
    assert row["input_rate"] == pytest.approx(3 / (3 * 2))
    # one zero weight (output 0 <- input 2): input 2's spike reaches only one output
    mask = torch.ones(2, 3, dtype=torch.float64)
    mask[0, 2] = 0
    (row,) = rows_for([layer], [spikes], timesteps=2, masks=[mask])
    assert row["synaptic_ops"] == 5.0 and row["synaptic_ops_all_weights"] == 6.0
    e = price([row], CMOS_INT)
    assert e["snn_energy_j"] == pytest.approx(5 * 0.1 * PJ)
    assert e["ann_energy_j"] == pytest.approx(6 * 3.2 * PJ)
    assert e["ann_over_snn"] == pytest.approx(6 * 3.2 / 0.5)


# --------------------------------------------------------------------------- conv


def conv_layer(in_shape, out, k, stride, padding):
    return resolve([Layer("conv", out, kernel=k, stride=stride, padding=padding)], in_shape)[0]


def test_conv_layer_hand_computed_with_padding_and_edges():
    # 1x3x3 input, 3x3 kernel, padding 1, stride 1, 2 output channels -> out 2x3x3.
    layer = conv_layer((1, 3, 3), 2, 3, 1, 1)
    assert layer.out_shape == (2, 3, 3)
    s = torch.zeros(1, 3, 3)
    s[0, 0, 0] = 1  # a corner spike reaches 2x2 output positions
    s[0, 0, 1] = 1  # an edge spike reaches 2x3
    s[0, 1, 1] = 1  # the centre spike reaches all 3x3
    (row,) = rows_for([layer], [s])
    assert row["macs"] == 3 * 3 * 1 * 9 * 2  # M^2 I k^2 O = 162
    assert row["synaptic_ops"] == (4 + 6 + 9) * 2
    e = price([row], CMOS_INT)
    assert e["snn_energy_j"] == pytest.approx(38 * 0.1 * PJ)
    assert e["ann_energy_j"] == pytest.approx(162 * 3.2 * PJ)


def test_conv_stride_two_edges():
    # 1x4x4 input, k=3, padding 1, stride 2 -> 2x2 outputs; output row p covers
    # input rows 2p-1..2p+1, so input row 0 -> p=0 only, row 1 -> p=0,1, rows 2,3 -> p=1.
    layer = conv_layer((1, 4, 4), 3, 3, 2, 1)
    assert layer.out_shape == (3, 2, 2)
    s = torch.zeros(1, 4, 4)
    s[0, 1, 1] = 2  # reaches 2x2 positions, twice
    s[0, 0, 3] = 1  # reaches 1x1
    s[0, 3, 0] = 1  # row 3 -> p=1; col 0 -> q=0: 1x1
    (row,) = rows_for([layer], [s])
    assert row["synaptic_ops"] == (2 * 4 + 1 + 1) * 3


def test_counts_match_slayer_synapses():
    """Our count equals SLAYER's own synapse applied to the spikes with all-ones
    weights: the layouts (NCHWT, stride, padding, pool floor) agree."""
    from neurofed.models.snn import SpikingNet

    layers = resolve([Layer("conv", 3, kernel=3, stride=2, padding=1), Layer("pool", kernel=2, stride=2),
                      Layer("conv", 2, kernel=3, padding=1), Layer("flatten"), Layer("dense", 4)], (2, 7, 7))
    net = SpikingNet(layers, {"quantize": False})
    gen = torch.Generator().manual_seed(0)
    x = (torch.rand(3, 2, 7, 7, 5, generator=gen) < 0.3).float()
    maps, outs = [], []
    with torch.no_grad():
        for layer, block in zip(layers, net.blocks):
            maps.append(x.double().sum(dim=(0, x.dim() - 1)).reshape(layer.in_shape))
            syn = getattr(block, "synapse", None)
            if syn is not None:
                syn.weight.data.fill_(1.0)
                outs.append(float(syn(x).sum()))
            else:
                outs.append(None)
            x = (torch.rand(block(x).shape, generator=gen) < 0.3).float() if layer.kind != "flatten" else block(x)
    rows = rows_for(layers, maps, samples=1, timesteps=5)
    expected = [o for o in outs if o is not None]
    assert [r["synaptic_ops_all_weights"] for r in rows] == pytest.approx(expected)


# --------------------------------------------------------------------------- approximation


def test_approximation_equals_exact_for_uniform_spikes():
    dense = Layer("dense", 5, in_shape=(7,), out_shape=(5,))
    conv = conv_layer((3, 6, 6), 4, 3, 1, 0)  # no padding: every tap lands on a real input
    for layer in (dense, conv):
        uniform = torch.full(layer.in_shape, 2.5, dtype=torch.float64)
        (row,) = rows_for([layer], [uniform], samples=2, timesteps=4)
        assert row["synaptic_ops_all_weights"] == pytest.approx(row["synaptic_ops_approx"])
    # dense layers match for any spike pattern, not only uniform ones
    (row,) = rows_for([dense], [torch.arange(7.0)], timesteps=3)
    assert row["synaptic_ops_all_weights"] == pytest.approx(row["synaptic_ops_approx"])


def test_approximation_overcounts_padded_taps():
    # 3x3 map, k=3, pad=1: valid (input, output) tap pairs are 4*4 + 4*6 + 1*9 = 49 of 81.
    layer = conv_layer((1, 3, 3), 1, 3, 1, 1)
    (row,) = rows_for([layer], [torch.ones(1, 3, 3)])
    assert row["synaptic_ops_all_weights"] == 49
    assert row["synaptic_ops_approx"] == pytest.approx(81)


# --------------------------------------------------------------------------- first layer


def test_first_layer_analog_input_is_priced_as_macs():
    layers = resolve([Layer("flatten"), Layer("dense", 3), Layer("dense", 2)], (1, 2, 2))
    maps = [torch.full((1, 2, 2), 0.5), torch.full((4,), 0.5), torch.tensor([1.0, 0.0, 2.0])]
    out = [0.0, 3.0, 1.0]
    # analog input: the first layer with synapses (dense 4->3) costs MACs, not ACs
    rows = count_layers(layers, maps, out, 1, 1, analog_input=True)
    assert [r["name"] for r in rows] == ["fc1", "fc2"]
    r1, r2 = rows
    assert r1["input"] == "analog" and r1["analog_macs"] == r1["macs"] == 12 and r1["synaptic_ops"] == 0
    assert r2["input"] == "spikes" and r2["synaptic_ops"] == 3 * 2
    e = price(rows, CMOS_INT)
    assert e["snn_energy_j"] == pytest.approx((12 * 3.2 + 6 * 0.1) * PJ)
    # the same network fed spikes: its first layer costs accumulates too
    rows = count_layers(layers, [maps[0], torch.tensor([1.0, 1.0, 0.0, 0.0]), maps[2]], out, 1, 1)
    assert rows[0]["input"] == "spikes" and rows[0]["synaptic_ops"] == 2 * 3 and rows[0]["analog_macs"] == 0


# --------------------------------------------------------------------------- profiles


def test_bundled_profiles_load_with_sources():
    names = profile_names()
    for n in ("cmos45_int", "cmos45_fp32", "loihi", "truenorth", "loihi2"):
        assert n in names
    profs = {p.name: p for p in load_profiles(names)}
    assert profs["cmos45_int"].energy_pj == {"mac": 3.2, "ac": 0.1}
    assert profs["cmos45_fp32"].energy_pj == {"mac": 4.6, "ac": 0.9}
    assert profs["loihi"].energy_pj["synaptic_op"] == 23.6 and profs["loihi"].energy_pj["neuron_update"] == 52
    assert set(profs["truenorth"].energy_pj) == {"synaptic_op"}  # 26 pJ already includes neuron + routing
    assert not profs["loihi2"].priced and profs["loihi2"].measured_only
    for p in profs.values():
        assert all(src for src in p.sources.values())


def _digital(**energy):
    base = {"mac": {"value": 3.2, "unit": "pJ", "source": "Horowitz 2014"},
            "ac": {"value": 0.1, "unit": "pJ", "source": "Horowitz 2014"}}
    base.update(energy)
    return {"name": "x", "title": "x", "kind": "digital", "energy": base}


@pytest.mark.parametrize("data, expected", [
    (_digital(mac={"value": 3.2, "unit": "pJ"}), "energy.mac.source: missing"),
    (_digital(ac={"value": 0.1, "unit": "nJ", "source": "s"}), "energy.ac.unit: got 'nJ'; allowed: pJ"),
    (_digital(ac={"value": -1, "unit": "pJ", "source": "s"}), "energy.ac.value: got -1"),
    (_digital(flop={"value": 1, "unit": "pJ", "source": "s"}), "energy.flop: unknown operation"),
    ({**_digital(), "kind": "gpu"}, "kind: got 'gpu'; allowed: digital, neuromorphic"),
    ({**_digital(), "energy": {"mac": {"value": 3.2, "unit": "pJ", "source": "s"}}}, "energy.ac: missing"),
    ({"name": "n", "title": "n", "kind": "neuromorphic",
      "energy": {"synaptic_op": {"value": 1, "unit": "pJ", "source": "s"}}}, "ann_baseline: got None"),
    ({"name": "n", "title": "n", "kind": "neuromorphic", "ann_baseline": "cmos45_int", "energy": {}},
     "energy.synaptic_op: missing"),
])
def test_profile_schema_errors(data, expected):
    with pytest.raises(ProfileError) as exc:
        parse_profile(data, "p.yaml")
    assert any(expected in line and line.startswith("p.yaml: ") for line in str(exc.value).splitlines())


def test_profile_by_path_extra_sections_and_bad_refs(tmp_path):
    data = _digital()
    data["limits"] = {"cores_per_chip": {"value": 128}}  # the Lava engineer's section: ignored here
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    assert load_profile(str(path)).energy_pj == {"mac": 3.2, "ac": 0.1}
    with pytest.raises(ProfileError, match="unknown name; known: .*cmos45_int"):
        load_profile("cmos9000")
    with pytest.raises(ProfileError, match="file not found"):
        load_profile(str(tmp_path / "missing.yaml"))
    path.write_text("name: [unclosed")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(path))


def test_neuromorphic_pricing_adds_neuron_updates_only_where_priced():
    layer = Layer("dense", 2, in_shape=(3,), out_shape=(2,))
    (row,) = rows_for([layer], [torch.tensor([1.0, 1.0, 0.0])], outputs=[4.0], timesteps=5)
    # TrueNorth: 26 pJ per synaptic event, nothing else
    tn = price([row], load_profile("truenorth"))
    assert tn["snn_energy_j"] == pytest.approx(4 * 26 * PJ)
    # Loihi: 23.6 pJ per synaptic op + 52 pJ per neuron update (2 neurons x 5 steps) + 1.7 pJ per spike
    lo = price([row], load_profile("loihi"))
    assert lo["snn_energy_j"] == pytest.approx((4 * 23.6 + 10 * 52 + 4 * 1.7) * PJ)
    assert lo["ann_energy_j"] == pytest.approx(6 * 3.2 * PJ)  # the ANN twin on cmos45_int
    l2 = price([row], load_profile("loihi2"))
    assert l2["snn_energy_j"] is None and l2["ann_over_snn"] is None and "no per-operation" in l2["note"]


def test_config_validates_energy_profiles(tiny_cfg):
    from neurofed.config import ConfigError

    with pytest.raises(ConfigError, match="energy.profiles: got \\['nope'\\]; hw profile 'nope': unknown name"):
        tiny_cfg(**{"energy.profiles": "[nope]"})
    with pytest.raises(ConfigError, match="energy.spikes"):
        tiny_cfg(**{"energy.spikes": "gpu"})


# --------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two tiny digits runs (mlp, 1 round): rate and direct encoding."""
    from neurofed.config import load_config
    from neurofed.pipeline import run

    from conftest import tiny_overrides

    root = tmp_path_factory.mktemp("energy")
    dirs = []
    for enc in ("rate", "direct"):
        cfg = load_config(None, tiny_overrides(**{"federation.rounds": 1, "data.encoding": enc,
                                                  "energy.profiles": "[cmos45_int, loihi, loihi2]"}))
        out = root / enc
        run(cfg, out, progress=False)
        dirs.append(out)
    return dirs


def test_pipeline_writes_energy_json(two_runs):
    rate, direct = two_runs
    for d in two_runs:
        e = json.loads((d / "energy.json").read_text())
        for key in ("layers", "snn_energy_j", "ann_energy_j", "ann_over_snn", "profile"):
            assert key in e
        assert e["profile"] == "cmos45_int" and list(e["profiles"]) == ["cmos45_int", "loihi", "loihi2"]
        # mlp at width 0.25 on 8x8 digits: 64 -> 32 -> 10
        assert [r["macs"] for r in e["layers"]] == [64 * 32, 32 * 10]
        assert e["ann_energy_j"] == pytest.approx((64 * 32 + 32 * 10) * 3.2 * PJ)
        assert e["snn_energy_j"] == pytest.approx(sum(r["energy"]["cmos45_int"]["snn_j"] for r in e["layers"]))
        assert e["ann_over_snn"] == pytest.approx(e["ann_energy_j"] / e["snn_energy_j"])
        assert (d / "plots" / "energy_layers.png").stat().st_size > 0
        # the torch pass sees what evaluate() saw: same firing rates as the last metrics line
        last = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])
        assert [r["firing_rate"] for r in e["layers"]] == pytest.approx(last["layer_firing_rates"], abs=1e-6)
    r = json.loads((rate / "energy.json").read_text())
    d = json.loads((direct / "energy.json").read_text())
    assert r["layers"][0]["input"] == "spikes" and r["layers"][0]["analog_macs"] == 0
    assert d["layers"][0]["input"] == "analog" and d["layers"][0]["analog_macs"] == 64 * 32
    assert d["neurobench"]["SynapticOperations"]["Effective_MACs"] == 64 * 32


def test_training_energy_from_metrics(two_runs):
    from neurofed.energy.training import training_energy

    d = two_runs[0]
    e = json.loads((d / "energy.json").read_text())
    t = training_energy(d, e, targets=[0.0])
    sizes = np.asarray(json.loads((d / "partition.json").read_text())["label_counts"]).sum(1)
    last = json.loads((d / "metrics.jsonl").read_text().splitlines()[-1])
    n = int(sizes[last["trained"]].sum()) * 1  # local_epochs = 1
    assert t["samples"] == [n]
    assert t["ann_cumulative_j"][0] == pytest.approx(n * 3 * (64 * 32 + 32 * 10) * 3.2 * PJ)
    assert t["to_target"][0]["round"] == 1
    # the final round's rates reproduce the measured inference energy
    assert t["snn_cumulative_j"][0] == pytest.approx(n * 3 * e["snn_energy_j"], rel=1e-4)


def test_energy_report_over_two_runs(two_runs, tmp_path):
    from neurofed.energy.table import energy_report

    res = energy_report([str(d) for d in two_runs], tmp_path / "rep", profiles=["cmos45_int", "loihi"])
    rows = list(csv.DictReader((tmp_path / "rep" / "energy_report.csv").open()))
    assert [(r["run"], r["profile"]) for r in rows] == [("rate", "cmos45_int"), ("rate", "loihi"),
                                                         ("direct", "cmos45_int"), ("direct", "loihi")]
    for r in rows:
        e = json.loads((two_runs[0 if r["run"] == "rate" else 1] / "energy.json").read_text())
        p = e["profiles"][r["profile"]]
        assert float(r["ann_over_snn"]) == pytest.approx(p["ann_over_snn"], rel=1e-3)
        assert float(r["accuracy"]) == pytest.approx(json.loads(
            (two_runs[0 if r["run"] == "rate" else 1] / "summary.json").read_text())["final_accuracy"])
    md = (tmp_path / "rep" / "energy_report.md").read_text()
    assert md.count("\n| rate |") == 2 and "ann_over_snn" in md
    assert (tmp_path / "rep" / "energy_report.png").stat().st_size > 0


def test_cli_energy_and_errors(two_runs, tmp_path, capsys):
    from neurofed.cli import main

    assert main(["energy", str(two_runs[0]), "--profile", "cmos45_fp32", "--samples", "50"]) == 0
    e = json.loads((two_runs[0] / "energy.json").read_text())
    assert e["profile"] == "cmos45_fp32" and e["spikes"]["samples"] == 50
    assert main(["energy", str(two_runs[0]), "--profile", "nope"]) == 2
    assert main(["energy", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("neurofed: error: hw profile 'nope': unknown name")
    assert "no config.yaml" in err[-1]


def test_lava_spike_file_is_spread_uniformly(two_runs):
    """A lava.json with per-layer totals: totals are kept; dense layers (whose count
    depends only on totals) match the exact torch count when totals agree."""
    from neurofed.energy.spikes import measure_torch, read_lava
    from neurofed.models.opcounts import count_layers as count
    from neurofed.energy.report import load_run
    from neurofed.seeds import seed_for

    d = two_runs[0]
    run = load_run(d)
    maps = measure_torch(run.model, run.x_test[:40], run.cfg["data"], seed_for(run.cfg["seed"], "eval"))
    spiking = [i for i, l in enumerate(run.model.layers) if l.has_neurons]
    per_layer = [maps.output_spikes[i] for i in spiking]
    (d / "lava.json").write_text(json.dumps({"samples": 40, "layer_spikes": [[c / 40 for c in per_layer]] * 40}))
    try:
        lava = read_lava(d, run.model, run.cfg["data"], first_map=maps.input_maps[0])
    finally:
        (d / "lava.json").unlink()
    assert lava.spread == "uniform" and lava.samples == 40
    exact = count(run.model.layers, maps.input_maps, maps.output_spikes, 40, maps.timesteps)
    approx = count(run.model.layers, lava.input_maps, lava.output_spikes, 40, lava.timesteps)
    for a, b in zip(exact, approx):
        assert b["synaptic_ops_all_weights"] == pytest.approx(a["synaptic_ops_all_weights"])
        assert b["output_spikes"] == pytest.approx(a["output_spikes"])
    assert math.isclose(sum(lava.input_maps[0].reshape(-1).tolist()), float(maps.input_maps[0].sum()))


def test_lava_spikes_give_the_torch_count(two_runs):
    """Energy from a real Lava run (per-neuron totals) equals a torch pass over the
    very input spikes Lava received: Lava reproduces SLAYER spike for spike."""
    from neurofed.deploy.lava_run import input_spikes, run_lava
    from neurofed.models.opcounts import count_layers as count
    from neurofed.energy.report import _measure, load_run
    from neurofed.energy.spikes import measure_torch
    from neurofed.seeds import seed_for

    d = two_runs[0]
    lava = run_lava(d, samples=12, progress=False, quiet=True)
    try:
        run = load_run(d)
        from_lava = _measure(run, "lava", None)
        s, _ = input_spikes(run.x_test[:12].numpy(), run.cfg["data"], seed_for(run.cfg["seed"], "lava"))
        # the same binary input, passed through unchanged ("events" encoding is the identity)
        direct = measure_torch(run.model, torch.from_numpy(s).float(), {**run.cfg["data"], "encoding": "events"}, 0)
    finally:
        for f in ("lava.json", "lava_layer_spikes.npy", "lava_neuron_spikes.npz", "model.net"):
            (d / f).unlink(missing_ok=True)
    assert lava["spike_for_spike"] and from_lava.spread == "exact" and from_lava.samples == 12
    masks = synapse_masks(run.model)
    a = count(run.model.layers, from_lava.input_maps, from_lava.output_spikes, 12, from_lava.timesteps, masks=masks)
    b = count(run.model.layers, direct.input_maps, direct.output_spikes, 12, direct.timesteps, masks=masks)
    for ra, rb in zip(a, b):
        assert ra["synaptic_ops"] == pytest.approx(rb["synaptic_ops"], rel=1e-12)
        assert ra["output_spikes"] == pytest.approx(rb["output_spikes"], rel=1e-12)


# --------------------------------------------------------------------------- conventions


def test_two_weight_layers_and_a_pool_by_hand_under_each_convention():
    # conv 1→2 (k 1) on 1×2×2 – pool 2 – flatten – dense 2→1; T = 2, one sample.
    from neurofed.energy.pricing import compute_energy
    from neurofed.energy.spikes import SpikeMaps

    layers = resolve([Layer("conv", 2, kernel=1), Layer("pool", kernel=2, stride=2), Layer("flatten"),
                      Layer("dense", 1)], (1, 2, 2))
    maps = SpikeMaps(1, 2, [torch.tensor([[[1.0, 0.0], [2.0, 1.0]]]),  # 4 input spikes: rate 4/(4·2) = 0.5
                            torch.tensor([[[1.0, 1.0], [0.0, 0.0]], [[1.0, 0.0], [1.0, 0.0]]]),  # 4: rate 0.25
                            None, torch.tensor([1.0, 1.0])],  # 2 spikes into the dense layer: rate 0.5
                     [4.0, 2.0, 0.0, 1.0])  # output rates: conv 4/(8·2) = .25, pool 2/(2·2) = .5, dense 1/2
    fp32 = load_profile("cmos45_fp32")  # E_MAC 4.6 pJ, E_AC 0.9 pJ
    mac, ac = 4.6 * PJ, 0.9 * PJ
    # MACs: conv 2·2·1·1·2 = 8, pool 2·1·1·2·2 = 8, dense 2.
    # exact: conv 4 spikes × 2 outputs = 8, pool 4 × 1 = 4, dense 2 × 1 = 2 → 14 ACs; ANN 18 MACs.
    exact = compute_energy(layers, maps, [fp32])
    assert exact["convention"] == "exact"
    assert exact["snn_energy_j"] == pytest.approx(14 * ac) and exact["ann_energy_j"] == pytest.approx(18 * mac)
    papers = exact["paper_conventions"]["cmos45_fp32"]
    # FedSNN: pool left out; conv 8·0.5·2 = 8, dense 2·0.5·2 = 2 ACs; ANN 10 MACs.
    assert papers["fedsnn"]["snn_energy_j"] == pytest.approx(10 * ac)
    assert papers["fedsnn"]["ann_energy_j"] == pytest.approx(10 * mac)
    # SFedCA Eq. 13: R = mean(.25, .5) = .375 over conv and FC; SOPs = .375 · 2 · 10 = 7.5.
    assert papers["sfedca"]["network_rate"] == pytest.approx(0.375)
    assert papers["sfedca"]["snn_energy_j"] == pytest.approx(7.5 * ac)
    assert papers["sfedca"]["ann_energy_j"] == pytest.approx(10 * mac)
    # SFedHIFI Eq. 15-16 as its authors counted: (f_in+1)β per layer of neurons, k²β per pool: conv
    # 2·8 = 16, pool 4·2 = 8, dense 3·1 = 3 → ANN 27; SNN: conv 16 MACs + pool 8·.5·2 + dense 3·.5·2 = 11 ACs.
    assert papers["sfedhifi"]["ann_energy_j"] == pytest.approx(27 * mac)
    assert papers["sfedhifi"]["snn_energy_j"] == pytest.approx(16 * mac + 11 * ac)
    # Eq. 15 as printed, 2(f_in+1)β: conv 2·2·8 = 32, pool 2·5·2 = 20, dense 2·3·1 = 6 → ANN 58;
    # SNN: conv 32 MACs + pool 20·.5·2 + dense 6·.5·2 = 26 ACs.
    assert papers["sfedhifi_eq15"]["ann_energy_j"] == pytest.approx(58 * mac)
    assert papers["sfedhifi_eq15"]["snn_energy_j"] == pytest.approx(32 * mac + 26 * ac)
    # convention paper: the headline is the algorithm's paper, the measured count under "exact"
    for algorithm, paper in (("fedavg", "fedsnn"), ("sfedca", "sfedca"), ("sfedhifi", "sfedhifi"),
                             ("hetero_fedavg", "sfedhifi")):
        e = compute_energy(layers, maps, [fp32], convention="paper", algorithm=algorithm)
        assert e["paper"] == paper and e["snn_energy_j"] == pytest.approx(papers[paper]["snn_energy_j"])
        assert e["profiles"]["cmos45_fp32"]["ann_energy_j"] == pytest.approx(papers[paper]["ann_energy_j"])
        assert e["exact"]["snn_energy_j"] == pytest.approx(14 * ac)


def test_ann_run_energy_follows_the_convention():
    # conv 1→2 (k 1) on 1×2×2 – pool 2 – flatten – dense 2→1, as above: exact 18 MACs (pool
    # included); FedSNN / SFedCA 10 (weight layers only); SFedHIFI's count 27.
    from neurofed.energy.pricing import ann_only

    layers = resolve([Layer("conv", 2, kernel=1), Layer("pool", kernel=2, stride=2), Layer("flatten"),
                      Layer("dense", 1)], (1, 2, 2))
    fp32 = load_profile("cmos45_fp32")
    mac = 4.6 * PJ
    assert ann_only(layers, [fp32])["ann_energy_j"] == pytest.approx(18 * mac)
    for algorithm, macs in (("fedavg", 10), ("sfedca", 10), ("sfedhifi", 27)):
        e = ann_only(layers, [fp32], convention="paper", algorithm=algorithm)
        assert e["ann_energy_j"] == pytest.approx(macs * mac) and e["snn_energy_j"] is None
        assert e["profiles"]["cmos45_fp32"]["exact"]["ann_energy_j"] == pytest.approx(18 * mac)
