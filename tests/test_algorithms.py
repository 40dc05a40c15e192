"""Label-skew algorithms: FedProx, SCAFFOLD, FedNova, FedLC, FedRS, FedLEC, and Laplace LDP.

Invariants (each algorithm reduces to FedAvg where its paper says it does), logit
transforms and losses on hand-made logits, and exact resume of SCAFFOLD's state.
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from neurofed.algorithms import algorithm_names, get_algorithm_class
from neurofed.algorithms.base import Client, FitContext, FitResult, ServerContext, weighted_average
from neurofed.algorithms.fedlc import calibrated_logits
from neurofed.algorithms.fedlec import (LC_FORMS, LD_FORMS, aggregate_through_time, all_labels_kl, calibrated_ce,
                                       eq8_held_loss, eq8_loss, label_prior, missing_and_rest_kl,
                                        missing_label_kl)
from neurofed.algorithms.fednova import effective_steps
from neurofed.algorithms.fedrs import restricted_logits
from neurofed.algorithms.scaffold import C_KEY
from neurofed.config import ConfigError, load_config
from neurofed.training.params import ParamSpec
from neurofed.rundir import load_state

LABEL_SKEW = ("fedprox", "scaffold", "fednova", "fedlc", "fedrs", "fedlec")


def one_round(cfg):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(cfg)
    exp.record = exp.run_round(1)
    return exp


# --------------------------------------------------------------------------- registry/config


def test_registered_with_their_config_keys(tiny_cfg):
    assert set(LABEL_SKEW) <= set(algorithm_names())
    expected = {"fedprox": {"mu"}, "scaffold": {"global_lr"}, "fednova": set(), "fedlc": {"tau"},
                "fedrs": {"alpha"}, "fedlec": {"lambda", "temperature", "prior_smoothing", "lc_form", "ld_form"}}
    for name, keys in expected.items():
        cls = get_algorithm_class(name)
        assert cls.name == name and set(cls.config_defaults) == keys
        assert set(tiny_cfg(**{"algorithm.name": name})["algorithm"]) == keys | {"name"}


def test_baseline_defaults_are_the_fedlec_experiments():
    # The FedLEC authors' main.py: -mu 0.01, -tau 0.01, -strength 0.5, -lamda 0.1.
    assert get_algorithm_class("fedprox").config_defaults["mu"] == 0.01
    assert get_algorithm_class("fedlc").config_defaults["tau"] == 0.01
    assert get_algorithm_class("fedrs").config_defaults["alpha"] == 0.5
    # FedLEC: lambda 0.5, not -lamda 0.1, which weights the authors' own L_d (see FedLEC)
    assert get_algorithm_class("fedlec").config_defaults["lambda"] == 0.5
    assert get_algorithm_class("scaffold").config_defaults["global_lr"] == 1.0


def test_bad_algorithm_keys_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"^algorithm\.mu: got -1; expected >= 0$"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.mu=-1"])
    with pytest.raises(ConfigError, match=r"algorithm\.lambda: got 1\.5; expected <= 1"):
        load_config(None, ["algorithm.name=fedlec", "algorithm.lambda=1.5"])
    with pytest.raises(ConfigError, match=r"algorithm\.mu: unknown key for fedlec; allowed: lambda, lc_form, ld_form, prior_smoothing, temperature"):
        load_config(None, ["algorithm.name=fedlec", "algorithm.mu=0.1"])
    with pytest.raises(ConfigError, match=r"federation\.ldp_laplace: got -0\.1; expected >= 0"):
        load_config(None, ["federation.ldp_laplace=-0.1"])


# Each paper's other rows (its tables' baselines), one --set away from every preset of it.
PAPER_ROWS = {"fedlec": ["fedavg", "fedprox", "scaffold", "fednova", "fedlc", "fedrs"],
              "sfedca": ["fedavg", "divfl", "fedmos"],
              "sfedhifi": ["hetero_fedavg", "hetero_fedprox", "hetero_fednova"]}


@pytest.mark.parametrize("paper", sorted(PAPER_ROWS))
def test_every_paper_row_is_one_set_away_from_each_preset(paper, caplog):
    import yaml

    presets = sorted((Path(__file__).parent.parent / "examples" / "papers").glob(f"{paper}_*.yaml"))
    assert presets
    for preset in presets:
        given = yaml.safe_load(preset.read_text())["algorithm"]
        for row in PAPER_ROWS[paper]:
            algo = load_config(preset, [f"algorithm.name={row}"])["algorithm"]
            assert set(algo) == {"name", *get_algorithm_class(row).config_defaults} and algo["name"] == row
            assert all(algo[k] == v for k, v in given.items() if k in algo and k != "name")  # shared keys kept
    if paper == "sfedhifi":  # its presets set fusion_until, which the baselines do not read
        assert "does not read the file's algorithm.fusion_until; ignored" in caplog.text
        with pytest.raises(ConfigError, match="algorithm.fusion_until: unknown key for hetero_fedavg"):
            load_config(presets[0], ["algorithm.name=hetero_fedavg", "algorithm.fusion_until=3"])  # explicit: checked


# --------------------------------------------------------------------------- FedProx


def test_fedprox_with_mu_zero_is_fedavg(tiny_cfg):
    skew = {"partition.scheme": "cnum", "partition.classes_per_client": 2}
    avg = one_round(tiny_cfg(**skew))
    prox = one_round(tiny_cfg(**skew, **{"algorithm.name": "fedprox", "algorithm.mu": 0.0}))
    assert np.array_equal(avg.server.params, prox.server.params)


def test_fedprox_adds_half_mu_squared_distance(tiny_cfg):
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": "fedprox", "algorithm.mu": 0.3}))
    client, spec = exp.client, exp.spec
    model = client.model()
    ctx = FitContext(spec.unpack(exp.initial), {"seed": 0}, exp.client_data(0), spec=spec, global_flat=exp.initial)
    client.cfg = exp.cfg
    delta = np.random.default_rng(0).normal(0, 0.01, spec.size).astype(np.float32)
    spec.set(model, exp.initial + delta)
    client.begin(ctx, model)
    out = torch.rand(3, 10, 4)
    y = torch.tensor([0, 3, 9])
    extra = (client.loss(ctx, model, out, y, None) - F.cross_entropy(model.readout(out), y)).detach()
    expected = 0.5 * 0.3 * float(np.sum(delta.astype(np.float64) ** 2))
    assert float(extra) == pytest.approx(expected, rel=1e-4)


# --------------------------------------------------------------------------- FedNova


def test_fednova_with_equal_steps_and_no_momentum_is_fedavg(tiny_cfg):
    # iid over 4 clients: 336/337 samples each, batch 64 -> 6 steps for every client.
    avg = one_round(tiny_cfg())
    nova = one_round(tiny_cfg(**{"algorithm.name": "fednova"}))
    steps = {r.metrics["steps"] for r in nova.last_results}
    assert len(steps) == 1 and nova.record["tau_eff"] == pytest.approx(steps.pop())
    np.testing.assert_allclose(nova.server.params, avg.server.params, rtol=0, atol=1e-6)


def test_fednova_normalizes_by_effective_steps():
    from neurofed.algorithms.fednova import FedNovaServer

    spec = ParamSpec(("w",), ((2,),))
    x = np.array([1.0, 1.0], np.float32)
    server = FedNovaServer({"federation": {}}, spec, x, ServerContext(2))
    # Client 0: 1 step moving by (1, 0); client 1: 3 steps moving by (0, 3); n = 1 : 3.
    r = [FitResult(0, x - [1, 0], 1, {"fednova_a": 1.0}), FitResult(1, x - [0, 3], 3, {"fednova_a": 3.0})]
    metrics = server.aggregate(1, r)
    tau_eff = 0.25 * 1 + 0.75 * 3
    d = 0.25 * np.array([1, 0]) / 1 + 0.75 * np.array([0, 3]) / 3
    np.testing.assert_allclose(server.params, x - tau_eff * d, rtol=1e-6)
    assert metrics["tau_eff"] == pytest.approx(tau_eff)
    # FedAvg would give x - (0.25, 2.25); FedNova moves client 0's direction by 2.5x more.
    assert not np.allclose(server.params, weighted_average(r))


def test_fednova_momentum_steps_match_the_running_counter():
    for tau, rho in [(1, 0.9), (7, 0.5), (40, 0.9)]:
        counter, total = 0.0, 0.0
        for _ in range(tau):  # the FedNova authors' local_normalizing_vec
            counter = counter * rho + 1
            total += counter
        assert effective_steps(tau, rho) == pytest.approx(total)
    assert effective_steps(12, 0.0) == 12


def test_fednova_client_reports_momentum_steps(tiny_cfg):
    exp = one_round(tiny_cfg(**{"algorithm.name": "fednova", "federation.optimizer": "sgd",
                                "federation.lr": 0.05, "federation.momentum": 0.5}))
    for r in exp.last_results:
        assert r.metrics["fednova_a"] == pytest.approx(effective_steps(r.metrics["steps"], 0.5))
        assert r.metrics["fednova_a"] < r.metrics["steps"] / (1 - 0.5)


# --------------------------------------------------------------------------- SCAFFOLD


def test_scaffold_first_round_is_fedavg_then_variates_follow_option_ii(tiny_cfg):
    skew = {"partition.scheme": "cnum", "partition.classes_per_client": 2}
    avg = one_round(tiny_cfg(**skew))
    sc = one_round(tiny_cfg(**skew, **{"algorithm.name": "scaffold"}))
    assert [r.cid for r in sc.last_results] == [r.cid for r in avg.last_results]
    for a, s in zip(avg.last_results, sc.last_results):
        assert np.array_equal(a.params, s.params)  # zero variates: the FedAvg local update
    assert np.array_equal(avg.server.params, sc.server.params)  # global lr 1: FedAvg's average

    lr, x0 = sc.cfg["federation"]["lr"], sc.initial.astype(np.float64)
    expected_c = np.zeros(sc.spec.size)
    for r in sc.last_results:
        c_i = (x0 - r.params) / (r.metrics["steps"] * lr)  # c_i⁺ = 0 − 0 + (x − y_i)/(K η)
        np.testing.assert_allclose(sc.client_states[r.cid]["c_i"], c_i, rtol=1e-5, atol=1e-6)
        expected_c += c_i / sc.server.num_clients
    np.testing.assert_allclose(sc.server.c, expected_c, rtol=1e-5, atol=1e-6)
    assert np.array_equal(sc.server.message()[C_KEY], sc.server.c)

    # Round 2: the same client trained from the same global model diverges from FedAvg
    # once c − c_i is applied.
    rec_avg, rec_sc = avg.run_round(2), sc.run_round(2)
    assert rec_avg["trained"] == rec_sc["trained"]
    assert not np.array_equal(avg.server.params, sc.server.params)


def test_scaffold_server_variate_stays_the_mean_of_client_variates(tiny_cfg):
    # c starts at 0 and gains Δc_i / N whenever client i adds Δc_i to its c_i, so
    # c = (1/N) Σ_i c_i over all N clients — with each round's decayed η_l on both sides.
    from neurofed.fl.experiment import Experiment

    exp = Experiment(tiny_cfg(**{"algorithm.name": "scaffold", "partition.scheme": "cnum",
                                 "federation.lr_decay": 0.5}))
    for rnd in (1, 2, 3):
        exp.run_round(rnd)
    assert len(exp.client_states) >= 3
    mean_ci = sum(st["c_i"].astype(np.float64) for st in exp.client_states.values()) / exp.server.num_clients
    np.testing.assert_allclose(exp.server.c, mean_ci, rtol=1e-4, atol=1e-4 * np.abs(mean_ci).max())


def test_scaffold_global_lr_scales_the_step(tiny_cfg):
    avg = one_round(tiny_cfg())
    half = one_round(tiny_cfg(**{"algorithm.name": "scaffold", "algorithm.global_lr": 0.5}))
    x0 = avg.initial
    np.testing.assert_allclose(half.server.params - x0, 0.5 * (avg.server.params - x0), rtol=1e-4, atol=1e-6)


def test_scaffold_resume_is_exact(tiny_cfg, tmp_path):
    from neurofed.pipeline import run
    from neurofed.rundir import CHECKPOINT

    cfg = tiny_cfg(**{"algorithm.name": "scaffold", "federation.rounds": 3, "partition.scheme": "cnum"})
    run(cfg, tmp_path / "full", progress=False, after=False)
    short = json.loads(json.dumps(cfg))
    short["federation"]["rounds"] = 1
    run(short, tmp_path / "cut", progress=False, after=False)
    run(cfg, tmp_path / "cut", resume=True, progress=False, after=False)
    full = load_state(tmp_path / "full" / CHECKPOINT, "checkpoint")
    cut = load_state(tmp_path / "cut" / CHECKPOINT, "checkpoint")
    assert np.array_equal(full["server"]["params"], cut["server"]["params"])
    assert np.any(full["server"]["c"]) and np.array_equal(full["server"]["c"], cut["server"]["c"])
    assert full["clients"].keys() == cut["clients"].keys() and full["clients"]
    for cid, state in full["clients"].items():
        assert np.array_equal(state["c_i"], cut["clients"][cid]["c_i"])


# --------------------------------------------------------------------------- FedLC / FedRS


def test_fedlc_calibration_on_hand_made_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], requires_grad=True)
    counts = [16, 1, 0]
    out = calibrated_logits(logits, counts, tau=2.0)
    # 16^(-1/4) = 1/2, 1^(-1/4) = 1, missing label -> -inf
    assert torch.equal(out[:, :2], torch.tensor([[0.0, 0.0], [-0.5, -1.5]]))
    assert torch.isinf(out[:, 2]).all() and (out[:, 2] < 0).all()
    loss = F.cross_entropy(out, torch.tensor([0, 1]))
    expected = -math.log(0.5) - math.log(math.exp(-1.5) / (math.exp(-0.5) + math.exp(-1.5)))
    assert float(loss.detach()) == pytest.approx(expected / 2, rel=1e-6)
    loss.backward()
    assert torch.isfinite(logits.grad).all() and torch.all(logits.grad[:, 2] == 0)


def test_fedrs_restricts_missing_labels_on_hand_made_logits():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    out = restricted_logits(logits, [5, 0, 2, 0], alpha=0.5)
    assert torch.equal(out, torch.tensor([[1.0, 1.0, 3.0, 2.0]]))
    assert torch.equal(restricted_logits(logits, [0, 0, 1, 1], alpha=1.0), logits)  # alpha = 1 is FedAvg


# --------------------------------------------------------------------------- FedLEC losses


def test_fedlec_lc_with_uniform_prior_is_cross_entropy():
    g = torch.Generator().manual_seed(0)
    logits, y = torch.randn(32, 10, generator=g), torch.randint(0, 10, (32,), generator=g)
    assert torch.allclose(calibrated_ce(logits, y, np.full(10, 0.1)), F.cross_entropy(logits, y), atol=1e-6)


def test_fedlec_lc_on_hand_made_logits():
    zeros = torch.zeros(1, 3, requires_grad=True)
    # prior (3/4, 1/4, 0): adjusted logits (log 3/4, log 1/4, -inf) -> p(y=1) = 1/4
    loss = calibrated_ce(zeros, torch.tensor([1]), [0.75, 0.25, 0.0])
    assert float(loss.detach()) == pytest.approx(math.log(4), rel=1e-6)
    loss.backward()
    assert torch.isfinite(zeros.grad).all() and float(zeros.grad[0, 2]) == 0.0
    # the minority label needs a larger margin than the majority one for the same loss
    major = calibrated_ce(torch.tensor([[2.0, 0.0, 0.0]]), torch.tensor([0]), [0.75, 0.25, 0.0])
    minor = calibrated_ce(torch.tensor([[0.0, 2.0, 0.0]]), torch.tensor([1]), [0.75, 0.25, 0.0])
    assert float(minor) > float(major)


def test_fedlec_label_prior():
    counts = [6, 2, 0, 0]
    np.testing.assert_allclose(label_prior(counts, 0.0), [0.75, 0.25, 0, 0])
    np.testing.assert_allclose(label_prior(counts, 1.0), [7 / 12, 3 / 12, 1 / 12, 1 / 12])
    # with smoothing a missing label stays in L_c as a damped negative
    logits, y = torch.zeros(1, 4), torch.tensor([0])
    assert float(calibrated_ce(logits, y, label_prior(counts, 1.0))) == pytest.approx(-math.log(7 / 12))
    assert float(calibrated_ce(logits, y, label_prior(counts, 0.0))) == pytest.approx(-math.log(0.75))


def test_fedlec_ld_zero_without_missing_labels_positive_with_them():
    g = torch.Generator().manual_seed(1)
    student, teacher = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    none = np.zeros(5, bool)
    assert float(missing_label_kl(student, teacher, none)) == 0.0
    missing = np.array([False, True, False, True, True])
    ld = missing_label_kl(student, teacher, missing)
    assert float(ld) > 0
    assert float(missing_label_kl(teacher, teacher, missing)) == pytest.approx(0.0, abs=1e-7)
    # hand computation: KL(q_g || q_l) over the missing labels, batch mean; T^2 scaling
    for t in (1.0, 2.0):
        qg = torch.softmax(teacher[:, missing] / t, 1).double()
        ql = torch.softmax(student[:, missing] / t, 1).double()
        expected = float((qg * (qg / ql).log()).sum(1).mean()) * t * t
        assert float(missing_label_kl(student, teacher, missing, t)) == pytest.approx(expected, rel=1e-5)


def test_fedlec_lc_eq8_sums_over_every_label_the_missing_ones_with_gamma_zero():
    # counts (3, 1, 0): γ = (3/4, 1/4, 0); Definition 1: C = J ∪ K ∪ M = {0, 1, 2}, label 2 missing.
    prior = label_prior([3, 1, 0], 0.0)
    logits, y = torch.tensor([[1.0, 0.0, 2.0], [0.5, 1.5, 0.0]]), torch.tensor([0, 1])
    e = math.exp
    # Eq. 8 over C: the missing label's term is e^{f_2} − 0.
    l1 = -math.log((e(1) - 0.75) / ((e(1) - 0.75) + (1 - 0.25) + e(2)))
    l2 = -math.log((e(1.5) - 0.25) / ((e(0.5) - 0.75) + (e(1.5) - 0.25) + e(0)))
    assert float(eq8_loss(logits, y, prior)) == pytest.approx((l1 + l2) / 2, rel=1e-6)
    # the held-only option (the former default): label 2 is not in the sum
    h1 = -math.log((e(1) - 0.75) / ((e(1) - 0.75) + 0.75))
    h2 = -math.log((e(1.5) - 0.25) / ((e(0.5) - 0.75) + (e(1.5) - 0.25)))
    assert float(eq8_held_loss(logits, y, prior)) == pytest.approx((h1 + h2) / 2, rel=1e-6)
    # logit-adjusted CE (the option): softmax of f + log γ; log 0 = −∞ takes label 2 out
    a1 = -math.log(e(1) * 0.75 / (e(1) * 0.75 + e(0) * 0.25))
    a2 = -math.log(e(1.5) * 0.25 / (e(0.5) * 0.75 + e(1.5) * 0.25))
    assert float(calibrated_ce(logits, y, prior)) == pytest.approx((a1 + a2) / 2, rel=1e-6)
    # raising the missing label's logit raises the literal L_c only
    moved = logits.clone()
    moved[:, 2] += 5.0
    assert float(eq8_loss(moved, y, prior)) > float(eq8_loss(logits, y, prior)) + 1.0
    for form in (eq8_held_loss, calibrated_ce):
        assert float(form(moved, y, prior)) == pytest.approx(float(form(logits, y, prior)), rel=1e-6)


def test_fedlec_lc_eq8_with_negative_voltage_logits_is_the_shifted_hand_value_and_trains():
    # a voltage readout's logits can be < 0, where e^f − γ ≤ 0 has no logarithm: the sample
    # is raised until its smallest logit is 0, then Eq. 8 as printed (γ = (3/4, 1/4, 0)).
    prior = label_prior([3, 1, 0], 0.0)
    logits, y = torch.tensor([[-3.0, -1.0, 0.5], [0.5, 1.5, 0.0]], requires_grad=True), torch.tensor([0, 1])
    e = math.exp
    l1 = -math.log((e(0) - 0.75) / ((e(0) - 0.75) + (e(2) - 0.25) + e(3.5)))  # f + 3
    l2 = -math.log((e(1.5) - 0.25) / ((e(0.5) - 0.75) + (e(1.5) - 0.25) + e(0)))  # already ≥ 0
    loss = eq8_loss(logits, y, prior)
    assert float(loss) == pytest.approx((l1 + l2) / 2, rel=1e-6)
    assert float(loss) < 5.0  # not the 1e-12 floor's −log(1e-12) ≈ 27.6
    loss.backward()
    assert logits.grad[0, 0] < 0  # the true label's logit is pushed up, not left without gradient


def test_fedlec_ld_forms_with_exactly_one_missing_label():
    # M = {2}. all_labels (the former default "eq9"): softmax over all labels, sum over M;
    # same denominators, so log(q_g[2] / q_l[2]) = 1 − 3 = −2 and L_d = −2 e / (e³ + e² + e).
    student, teacher = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[3.0, 2.0, 1.0]])
    missing = np.array([False, False, True])
    e = math.exp
    z = e(3) + e(2) + e(1)
    assert float(all_labels_kl(student, teacher, missing)) == pytest.approx(-2 * e(1) / z, rel=1e-6)
    assert float(missing_label_kl(student, teacher, missing)) == 0.0  # the default: softmax over M = {2}
    # missing_and_rest: bins {2} and {0, 1}: q_g = (e/z, (e³+e²)/z), q_l = (e³/z, (e+e²)/z)
    qg, ql = (e(1) / z, (e(3) + e(2)) / z), (e(3) / z, (e(1) + e(2)) / z)
    expected = sum(g * math.log(g / l) for g, l in zip(qg, ql))
    assert float(missing_and_rest_kl(student, teacher, missing)) == pytest.approx(expected, rel=1e-6)
    assert float(missing_and_rest_kl(teacher, teacher, missing)) == pytest.approx(0.0, abs=1e-7)
    for form in (all_labels_kl, missing_and_rest_kl):
        assert float(form(student, teacher, np.zeros(3, bool))) == 0.0


def test_fedlec_teacher_is_a_separate_model_holding_the_global_params(tiny_cfg):
    exp = one_round(tiny_cfg(**{"algorithm.name": "fedlec", "partition.scheme": "cnum"}))
    alg = exp.cfg["algorithm"]
    assert (LC_FORMS[alg["lc_form"]], LD_FORMS[alg["ld_form"]]) == (eq8_loss, missing_and_rest_kl)  # Eq. 8 over C; Eq. 9 as a KL
    assert exp.record["att_time_parameters"] == 0  # ATT is FedAvg on SLAYER blocks, and says so
    teacher, student = exp.client._teacher, exp.client.model()
    assert teacher is not student
    assert np.array_equal(exp.spec.get(teacher), exp.initial)  # the round-1 global model
    assert not np.array_equal(exp.spec.get(student), exp.initial)


# --------------------------------------------------------------------------- ATT


def test_att_on_time_invariant_parameters_is_fedavg():
    rng = np.random.default_rng(0)
    spec = ParamSpec(("a", "b"), ((3, 4), (5,)))
    results = [FitResult(i, rng.normal(size=spec.size).astype(np.float32), n, {}) for i, n in enumerate([3, 9, 4])]
    att = aggregate_through_time(np.stack([r.params for r in results]), [3, 9, 4], spec)
    np.testing.assert_allclose(att, weighted_average(results), rtol=1e-6, atol=1e-7)


def test_att_on_a_time_axis_is_the_time_average():
    spec = ParamSpec(("w", "th"), ((2,), (2, 3)), time_axes=(("th", 1),))  # th: 2 neurons × T = 3 steps
    c0 = np.array([1, 2, 1, 2, 3, 2, 4, 6], np.float32)  # w = (1, 2); th rows (1,2,3), (2,4,6)
    c1 = np.array([3, 6, 3, 0, 0, 8, 8, 8], np.float32)  # w = (3, 6); th rows (3,0,0), (8,8,8)
    out = aggregate_through_time(np.stack([c0, c1]), [1, 3], spec)
    # per step: 1/4 c0 + 3/4 c1 -> th rows (2.5, .5, .75), (6.5, 7, 7.5); then mean over t
    w = [0.25 * 1 + 0.75 * 3, 0.25 * 2 + 0.75 * 6]
    th = [[(2.5 + 0.5 + 0.75) / 3] * 3, [(6.5 + 7 + 7.5) / 3] * 3]
    np.testing.assert_allclose(out, np.concatenate([w, np.ravel(th)]), rtol=1e-6)


def test_param_spec_reads_declared_time_axes_and_fedlec_server_uses_them():
    from neurofed.algorithms.fedlec import FedLECServer

    class PerStep(torch.nn.Module):
        param_time_axes = {"threshold": 0}

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(2))
            self.threshold = torch.nn.Parameter(torch.zeros(4, 2))  # T = 4 copies

    spec = ParamSpec.from_model(PerStep())
    assert spec.time_axes == (("threshold", 0),)
    assert ParamSpec.from_model(torch.nn.Linear(2, 2)).time_axes == ()
    server = FedLECServer({"federation": {}}, spec, np.zeros(spec.size, np.float32), ServerContext(2))
    y = np.concatenate([[1, 1], np.arange(8)]).astype(np.float32)
    server.aggregate(1, [FitResult(0, y, 5, {}), FitResult(1, y, 5, {})])
    steps = np.arange(8).reshape(4, 2)
    np.testing.assert_allclose(server.params[2:].reshape(4, 2), np.broadcast_to(steps.mean(0), (4, 2)))


# --------------------------------------------------------------------------- DivFL memory


def test_divfl_selects_from_gram_rows_without_a_float64_copy_of_its_table(monkeypatch):
    import tracemalloc

    from neurofed.algorithms import divfl

    monkeypatch.setattr(divfl, "GRAM_BLOCK_BYTES", 1 << 20)  # 1 MB blocks, so the test can be small
    n, p = 12, 100_000  # the table: 4.8 MB of float32
    rng = np.random.default_rng(0)
    ups = rng.standard_normal((n, p), dtype=np.float32) * np.arange(1, n + 1, dtype=np.float32)[:, None]
    cfg = {"seed": 0, "federation": {"clients_per_round": 3}, "algorithm": {"name": "divfl"}}
    server = divfl.DivFLServer(cfg, ParamSpec(("w",), ((p,),)), np.zeros(p, np.float32), ServerContext(n))
    server.aggregate(1, [FitResult(c, ups[c], 10, {}) for c in range(n)])
    # the kept Gram rows give the distances of the whole float64 table (the former computation)
    u = ups.astype(np.float64)
    np.testing.assert_allclose(server.gram, u @ u.T, rtol=1e-9)
    sq = (u * u).sum(1)
    dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2 * u @ u.T, 0))
    np.fill_diagonal(dist, 0.0)
    np.testing.assert_allclose(divfl.similarity_from_gram(server.gram), dist.max() - dist, rtol=1e-9, atol=1e-6)
    tracemalloc.start()
    chosen = [c for c, _ in server.configure(2)]
    start = server.params.copy()
    server.aggregate(2, [FitResult(c, ups[c] * 0.5, 10, {}) for c in chosen])
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < server.updates.nbytes  # the old server copied the table to float64 (2x) and squared it (2x)
    u[chosen] = (ups[chosen] * 0.5 - start).astype(np.float64)  # the repliers' rows and columns were refreshed
    np.testing.assert_allclose(server.gram, u @ u.T, rtol=1e-9)


# --------------------------------------------------------------------------- Laplace LDP


def _client(delta, n, **fed):
    cfg = load_config(None, [f"federation.ldp_laplace={delta}"] + [f"federation.{k}={v}" for k, v in fed.items()])
    spec = ParamSpec(("w",), ((n,),))
    return Client(cfg, spec, lambda: None), FitContext({}, {"seed": 1234}, None, spec=spec, global_flat=np.zeros(n, np.float32))


def _privatized(delta, n, upload, **fed):
    client, ctx = _client(delta, n, **fed)
    return client.add_privacy_noise(ctx, upload)


def test_laplace_noise_has_the_requested_scale():
    n, delta = 200_000, 0.3
    for source in ("os_entropy", "seeded_not_private"):
        noise = _privatized(delta, n, np.zeros(n, np.float32), privacy_noise=source).astype(np.float64)
        # Laplace(0, b): E|X| = b, Var = 2b², E|X|/std = 1/√2 (a Gaussian gives √(2/π) ≈ 0.80)
        assert abs(noise.mean()) < 4 * math.sqrt(2) * delta / math.sqrt(n)
        assert np.abs(noise).mean() == pytest.approx(delta, rel=0.01)
        assert noise.std() == pytest.approx(math.sqrt(2) * delta, rel=0.01)
        assert np.abs(noise).mean() / noise.std() == pytest.approx(1 / math.sqrt(2), rel=0.01)
        again = _privatized(delta, n, np.zeros(n, np.float32), privacy_noise=source)
        # seeded: the round's client seed fixes the noise; OS entropy: never the same twice
        assert np.array_equal(noise, again) == (source == "seeded_not_private")
    assert np.array_equal(_privatized(0.0, 5, np.ones(5, np.float32)), np.ones(5, np.float32))


@pytest.mark.parametrize("name", ["fedavg", "scaffold"])
def test_laplace_noise_is_added_to_the_upload_of_any_algorithm(tiny_cfg, name):
    clean = one_round(tiny_cfg(**{"algorithm.name": name}))
    noisy = one_round(tiny_cfg(**{"algorithm.name": name, "federation.ldp_laplace": 0.05}))
    for c, z in zip(clean.last_results, noisy.last_results):
        diff = (z.params - c.params).astype(np.float64)
        assert np.abs(diff).mean() == pytest.approx(0.05, rel=0.15)


# --------------------------------------------------------------------------- FedSNN update noise


def test_update_noise_is_relative_to_each_tensor_s_mean_update_by_default():
    # FedSNN Fig. 8b (authors' code): noise_t = N(0,1) · s · mean|Δ_t| per tensor.
    from neurofed.seeds import seed_for

    spec = ParamSpec(("a", "b"), ((2,), (2,)))
    glob = np.array([1.0, 1.0, 0.0, 0.0], np.float32)
    upload = np.array([2.0, -2.0, 0.5, -0.5], np.float32)  # mean|Δ|: a = (1 + 3)/2 = 2, b = 0.5
    z = np.random.default_rng(seed_for(1234, "update_noise")).normal(0.0, 1.0, 4)

    def noised(**fed):
        cfg = load_config(None, [f"federation.{k}={v}" for k, v in fed.items()])
        client = Client(cfg, spec, lambda: None)
        ctx = FitContext({}, {"seed": 1234}, None, spec=spec, global_flat=glob)
        return client.add_update_noise(ctx, upload).astype(np.float64)

    np.testing.assert_allclose(noised(update_noise=0.5), upload + z * 0.5 * np.array([2, 2, 0.5, 0.5]), rtol=1e-6)
    np.testing.assert_allclose(noised(update_noise=0.5, update_noise_mode="absolute"), upload + z * 0.5, rtol=1e-6)
    assert np.array_equal(noised(update_noise=0.0), upload)
    with pytest.raises(ConfigError, match="federation.update_noise_mode"):
        load_config(None, ["federation.update_noise_mode=gaussian"])


def test_step_lr_schedule_multiplies_by_gamma_after_each_milestone(tiny_cfg):
    # FedSNN Sec. IV-A: "reduced by a factor of 5 after 40, 60, and 80 epochs".
    from neurofed.algorithms.base import Server, ServerContext
    from neurofed.algorithms.policies import round_lr

    fed = {"lr": 0.1, "lr_milestones": [40, 60, 80], "lr_gamma": 0.2}
    assert [round_lr(fed, r) for r in (1, 40)] == [0.1, 0.1]
    assert round_lr(fed, 41) == pytest.approx(0.02)
    assert round_lr(fed, 61) == pytest.approx(0.004)
    assert round_lr(fed, 100) == pytest.approx(0.1 / 125)
    assert round_lr({**fed, "lr_decay": 0.5}, 41) == pytest.approx(0.02 * 0.5 ** 40)
    cfg = tiny_cfg(**{"federation.lr": 0.1, "federation.lr_milestones": "[1]", "federation.lr_gamma": 0.2})
    server = Server(cfg, ParamSpec(("w",), ((1,),)), np.zeros(1), ServerContext(4))
    assert "lr" not in server.client_config(1, 0)  # round 1 trains at federation.lr
    assert server.client_config(2, 0)["lr"] == pytest.approx(0.02)
    with pytest.raises(ConfigError, match="federation.lr_milestones"):
        load_config(None, ["federation.lr_milestones=[60, 40]"])


def test_scaffold_variates_come_from_the_noised_upload_on_both_sides(tiny_cfg):
    # The server's Δc_i and the client's stored c_i from the same (noised) y_i: c = (1/N) Σ c_i.
    sc = one_round(tiny_cfg(**{"algorithm.name": "scaffold", "federation.ldp_laplace": 0.05,
                               "federation.update_noise": 0.5}))
    lr, x0 = sc.cfg["federation"]["lr"], sc.initial.astype(np.float64)
    expected_c = np.zeros(sc.spec.size)
    for r in sc.last_results:  # r.params: what the server received, noise included
        c_i = (x0 - r.params) / (r.metrics["steps"] * lr)
        np.testing.assert_allclose(sc.client_states[r.cid]["c_i"], c_i, rtol=1e-5, atol=1e-5)
        expected_c += c_i / sc.server.num_clients
    np.testing.assert_allclose(sc.server.c, expected_c, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- the fit context

BUILT_ONCE = {"cfg", "spec", "model_factory", "_model", "_teacher", "_prev_model"}  # run-wide, not per call


@pytest.mark.parametrize("name", ["fedavg", "fedprox", "scaffold", "fednova", "fedlc", "fedrs", "fedlec",
                                  "fedmos", "sfedca", "divfl"])
def test_client_keeps_no_per_call_state(tiny_cfg, name):
    # a round's values (download, config, data, state, what begin derives) live in the FitContext
    skew = {"partition.scheme": "cnum", "partition.classes_per_client": 2}  # FedLEC distils
    extra = {"algorithm.candidates": 3} if name == "sfedca" else {}
    exp = one_round(tiny_cfg(**skew, **extra, **{"algorithm.name": name}))
    assert exp.record["trained"] and not exp.record["failed"], exp.record
    assert set(vars(exp.client)) <= BUILT_ONCE, set(vars(exp.client)) - BUILT_ONCE
