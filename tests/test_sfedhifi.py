"""SFedHIFI (issue 7): the factorized convolution W = B·M and its netx/Lava export,
aggregation by width, the HIFI module (layer choice, Tucker fusion), the local
objective, and the heterogeneous-width runs."""

from __future__ import annotations

import json
import math

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neurofed.algorithms import get_algorithm_class
from neurofed.algorithms.base import FitContext, ServerContext
from neurofed.algorithms.base import FitResult
from neurofed.algorithms.sfedhifi.fusion import canonical_signs, choose_layer, default_ranks, fixed_ranks, tucker_fuse
from neurofed.config import DEFAULTS, ConfigError, load_config
from neurofed.deploy.export import export_model, read_net
from neurofed.models import build_model, register_topology
from neurofed.models.factorized import FactorizedConvSynapse, orthogonality, orthogonality_penalty
from neurofed.models.hifi_cnn import factorized
from neurofed.models.snn import SpikingNet, quantize_8bit
from neurofed.models.spec import Layer, resolve
from test_deploy import assert_round_trip, random_spikes
from neurofed.rundir import load_state, save_state

WIDTHS = [0.25, 0.5, 0.75, 1.0]


def _tiny_hifi(p, k):
    """A small model with two factorized layers (hifi_cnn's structure, 8/16 channels)."""
    return [Layer("conv", 8, kernel=3, padding=1), factorized(max(1, round(16 * p)), 8, 16), Layer("pool", kernel=2, stride=2),
            factorized(max(1, round(16 * p)), 16, 16), Layer("flatten"), Layer("dense", k)]


register_topology("test_tiny_hifi", _tiny_hifi)


def hand_fuse(bank: torch.Tensor, mix: torch.Tensor, c_out: int) -> torch.Tensor:
    """W[o, d] = Σ_b M[b, o // a1, d] · B[b, o % a1], written out (Eq. 4)."""
    bank, mix = bank.detach(), mix.detach()
    a2, a1, k, _ = bank.shape
    w = torch.zeros(c_out, mix.shape[2], k, k, dtype=torch.float64)
    for o in range(c_out):
        for d in range(mix.shape[2]):
            for b in range(a2):
                w[o, d] += mix[b, o // a1, d].double() * bank[b, o % a1].double()
    return w


# ----------------------------------------------------------------------------- W = B·M


def test_eq4_groups_output_channels_including_a_short_last_group():
    # B (a2 = 2, a1 = 2, 3, 3); M (a2, C/a1 = 3 groups of 2, 2, 1 output channels, D = 4)
    torch.manual_seed(0)
    syn = FactorizedConvSynapse(4, 5, 3, bank_filters=2, group_size=2)
    assert tuple(syn.bank.shape) == (2, 2, 3, 3) and tuple(syn.mix.shape) == (2, 3, 4)
    w = hand_fuse(syn.bank, syn.mix, 5)
    np.testing.assert_allclose(syn.weight[..., 0].double().detach(), w, atol=1e-6)
    # one entry by hand: output 3 = group 1, slot 1: W[3, d] = M[0, 1, d] B[0, 1] + M[1, 1, d] B[1, 1]
    b, m = syn.bank.detach().double(), syn.mix.detach().double()
    np.testing.assert_allclose(w[3, 2], m[0, 1, 2] * b[0, 1] + m[1, 1, 2] * b[1, 1], atol=1e-12)
    x = torch.rand(2, 4, 6, 6, 4)
    np.testing.assert_allclose(syn(x).detach(), F.conv3d(x, w.float().unsqueeze(-1)), atol=1e-5)


def test_banks_have_one_shape_for_every_width_and_mixes_do_not():
    shapes = {}
    for p in WIDTHS:
        model = build_model({**DEFAULTS["model"], "name": "hifi_cnn", "width": p}, (1, 8, 8), 10)
        shapes[p] = {n: tuple(t.shape) for n, t in model.named_parameters()}
    banks = {n for n in shapes[1.0] if n.endswith(".bank")}
    assert banks == {"blocks.1.synapse.bank", "blocks.3.synapse.bank"}
    # Eq. 4: a2 = 0.25·128 = 32 bank elements of a1 = 0.125·128 = 16 output channels each
    assert shapes[1.0]["blocks.1.synapse.bank"] == (32, 16, 3, 3)
    assert shapes[1.0]["blocks.3.synapse.bank"] == (32, 16, 3, 3)
    for n in banks:
        assert len({shapes[p][n] for p in WIDTHS}) == 1
    # M^p: a2 × C^p/a1 × D^p
    assert [shapes[p]["blocks.3.synapse.mix"] for p in WIDTHS] == [(32, 2, 32), (32, 4, 64), (32, 6, 96),
                                                                  (32, 8, 128)]
    model = build_model({**DEFAULTS["model"], "name": "hifi_cnn", "bank_fraction": 0.5}, (1, 8, 8), 10)
    assert tuple(model.blocks[1].synapse.bank.shape) == (64, 16, 3, 3)  # model.bank_fraction reaches the layer
    # the digits-scale variant (the benchmark's model): two banks, one shape for every width
    banks = [{n: tuple(t.shape) for n, t in build_model({**DEFAULTS["model"], "name": "hifi_cnn_digits", "width": p},
                                                         (1, 8, 8), 10).named_parameters() if n.endswith(".bank")}
             for p in WIDTHS]
    assert banks[0] == {"blocks.2.synapse.bank": (8, 4, 3, 3), "blocks.3.synapse.bank": (8, 4, 3, 3)}
    assert all(b == banks[0] for b in banks)


def test_export_writes_the_fused_quantized_kernel_as_a_standard_conv(tmp_path):
    torch.manual_seed(0)
    model = build_model({**DEFAULTS["model"], "name": "hifi_cnn", "width": 0.25}, (1, 8, 8), 10).eval()
    path = tmp_path / "hifi.net"
    export_model(model, path)
    read_net(path, model)
    with h5py.File(path, "r") as h:
        for i in (1, 3):  # the factorized layers; file entry i + 1 (entry 0 is the input)
            g = h["layer"][str(i + 1)]
            syn = model.blocks[i].synapse
            assert g["type"][0] == b"conv" and int(g["groups"][()]) == 1
            expected = quantize_8bit(hand_fuse(syn.bank, syn.mix, syn.out_channels).float(), descale=True)
            np.testing.assert_array_equal(g["weight"][()], expected.numpy())


def test_factorized_model_runs_spike_for_spike_in_lava(tmp_path):
    torch.manual_seed(1)
    layers = resolve(_tiny_hifi(0.5, 4), (1, 8, 8))
    model = SpikingNet(layers, {**DEFAULTS["model"], "threshold": 0.3}, logit_scale=10.0).eval()
    assert_round_trip(model, random_spikes(3), tmp_path / "tiny.net", seed=5)


@pytest.mark.parametrize("width", WIDTHS)  # 5-12 s each on 2 busy cores
def test_paper_size_hifi_cnn_runs_spike_for_spike_in_lava_at_every_width(width, tmp_path):
    """The paper's CNN (64C3-128p C3-P2-128p C3-P2-FC) exported B·M-fused and run in Lava;
    at width 1 its pools see 128 channels (written with <= 127 groups: Lava's int8)."""
    torch.manual_seed(1)
    model = build_model({**DEFAULTS["model"], "name": "hifi_cnn", "width": width, "threshold": 0.5},
                        (1, 8, 8), 10, 10.0).eval()
    path = tmp_path / "hifi.net"
    assert_round_trip(model, random_spikes(2), path, seed=5)  # every hidden layer spikes, in both
    with h5py.File(path, "r") as h:
        for i in (1, 3):  # the factorized layers (file entry i + 1): one conv with the fused 8-bit kernel
            g, syn = h["layer"][str(i + 1)], model.blocks[i].synapse
            assert g["type"][0] == b"conv" and int(g["groups"][()]) == 1
            np.testing.assert_array_equal(g["weight"][()], quantize_8bit(syn.weight[..., 0].detach(), descale=True))
        assert all(int(h["layer"][str(i + 1)]["groups"][()]) <= 127 for i in (2, 4))  # the pools


# ----------------------------------------------------------------------------- objective


def test_orthogonality_term_is_zero_for_orthonormal_banks_only():
    q, _ = torch.linalg.qr(torch.randn(18, 6, dtype=torch.float64))
    bank = q.T.reshape(6, 2, 3, 3)  # 6 orthonormal filters of 2x3x3
    assert float(orthogonality(bank)) < 1e-10
    # 2B: B Bᵀ − I = 3 I, six entries of 3. Eq. 13 as printed (the default): ‖·‖_2 = sqrt(6 · 9);
    # the authors' nn.MSELoss (orth_norm: mse): 6 · 9 / 36
    assert float(orthogonality(2 * bank)) == pytest.approx(math.sqrt(54.0))
    assert float(orthogonality(2 * bank, "mse")) == pytest.approx(54.0 / 36)
    model = build_model({**DEFAULTS["model"], "name": "test_tiny_hifi"}, (1, 8, 8), 4)
    assert float(orthogonality_penalty(model).detach()) < 1e-5  # banks start orthonormal (to float32 rounding)
    with torch.no_grad():
        model.blocks[1].synapse.bank.mul_(1.5)
    assert float(orthogonality_penalty(model).detach()) > 0.1
    assert float(orthogonality_penalty(build_model({**DEFAULTS["model"], "name": "cnn"}, (1, 8, 8), 4))) == 0


def test_local_objective_is_tet_plus_lambda_times_orthogonality(tiny_cfg):
    cfg = tiny_cfg(**{"algorithm.name": "sfedhifi", "model.name": "test_tiny_hifi", "model.width": 1.0,
                      "partition.num_clients": 4, "federation.clients_per_round": 4, "algorithm.orth_lambda": 0.5})
    model = build_model(cfg["model"], (1, 8, 8), 4, 2.0)
    client = get_algorithm_class("sfedhifi").Client(cfg, None, lambda: model)
    out = (torch.rand(3, 4, 5) < 0.5).float()  # (N, K, T) output spikes
    y = torch.tensor([0, 3, 1])
    tet = np.mean([float(F.cross_entropy(2.0 * out[..., t], y)) for t in range(5)])
    expected = tet + 0.5 * float(orthogonality_penalty(model).detach())
    assert float(client.loss(FitContext({}, {}, None), model, out, y, None).detach()) == pytest.approx(expected, rel=1e-6)


# ----------------------------------------------------------------------------- aggregation


def _server(tiny_cfg, name="sfedhifi", **extra):
    cfg = tiny_cfg(**{"algorithm.name": name, "model.name": "test_tiny_hifi", "model.width": 1.0,
                      "partition.num_clients": 8, "federation.clients_per_round": 5, **extra})
    cls = get_algorithm_class(name)
    torch.manual_seed(0)
    from neurofed.data import load_dataset
    from neurofed.training.params import ParamSpec

    ds = load_dataset(cfg["data"], cfg["seed"])
    ref = build_model(cfg["model"], ds.input_shape, ds.num_classes)
    spec = ParamSpec.from_model(ref)
    return cls.Server(cfg, spec, spec.get(ref), ServerContext(8, dataset=ds))


def _replies(server, widths_values):
    """One reply per (width, value): every parameter of that client = value."""
    return [FitResult(i, np.full(server.specs[p].size, v, dtype=np.float32), 10 + i, {"width": p})
            for i, (p, v) in enumerate(widths_values)]


def _tensor(server, p, name):
    return server.specs[p].unpack(server.servers[p].params)[name]


def test_banks_are_averaged_over_all_clients_and_the_rest_within_each_width(tiny_cfg):
    server = _server(tiny_cfg, **{"algorithm.fusion": "none"})
    untouched = server.servers[0.75].params.copy()
    server.aggregate(1, _replies(server, [(0.25, 1.0), (0.25, 3.0), (0.5, 5.0), (1.0, 11.0)]))
    mean_all = (1 + 3 + 5 + 11) / 4
    for p in WIDTHS:
        for name in server.banks:
            np.testing.assert_allclose(_tensor(server, p, name), mean_all)  # Eq. 5, every width
    np.testing.assert_allclose(_tensor(server, 0.25, "blocks.1.synapse.mix"), 2.0)  # Eq. 6
    np.testing.assert_allclose(_tensor(server, 0.25, "blocks.0.synapse.weight"), 2.0)
    np.testing.assert_allclose(_tensor(server, 0.5, "blocks.3.synapse.mix"), 5.0)
    np.testing.assert_allclose(_tensor(server, 1.0, "blocks.5.synapse.weight"), 11.0)
    # a width nobody trained this round keeps its model, with the new banks
    own = {n: v for n, v in server.specs[0.75].unpack(untouched).items() if n not in server.banks}
    for name, value in own.items():
        np.testing.assert_array_equal(_tensor(server, 0.75, name), value)


def test_baselines_aggregate_only_within_each_width(tiny_cfg):
    server = _server(tiny_cfg, "hetero_fedavg")
    server.aggregate(1, _replies(server, [(0.25, 1.0), (0.25, 3.0), (0.5, 5.0), (1.0, 11.0)]))
    w = np.array([10, 11], dtype=np.float64)  # FedAvg within the width: weighted by samples
    np.testing.assert_allclose(_tensor(server, 0.25, "blocks.1.synapse.bank"), (w @ [1.0, 3.0]) / w.sum(), rtol=1e-6)
    np.testing.assert_allclose(_tensor(server, 0.5, "blocks.1.synapse.bank"), 5.0)
    np.testing.assert_allclose(_tensor(server, 1.0, "blocks.1.synapse.bank"), 11.0)


def test_every_width_survives_a_checkpoint(tiny_cfg, tmp_path):
    server = _server(tiny_cfg, "hetero_fednova")
    replies = _replies(server, [(0.25, 1.0), (0.5, 2.0), (0.75, 3.0), (1.0, 4.0)])
    for r in replies:
        r.metrics["fednova_a"] = 2.0
    server.aggregate(1, replies)
    restored = _server(tiny_cfg, "hetero_fednova")
    save_state(tmp_path / "ckpt.npz", server.state_dict(), "checkpoint")
    restored.load_state_dict(load_state(tmp_path / "ckpt.npz", "checkpoint"))
    for p in WIDTHS:
        np.testing.assert_array_equal(restored.servers[p].params, server.servers[p].params)
    np.testing.assert_array_equal(restored.params, server.servers[1.0].params)  # model.width's model
    assert server.state_dict()["params"] is server.servers[1.0].params


def test_one_message_for_all_clients_is_refused(tiny_cfg):
    with pytest.raises(RuntimeError, match="model of its width"):
        _server(tiny_cfg).message()


def test_selection_is_p_of_n_at_random_as_the_paper_by_default(tiny_cfg):
    # "5 active clients are randomly selected": FedAvg's uniform draw, whatever the widths.
    from neurofed.seeds import rng_for

    server = _server(tiny_cfg)
    missing = 0
    for rnd in range(1, 30):
        plan = server.configure(rnd)
        draw = np.sort(rng_for(server.cfg["seed"], "select", rnd).choice(8, size=5, replace=False))
        assert [c for c, _ in plan] == draw.tolist()
        assert all(c["width"] == server.assigned[cid] for cid, c in plan)
        missing += {c["width"] for _, c in plan} != set(WIDTHS)
    assert missing > 0  # 5 of 8 with two clients per width: some rounds lack a width


def test_examples_and_presets_keep_a_client_s_width_and_the_one_core_shape():
    from pathlib import Path

    from neurofed.config import load_config

    root = Path(__file__).parent.parent / "examples"
    files = [root / "digits_sfedhifi.yaml", *sorted((root / "papers").glob("sfedhifi_*.yaml"))]
    for f in files:
        a = load_config(f)["algorithm"]
        assert (a["assign"], a["tucker_view"], a["tucker_ranks"]) == ("fixed", "matrix", "min"), f.name


def test_every_round_has_every_width_and_fixed_widths_stay(tiny_cfg):
    server = _server(tiny_cfg, **{"algorithm.selection": "cover_widths"})
    seen: dict[int, float] = {}
    for rnd in range(1, 30):
        plan = server.configure(rnd)
        assert len(plan) == 5 and {c["width"] for _, c in plan} == set(WIDTHS)
        for cid, c in plan:
            assert seen.setdefault(cid, c["width"]) == c["width"]
            assert server.spec_for(c) is server.specs[c["width"]]
            # M^p: a2 = 0.25·16 = 4, C^p/a1 = ceil(16p / 2) groups, D = 8 (the head's channels)
            assert server.message_for(cid, c)["blocks.1.synapse.mix"].shape == (4, -(-round(16 * c["width"]) // 2), 8)
    assert sorted(np.unique(server.assigned, return_counts=True)[1]) == [2, 2, 2, 2]  # balanced draw
    server = _server(tiny_cfg, **{"algorithm.assign": "round", "algorithm.selection": "cover_widths"})
    assert server.assigned is None
    assert all({c["width"] for _, c in server.configure(r)} == set(WIDTHS) for r in range(1, 10))


# ----------------------------------------------------------------------------- HIFI


def test_layer_choice_is_the_mode_then_the_highest_rate_then_the_lowest_index():
    # a clear mode wins even if another layer fires more
    assert choose_layer({0.25: 1, 0.5: 1, 0.75: 1, 1.0: 0}, {0.25: 0.1, 0.5: 0.1, 0.75: 0.1, 1.0: 0.9}) == 1
    # two layers tie on count: the one a width chose with the highest rate
    assert choose_layer({0.25: 0, 0.5: 0, 0.75: 1, 1.0: 1}, {0.25: 0.2, 0.5: 0.3, 0.75: 0.25, 1.0: 0.4}) == 1
    assert choose_layer({0.25: 0, 0.5: 0, 0.75: 1, 1.0: 1}, {0.25: 0.5, 0.5: 0.3, 0.75: 0.25, 1.0: 0.4}) == 0
    # all distinct: the highest rate; equal rates: the lowest layer index
    assert choose_layer({0.25: 0, 0.5: 1, 0.75: 2}, {0.25: 0.1, 0.5: 0.3, 0.75: 0.2}) == 1
    assert choose_layer({0.25: 2, 0.5: 1}, {0.25: 0.3, 0.5: 0.3}) == 1


def test_mode_fusion_picks_the_layer_of_highest_measured_rate(tiny_cfg):
    server = _server(tiny_cfg, **{"algorithm.rate_samples": 8})
    layer, info = server.choose(1)
    rates = {float(p): r for p, r in info["hifi_rates"].items()}
    assert set(rates) == set(WIDTHS) and all(len(r) == 2 for r in rates.values())
    assert info["hifi_choices"] == {f"{p:g}": int(np.argmax(rates[p])) for p in WIDTHS}
    assert layer == choose_layer({p: int(np.argmax(r)) for p, r in rates.items()},
                                 {p: max(r) for p, r in rates.items()})
    fixed = _server(tiny_cfg, **{"algorithm.fusion": "fixed"})
    assert fixed.choose(1) == (1, {})  # fusion_layer -1: the last factorized layer


def test_fixed_ranks_are_one_core_shape_for_every_width():
    # the M of hifi_cnn_digits' first factorized layer: a2 = 8 bank elements, G = 2, 4, 6, 8
    # groups, D = 4, 8, 12, 16 input channels at widths 0.25 ... 1
    tensors = [(8, 2, 4), (8, 4, 8), (8, 6, 12), (8, 8, 16)]
    assert fixed_ranks(tensors, "min") == [8, 2, 4]  # the narrowest M, mode by mode (8 <= 2 * 4)
    assert fixed_ranks(tensors, 0.25) == [2, 1, 4]  # the authors' rule: 0.25 x the minimum on two modes (>= 1)
    matrices = [(8, 8), (8, 32), (8, 72), (8, 128)]  # the same Ms as a2 x (G D)
    assert fixed_ranks(matrices, "min") == [8, 8] and fixed_ranks(matrices, 0.25) == [2, 2]
    assert fixed_ranks(matrices, [3, 5]) == [3, 5]
    assert default_ranks([(2, 3, 40)]) == [2, 3, 6]  # a rank above the product of the others is capped


def test_fixed_ranks_by_default_truncate_every_width_to_one_core_shape(tiny_cfg):
    server = _server(tiny_cfg, **{"algorithm.fusion": "fixed", "algorithm.fusion_layer": 0,
                                  "algorithm.tucker_view": "tensor"})
    assert server.cfg["algorithm"]["tucker_ranks"] == "min"
    mixes = {p: server.specs[p].unpack(server.servers[p].params)["blocks.1.synapse.mix"].copy() for p in WIDTHS}
    server.fuse(0)
    low = fixed_ranks([m.shape for m in mixes.values()], "min")
    for p in WIDTHS:
        fused = server.specs[p].unpack(server.servers[p].params)["blocks.1.synapse.mix"]
        for mode, r in enumerate(low):  # every mode's unfolding of every width is within the one core shape
            unfolded = np.moveaxis(fused, mode, 0).reshape(fused.shape[mode], -1)
            assert np.linalg.matrix_rank(unfolded, tol=1e-4) <= r
    wide = mixes[1.0]
    assert np.linalg.matrix_rank(np.moveaxis(wide, 1, 0).reshape(wide.shape[1], -1)) > low[1]  # it was cut


def test_tucker_round_trip_of_the_mean_core_at_full_rank_reproduces_identical_inputs():
    x = np.random.default_rng(0).normal(size=(6, 3, 4)).astype(np.float32)
    for ranks in ("per_width", list(x.shape)):
        out = tucker_fuse({0.25: x, 0.5: x.copy(), 1.0: x.copy()}, ranks)
        for v in out.values():
            np.testing.assert_allclose(v, x, atol=1e-5)


def test_per_width_ranks_keep_the_wider_width_whole_and_fixed_ranks_truncate_it():
    rng = np.random.default_rng(1)
    small, x = rng.normal(size=(2, 3, 4)), rng.normal(size=(6, 3, 4))
    # per-width ranks (the option): each exact at its own full rank, the mean over the shared
    # 2x3x4 block; the shared block of 6x3x4 is all of small's core -> fusing a tensor with
    # itself changes nothing, and x keeps its full mode-1 rank 6 (nothing truncated)
    same = tucker_fuse({0.25: x, 1.0: x.copy()}, "per_width")
    np.testing.assert_allclose(same[1.0], x, atol=1e-5)
    fused = tucker_fuse({0.25: small, 1.0: x}, "per_width")
    assert fused[0.25].shape == (2, 3, 4) and fused[1.0].shape == (6, 3, 4)
    assert np.linalg.matrix_rank(fused[1.0].reshape(6, -1)) == 6
    # Eq. 10 with fixed ranks b = (2, 3, 4) for both: the wider width is cut to rank 2 in mode 1
    cut = tucker_fuse({0.25: small, 1.0: x}, ranks=[2, 3, 4])
    assert np.linalg.matrix_rank(cut[1.0].reshape(6, -1)) <= 2
    with pytest.raises(ValueError, match="tucker_ranks"):
        tucker_fuse({0.25: small, 1.0: x}, ranks=[3, 3, 4])


def test_matrix_fusion_averages_the_shared_spectrum_and_keeps_each_width_s_singular_vectors():
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(3, 5)), rng.normal(size=(6, 5))
    fused = tucker_fuse({0.5: a, 1.0: b}, "per_width")  # cores 3x3 (a) and 5x5 (b), mean over the shared 3x3
    sa, sb = np.linalg.svd(a, compute_uv=False), np.linalg.svd(b, compute_uv=False)
    np.testing.assert_allclose(np.linalg.svd(fused[0.5], compute_uv=False), (sa + sb[:3]) / 2, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.svd(fused[1.0], compute_uv=False),
                               np.sort(np.concatenate([(sa + sb[:3]) / 2, sb[3:]]))[::-1], rtol=1e-5)
    ua = np.linalg.svd(a)[0]
    np.testing.assert_allclose(np.abs(np.linalg.svd(fused[0.5])[0]), np.abs(ua), atol=1e-5)


def test_default_fusion_gives_every_width_the_mean_spectrum_of_its_m_as_a_matrix(tiny_cfg):
    # tucker_view matrix, tucker_ranks min: M^p as a2 x (G D) matrices (4 x 16 ... 4 x 64 here),
    # one 4 x 4 core each = its singular values; Eq. 11 averages them, Eq. 12 puts the mean
    # on each width's own singular vectors.
    server = _server(tiny_cfg, **{"algorithm.fusion": "fixed", "algorithm.fusion_layer": 0})
    name = "blocks.1.synapse.mix"
    mats = {p: server.specs[p].unpack(server.servers[p].params)[name].reshape(4, -1).astype(np.float64)
            for p in WIDTHS}
    server.fuse(0)
    mean = np.mean([np.linalg.svd(m, compute_uv=False) for m in mats.values()], axis=0)
    for p in WIDTHS:
        fused = server.specs[p].unpack(server.servers[p].params)[name].reshape(4, -1)
        np.testing.assert_allclose(np.linalg.svd(fused, compute_uv=False), mean, rtol=1e-4)
        np.testing.assert_allclose(np.abs(np.linalg.svd(fused)[0]), np.abs(np.linalg.svd(mats[p])[0]), atol=1e-3)


def test_sign_flips_of_a_matrix_decomposition_do_not_change_its_canonical_core():
    rng = np.random.default_rng(3)
    core = np.diag([3.0, -2.0, 0.5])  # what HOOI gives a matrix: singular values, signs per tensorly's SVDs
    factors = [np.linalg.qr(rng.normal(size=(d, 3)))[0] for d in (4, 5)]
    flips = [np.array([1, -1, -1]), np.array([-1, 1, -1])]
    flipped = [f * s for f, s in zip(factors, flips)]  # the same matrix, other signs
    c1, f1 = canonical_signs(core, factors)
    c2, f2 = canonical_signs(core * np.outer(*flips), flipped)
    np.testing.assert_allclose(np.diag(c1), [3.0, 2.0, 0.5])
    np.testing.assert_allclose(c1, c2)  # the core (what fusion averages) no longer depends on the signs
    np.testing.assert_allclose(f1[0] @ c1 @ f1[1].T, factors[0] @ core @ factors[1].T)  # still the same matrix
    np.testing.assert_allclose(f2[0] @ c2 @ f2[1].T, factors[0] @ core @ factors[1].T)


def test_fusion_rebuilds_the_chosen_mix_of_every_width_and_nothing_else(tiny_cfg):
    server = _server(tiny_cfg, **{"algorithm.fusion": "fixed", "algorithm.fusion_layer": 0})
    before = {p: server.specs[p].unpack(server.servers[p].params.copy()) for p in WIDTHS}
    server.fuse(0)
    mixes = {p: before[p]["blocks.1.synapse.mix"] for p in WIDTHS}
    views = {p: server.view(m) for p, m in mixes.items()}  # the default view and fixed ranks
    expected = tucker_fuse(views, fixed_ranks([v.shape for v in views.values()], "min"))
    for p in WIDTHS:
        after = server.specs[p].unpack(server.servers[p].params)
        np.testing.assert_allclose(after["blocks.1.synapse.mix"], expected[p].reshape(mixes[p].shape), atol=1e-6)
        for name, value in before[p].items():
            if name != "blocks.1.synapse.mix":
                np.testing.assert_array_equal(after[name], value)
    # fusion changed the narrowest width's M (its core is the mean of all widths')
    assert not np.allclose(before[0.25]["blocks.1.synapse.mix"], expected[0.25].reshape(mixes[0.25].shape))


# ----------------------------------------------------------------------------- config and runs


def test_config_errors_name_the_key(tiny_cfg):
    with pytest.raises(ConfigError, match="model.width: got 0.3"):
        tiny_cfg(**{"algorithm.name": "sfedhifi", "model.name": "test_tiny_hifi", "model.width": 0.3})
    with pytest.raises(ConfigError, match="federation.clients_per_round: got 2; with selection cover_widths"):
        tiny_cfg(**{"algorithm.name": "hetero_fedavg", "model.width": 1.0, "algorithm.selection": "cover_widths"})
    tiny_cfg(**{"algorithm.name": "hetero_fedavg", "model.width": 1.0})  # random selection: 2 of 4 is fine
    with pytest.raises(ConfigError, match="model.name: got 'mlp'.*factorized"):
        tiny_cfg(**{"algorithm.name": "sfedhifi", "model.width": 1.0, "federation.clients_per_round": 4})
    with pytest.raises(ConfigError, match="algorithm.fusion: got 'best'"):
        tiny_cfg(**{"algorithm.name": "sfedhifi", "algorithm.fusion": "best"})
    with pytest.raises(ConfigError, match="algorithm.client_widths"):
        tiny_cfg(**{"algorithm.name": "hetero_fedavg", "model.width": 1.0, "federation.clients_per_round": 4,
                    "algorithm.client_widths": "[0.25, 0.5, 0.75, 0.75]"})


@pytest.mark.parametrize("name", ["sfedhifi", "hetero_fednova"])
def test_a_heterogeneous_run_reports_accuracy_per_width(name, tiny_cfg, tmp_path):
    from neurofed.pipeline import run

    extra = {"algorithm.rate_samples": 16, "export": True} if name == "sfedhifi" else {"energy.enabled": False}
    cfg = tiny_cfg(**{"algorithm.name": name, "model.name": "test_tiny_hifi", "model.width": 0.5,
                      "model.threshold": 0.5, "partition.num_clients": 8, "federation.clients_per_round": 4,
                      "algorithm.selection": "cover_widths", **extra})
    summary = run(cfg, tmp_path, progress=False)
    assert set(summary["accuracy_per_width"]) == {"0.25", "0.5", "0.75", "1"}
    assert summary["final_accuracy"] == pytest.approx(np.mean(list(summary["accuracy_per_width"].values())))
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[-1]["clients_per_width"] == {"0.25": 1, "0.5": 1, "0.75": 1, "1": 1}
    sizes = [sum(t.numel() for t in build_model({**cfg["model"], "width": p}, (1, 8, 8), 10).parameters()
                 if t.requires_grad) for p in WIDTHS]
    assert lines[-1]["bytes_up"] == lines[-1]["bytes_down"] == 4 * sum(sizes)  # each client its width's model
    if name != "sfedhifi":
        return
    # the exported network is the global model at model.width; energy is reported for every width
    state = load_state(tmp_path / "checkpoint.npz", "checkpoint")["server"]
    np.testing.assert_array_equal(state["params"], state["widths"]["0.5"]["params"])
    model = build_model(cfg["model"], (1, 8, 8), 10)
    from neurofed.training.params import ParamSpec

    ParamSpec.from_model(model).set(model, state["params"])
    syn = model.blocks[3].synapse
    with h5py.File(tmp_path / "model.net", "r") as h:
        np.testing.assert_array_equal(h["layer"]["4"]["weight"][()],
                                      quantize_8bit(syn.weight[..., 0].detach(), descale=True).numpy())
    energy = json.loads((tmp_path / "energy_per_width.json").read_text())["widths"]
    assert set(energy) == {"0.25", "0.5", "0.75", "1"}
    assert energy["0.25"]["macs"] < energy["0.5"]["macs"] < energy["1"]["macs"]
    assert energy["0.5"]["snn_energy_j"] == pytest.approx(json.loads((tmp_path / "energy.json").read_text())
                                                          ["snn_energy_j"])


@pytest.mark.parametrize("name", ["sfedhifi", "hetero_fedprox"])
def test_a_heterogeneous_client_keeps_only_its_models_per_width(name, tiny_cfg):
    # each fit's width, layout and download live in its FitContext: the client keeps no width between calls
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": name, "model.name": "test_tiny_hifi", "model.width": 0.5,
                                 "partition.num_clients": 8, "federation.clients_per_round": 4,
                                 "algorithm.selection": "cover_widths",
                                 **({"algorithm.rate_samples": 16} if name == "sfedhifi" else {})}))
    record = exp.run_round(1)
    assert len(record["trained"]) == 4 and not record["failed"], record
    assert set(vars(exp.client)) <= {"cfg", "spec", "model_factory", "_model", "_widths"}
    assert exp.client.spec is exp.spec  # not the last call's width
    assert sorted(exp.client._widths) == WIDTHS
