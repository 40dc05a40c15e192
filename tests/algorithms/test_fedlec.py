"""FedLEC: L_c and L_d on hand-made logits, the teacher, Aggregation Through Time."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from algorithm_helpers import one_round
from neurofed.algorithms.base import FitResult, ServerContext, weighted_average
from neurofed.algorithms.fedlec import (LC_FORMS, LD_FORMS, aggregate_through_time, all_labels_kl, calibrated_ce,
                                        eq8_held_loss, eq8_loss, label_prior, missing_and_rest_kl, missing_label_kl)
from neurofed.training.params import ParamSpec


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
    # the default: Eq. 8 over the held labels, the authors' softmax over the missing ones
    assert (LC_FORMS[alg["lc_form"]], LD_FORMS[alg["ld_form"]]) == (eq8_held_loss, missing_label_kl)
    assert exp.record["att_time_parameters"] == 0  # ATT is FedAvg on SLAYER blocks, and says so
    teacher, student = exp.client._teacher, exp.client.model()
    assert teacher is not student
    assert np.array_equal(exp.spec.get(teacher), exp.initial)  # the round-1 global model
    assert not np.array_equal(exp.spec.get(student), exp.initial)
    literal = one_round(tiny_cfg(**{"algorithm.name": "fedlec", "partition.scheme": "cnum", "algorithm.lc_form": "eq8",
                                    "algorithm.ld_form": "missing_and_rest", "algorithm.lambda": 0.5}))
    alg = literal.cfg["algorithm"]
    assert (LC_FORMS[alg["lc_form"]], LD_FORMS[alg["ld_form"]]) == (eq8_loss, missing_and_rest_kl)  # the paper's literal form


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
