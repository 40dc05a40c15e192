"""Local differential privacy that holds against the server (neurofed.training.privacy).

The noise cannot be regenerated from what the server holds, clipping bounds every
update, ε is what a hand computation gives, SCAFFOLD's variates stay consistent under
noise, and the seeded mode (named as giving no privacy) keeps resumes exact.
"""

import json
import math

import numpy as np
import pytest

from neurofed.fl.experiment import Experiment
from neurofed.pipeline import run
from neurofed.seeds import seed_for

B = 0.05  # Laplace scale of these tests


def one_round(cfg):
    exp = Experiment(cfg)
    exp.record = exp.run_round(1)
    return exp


def uploads(exp):
    return {r.cid: r.params.astype(np.float64) for r in exp.last_results}


# --------------------------------------------------------------------------- the noise


def test_two_runs_with_the_same_seed_upload_different_noise(tiny_cfg):
    a = uploads(one_round(tiny_cfg(**{"federation.ldp_laplace": B})))
    b = uploads(one_round(tiny_cfg(**{"federation.ldp_laplace": B})))
    assert a.keys() == b.keys()
    for cid in a:
        diff = a[cid] - b[cid]  # same training, independent Laplace draws: difference of two
        assert np.abs(diff).mean() == pytest.approx(1.5 * B, rel=0.15)  # E|X − Y| = 1.5 b


def _server_side_regeneration(cfg, exp):
    """What a curious server can do with config.yaml and the round's client seeds:
    redraw every seeded Laplace stream the client could have used and subtract it."""
    out = {}
    for r in exp.last_results:
        seed = exp.server.client_config(1, r.cid)["seed"]
        noise = np.random.default_rng(seed_for(seed, "ldp_laplace")).laplace(
            0.0, cfg["federation"]["ldp_laplace"], size=r.params.shape)
        out[r.cid] = r.params.astype(np.float64) - noise.astype(np.float32)
    return out


def test_the_server_cannot_regenerate_the_noise_from_what_it_holds(tiny_cfg, tmp_path):
    clean = uploads(one_round(tiny_cfg()))
    cfg = tiny_cfg(**{"federation.ldp_laplace": B})  # FedLEC Eq. 16 setting, default noise source
    exp = one_round(cfg)
    recovered = _server_side_regeneration(cfg, exp)
    for cid, upload in clean.items():
        # still one Laplace draw (os noise) minus another (the guess) away from the clean update
        assert np.abs(recovered[cid] - upload).mean() > 0.5 * B


def test_the_seeded_mode_is_named_for_what_it_is(tiny_cfg):
    """Control: with seeded noise the same regeneration recovers the clean update —
    which is why that mode is called seeded_not_private."""
    clean = uploads(one_round(tiny_cfg()))
    cfg = tiny_cfg(**{"federation.ldp_laplace": B, "federation.privacy_noise": "seeded_not_private"})
    recovered = _server_side_regeneration(cfg, one_round(cfg))
    for cid, upload in clean.items():
        np.testing.assert_allclose(recovered[cid], upload, atol=1e-6)


def test_os_laplace_and_gaussian_have_their_distributions():
    from neurofed.training.privacy import Noise

    noise = Noise("os_entropy", 0, "x")
    lap = noise.laplace(0.3, (400_000,))
    assert np.abs(lap).mean() == pytest.approx(0.3, rel=0.01) and lap.std() == pytest.approx(0.3 * math.sqrt(2), rel=0.01)
    gau = noise.normal(0.2, (400_000,))
    assert gau.std() == pytest.approx(0.2, rel=0.01) and abs(gau.mean()) < 0.002
    assert np.abs(gau).mean() == pytest.approx(0.2 * math.sqrt(2 / math.pi), rel=0.01)  # not a Laplace
    assert np.all(np.isfinite(lap)) and np.all(np.isfinite(gau))


# --------------------------------------------------------------------------- clipping


def test_clip_l1_bounds_the_norm_and_keeps_the_direction():
    from neurofed.training.privacy import clip_l1

    rng = np.random.default_rng(0)
    for scale in (1e-3, 1.0, 1e3):
        d = rng.normal(0, scale, 1000)
        c = clip_l1(d, 0.5)
        assert np.abs(c).sum() <= 0.5 * (1 + 1e-12)
        if np.abs(d).sum() > 0.5:
            np.testing.assert_allclose(c / np.abs(c).sum(), d / np.abs(d).sum())
        else:
            assert np.array_equal(c, d)


def test_every_upload_is_clipped_before_the_noise(tiny_cfg):
    clean = one_round(tiny_cfg())
    x0 = clean.initial.astype(np.float64)
    norms = [np.abs(u - x0).sum() for u in uploads(clean).values()]
    bound = min(norms) / 4  # every clean update is well beyond it
    b = 1e-9  # noise far below the bound, so the clipping is what the norm shows
    clipped = one_round(tiny_cfg(**{"federation.ldp_laplace": b, "federation.ldp_clip": bound}))
    for u in uploads(clipped).values():
        # float32 rounding of x + Δ adds at most half an ulp of x per value
        slack = np.sum(np.spacing(np.abs(x0).astype(np.float32))) + 20 * b * u.size
        assert np.abs(u - x0).sum() <= bound + slack
        assert np.abs(u - x0).sum() >= 0.9 * bound  # scaled down to the bound, not to zero


# --------------------------------------------------------------------------- epsilon


def test_epsilon_per_round_and_over_the_run_match_a_hand_computation(tiny_cfg, tmp_path):
    b, clip = 0.5, 0.25  # ε = 2C/b = 1 per upload
    cfg = tiny_cfg(**{"federation.rounds": 3, "federation.ldp_laplace": b, "federation.ldp_clip": clip})
    summary = run(cfg, tmp_path, progress=False, after=False)
    lines = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    uploads_so_far: dict[int, int] = {}
    for line in lines:
        for cid in line["trained"]:
            uploads_so_far[cid] = uploads_so_far.get(cid, 0) + 1
        assert line["privacy"]["epsilon_round"] == 1.0
        assert line["privacy"]["epsilon_spent"] == max(uploads_so_far.values()) * 1.0
        assert "label_counts" not in json.dumps(line)  # the class histogram is not sent under LDP
    p = summary["privacy"]
    assert p["noise"] == "os_entropy" and p["private"] is True
    assert p["epsilon_per_round"] == 1.0 and p["epsilon_run"] == max(uploads_so_far.values())
    assert p["mechanisms"][0]["sensitivity_l1"] == 2 * clip
    assert json.loads((tmp_path / "summary.json").read_text())["privacy"] == p


def test_fedlec_eq16_reports_unbounded_epsilon_and_seeded_reports_no_privacy(tiny_cfg, tmp_path, capsys):
    summary = run(tiny_cfg(**{"federation.ldp_laplace": 0.01}), tmp_path / "eq16", progress=False, after=False)
    assert summary["privacy"]["epsilon_per_round"] is None and summary["privacy"]["private"] is False
    assert "no epsilon holds" in capsys.readouterr().err
    summary = run(tiny_cfg(**{"federation.ldp_laplace": 0.5, "federation.ldp_clip": 0.25,
                              "federation.privacy_noise": "seeded_not_private"}),
                  tmp_path / "seeded", progress=False, after=False)
    assert summary["privacy"]["noise"] == "seeded_not_private" and summary["privacy"]["private"] is False
    assert summary["privacy"]["epsilon_per_round"] == 1.0  # the arithmetic holds; the premise does not
    assert "no privacy" in capsys.readouterr().err
    plain = run(tiny_cfg(), tmp_path / "plain", progress=False, after=False)
    assert plain["privacy"]["mechanisms"] == [] and plain["privacy"]["private"] is False


def test_gaussian_epsilon_meets_the_exact_condition():
    from neurofed.training.privacy import gaussian_epsilon

    def phi(t):
        return 0.5 * math.erfc(-t / math.sqrt(2))

    def delta_at(eps, sigma, sens):  # Balle & Wang 2018, Thm 8
        return phi(sens / (2 * sigma) - eps * sigma / sens) - math.exp(eps) * phi(-sens / (2 * sigma) - eps * sigma / sens)

    for sigma, sens, delta in ((1.0, 1.0, 1e-5), (5.0, math.sqrt(20), 1e-5), (0.3, 1.0, 1e-3)):
        eps = gaussian_epsilon(sigma, sens, delta)
        assert delta_at(eps, sigma, sens) == pytest.approx(delta, rel=1e-6)
        assert delta_at(eps * 0.99, sigma, sens) > delta
    # the classical calibration σ = Δ √(2 ln(1.25/δ)) / ε (Dwork & Roth Thm A.1, ε < 1) is looser
    classical = 0.5
    sigma = math.sqrt(2 * math.log(1.25 / 1e-5)) / classical
    assert 0.3 < gaussian_epsilon(sigma, 1.0, 1e-5) <= classical


def test_sfedca_rate_report_epsilon(tiny_cfg):
    from neurofed.algorithms.sfedca import SFedCA
    from neurofed.training.privacy import gaussian_epsilon, mechanisms

    cfg = tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3, "algorithm.rate_noise": 2.0,
                      "algorithm.rate_clip": 0.5, "federation.ldp_laplace": 0.5, "federation.ldp_clip": 0.25})
    update, rates = mechanisms(cfg, 10, SFedCA)
    assert update["epsilon"] == 1.0
    assert rates["sensitivity_l2"] == pytest.approx(0.5 * math.sqrt(20))  # 10 rates before, 10 after, in [0, 0.5]
    assert rates["epsilon"] == gaussian_epsilon(2.0, 0.5 * math.sqrt(20), 1e-5)
    no_update_noise = tiny_cfg(**{"algorithm.name": "sfedca", "algorithm.candidates": 3, "algorithm.rate_noise": 2.0})
    assert [m["epsilon"] is None for m in mechanisms(no_update_noise, 10, SFedCA)] == [True, False]  # update in the clear


# --------------------------------------------------------------------------- state under noise


def test_scaffold_variates_stay_consistent_under_ldp(tiny_cfg):
    """c = (1/N) Σ_i c_i after every round: each client derives Δc_i from the noised
    upload the server sees (from its clean weights, c and the c_i drift apart)."""
    exp = Experiment(tiny_cfg(**{"algorithm.name": "scaffold", "partition.scheme": "cnum",
                                 "federation.ldp_laplace": 0.01}))
    for rnd in (1, 2, 3):
        exp.run_round(rnd)
        mean_ci = sum(st["c_i"].astype(np.float64) for st in exp.client_states.values()) / exp.server.num_clients
        np.testing.assert_allclose(exp.server.c, mean_ci, rtol=1e-4, atol=1e-4 * np.abs(mean_ci).max())


@pytest.mark.parametrize("source", ["seeded_not_private", "os_entropy"])
def test_resume_with_noise(tiny_cfg, tmp_path, source):
    """Seeded noise: a resumed run is exact. OS entropy: the resumed rounds draw new
    noise (by design), so only the rounds before the kill are shared."""
    from neurofed.rundir import load_state

    cfg = tiny_cfg(**{"algorithm.name": "scaffold", "federation.rounds": 2, "federation.ldp_laplace": 0.01,
                      "federation.privacy_noise": source})
    run(cfg, tmp_path / "full", progress=False, after=False)
    short = json.loads(json.dumps(cfg))
    short["federation"]["rounds"] = 1
    run(short, tmp_path / "cut", progress=False, after=False)
    run(cfg, tmp_path / "cut", resume=True, progress=False, after=False)
    full, cut = (load_state(tmp_path / d / "checkpoint.npz", "checkpoint") for d in ("full", "cut"))
    same = np.array_equal(full["server"]["params"], cut["server"]["params"])
    assert same == (source == "seeded_not_private")
    if same:
        assert full["clients"].keys() == cut["clients"].keys()
        for cid, state in full["clients"].items():
            assert np.array_equal(state["c_i"], cut["clients"][cid]["c_i"])
