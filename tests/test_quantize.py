"""Quantization-aware training on export's 8-bit grid (neurofed.models.quantize, ``model.quantize: R``)."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from neurofed.config import ConfigError
from neurofed.models.quantize import ExportGrid, effective_weight, for_round, quantize_export, synapses, weight_exponent
from neurofed.models.quantize import quantize_8bit


def test_export_grid_is_netx_8_bit_range_with_a_straight_through_gradient():
    w = torch.linspace(-6, 6, 2001, requires_grad=True)
    q = quantize_export(w)
    ints = (q * 64).detach().numpy()
    assert np.array_equal(ints, np.round(ints)) and set(np.unique(ints) % 2) == {0}  # SLAYER's steps of 2
    assert ints.min() == -256 and ints.max() == 254  # netx optimize_weight_bits clips beyond these
    inside = (w.abs() < 3.9).detach()
    np.testing.assert_array_equal(quantize_export(w, descale=True).detach().numpy(), ints)
    q.sum().backward()
    assert torch.all(w.grad[inside] == 1) and torch.all(w.grad[w.detach() > 4.5] == 0)
    # within the range it rounds as SLAYER's 8-bit hook does
    np.testing.assert_array_equal(q[inside].detach().numpy(), quantize_8bit(w)[inside].detach().numpy())


@pytest.mark.parametrize("value, ok", [(True, True), (False, True), (3, True), ("last 2", True), ("last 20%", True),
                                       (0, False), (-2, False), ("late", False), (1.5, False), ("last 0", False),
                                       ("last 120%", False), ("last -1", False), ("first 2", False)])
def test_model_quantize_takes_a_switch_or_a_first_round(tiny_cfg, value, ok):
    if ok:
        assert tiny_cfg(**{"model.quantize": value})["model"]["quantize"] == value
    else:
        with pytest.raises(ConfigError, match="model.quantize.*round R >= 1.*'last K'"):
            tiny_cfg(**{"model.quantize": value})


@pytest.mark.parametrize("value, rounds, first", [(3, 10, 3), ("last 3", 10, 8), ("last 3", 2, 1), ("last 20%", 5, 5),
                                                  ("last 20%", 12, 10), ("last 20%", 300, 241), ("last 100%", 7, 1)])
def test_the_last_rounds_count_back_from_the_runs_length(value, rounds, first):
    from neurofed.models.quantize import qat_round

    assert qat_round(value, rounds) == first
    assert qat_round(True, rounds) is None and qat_round(False, rounds) is None


def test_qat_from_round_r_trains_onto_the_grid_export_writes(tmp_path, tiny_cfg):
    from neurofed.deploy.export import export_run, load_global_model
    from neurofed.pipeline import run
    from neurofed.seeds import seed_for
    from neurofed.training.local import evaluate

    def losses(q):
        out = tmp_path / str(q)
        run(tiny_cfg(**{"model.quantize": q, "federation.rounds": 2, "model.name": "cnn", "model.width": 0.25,
                        "data.timesteps": 8, "model.threshold": 0.5, "model.init": "firing",
                        "model.readout": "voltage"}),
            out, progress=False)  # it learns; the firing init calibrates float weights
        rows = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
        return out, [(r["train_loss"], r["loss"]) for r in rows]

    out, qat = losses(2)
    _, float_run = losses(False)
    _, last_round = losses("last 50%")
    assert qat[0] == float_run[0]  # round 1: the float run's, to the bit
    assert qat[1] != float_run[1]  # round 2: trained and evaluated on the 8-bit grid
    assert last_round == qat  # the last half of 2 rounds is round 2 on
    model, cfg2, ds, rnd = load_global_model(out)
    # rounds before R train and evaluate float weights; from R on, export's grid
    assert all(isinstance(s.pre_hook_fx, ExportGrid) for s in synapses(model))
    assert all(s.pre_hook_fx is None for s in synapses(for_round(model, 1, 2)))
    for_round(model, 2, 2)
    # the run's reported accuracy of round R is the 8-bit model's
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    ev = evaluate(model, torch.as_tensor(ds.x_test), torch.as_tensor(ds.y_test), cfg2, seed_for(cfg2["seed"], "eval"))
    assert last["round"] == 2 and ev["accuracy"] == last["accuracy"]

    export_run(out, quiet=True)  # refuses weights beyond 8 bits: none here
    weights = [syn.pre_hook_fx(effective_weight(syn)) for syn in synapses(model)]
    with h5py.File(out / "model.net") as h:
        written = [h["layer"][str(i + 1)]["weight"][()] for i, layer in enumerate(model.layers)
                   if layer.kind in ("conv", "dense")]
    trained = [w for w, layer in zip(weights, [l for l in model.layers if l.kind != "flatten"])
               if layer.kind in ("conv", "dense")]
    assert len(written) == len(trained) == 4
    exponents = [weight_exponent(syn) for syn, layer in zip(synapses(model), [l for l in model.layers
                                                                               if l.kind != "flatten"])
                 if layer.kind in ("conv", "dense")]
    assert max(exponents) > 0  # float-trained layers use finer grids than SLAYER's one
    for w, file_w, k in zip(trained, written, exponents):
        ints = (w * 64 * 2.0 ** k).detach().numpy().reshape(file_w.shape)
        np.testing.assert_array_equal(ints, file_w)  # exactly the weights the torch model computes with
        assert np.array_equal(ints, np.round(ints)) and -256 <= ints.min() and ints.max() <= 254



@pytest.mark.parametrize("top, worst, threshold, bias, reserve, k", [
    (0.06, 1.0, 80, None, 0, 6),  # small weights: the finest grid the exponent allows
    (0.5, 1.0, 80, None, 0, 2),  # 0.5 x 2^2 = 2 <= 254/64 < 0.5 x 2^3
    (5.3, 50.0, 80, None, 0, -1),  # past the grid: a coarser one instead of clipping
    (0.06, 100.0, 80, None, 0, 4),  # the worst-case current within the 24-bit state (2048 at k = 0)
    (0.06, 1.0, 80, None, 6, 4),  # graded input's 6 bits on top: the threshold mantissa within 17 bits
    (0.06, 1.0, 80, [-96, 40], 0, 5),  # the bias mantissa within 13 bits (96 x 2^5 <= 4095)
    (5.3, 50.0, 7, None, 0, 0),  # an odd threshold mantissa cannot be halved exactly: clipped at k = 0
])
def test_each_layer_takes_the_finest_exponent_its_weights_and_registers_allow(top, worst, threshold, bias, reserve, k):
    from neurofed.models.quantize import layer_exponent

    b = None if bias is None else torch.tensor(bias)
    assert layer_exponent(top, worst, threshold, b, reserve) == k


def test_the_export_grid_of_exponent_k_is_2_to_the_k_finer_with_the_same_integers():
    w = torch.linspace(-0.2, 0.2, 401, requires_grad=True)
    fine = ExportGrid(4)
    q = fine(w)
    np.testing.assert_array_equal(fine(w, descale=True).detach().numpy(), (q * 64 * 16).detach().numpy())
    assert (q - w).abs().max() <= 1 / 32 / 16 / 2 + 1e-7  # half a step of 2/64/2^4
    assert (quantize_export(w) - w).abs().max() > 8 * (q - w).abs().max()
    q.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))  # straight through inside the range
    assert ExportGrid(0)(w).equal(quantize_export(w))
