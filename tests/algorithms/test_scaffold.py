"""SCAFFOLD: option II control variates, the server's the mean of the clients', exact resume."""

from __future__ import annotations

import json

import numpy as np

from algorithm_helpers import one_round
from neurofed.algorithms.scaffold import C_KEY
from neurofed.rundir import load_state


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
