"""neurofed's im2col process model for Lava's ``Conv`` gives Lava's own fixed_pt result:
the same arrays as ``lava.proc.conv.utils.conv_scipy`` on every geometry, and the same
network spikes as Lava's ``PyConvModelFixed`` in a full run."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.deploy.lava_procs.fast_conv import _conv_utils, conv_im2col
from neurofed.deploy.lava_run import CONV_MODEL_ENV, simulate

from test_lava_mechanisms import DIRECT, images, tiny
from neurofed.deploy.export import export_model
from neurofed.deploy.lava_plan import input_spikes


def geometries(n=60, seed=0):
    rng = np.random.default_rng(seed)
    while n:
        groups = int(rng.choice([1, 2, 3]))
        c, k = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
        size, kernel, stride, pad, dil = (rng.integers(lo, hi, 2) for lo, hi in
                                          ((3, 12), (1, 4), (1, 3), (0, 3), (1, 3)))
        if np.any(size + 2 * pad - dil * (kernel - 1) - 1 < 0):
            continue
        n -= 1
        yield rng, tuple(size), c, k, groups, tuple(kernel), tuple(stride), tuple(pad), tuple(dil)


@pytest.mark.parametrize("graded", [False, True])
def test_im2col_equals_lavas_scipy_convolution(graded):
    for rng, size, c, k, groups, kernel, stride, pad, dil in geometries():
        x = (rng.integers(-30000, 30000, (*size, c)).astype(np.int32) if graded
             else rng.random((*size, c)) < 0.3)
        w = rng.integers(-256, 255, (k, *kernel, c // groups)).astype(np.int32)
        want = _conv_utils.conv_scipy(x, w, kernel, stride, pad, dil, groups).astype(w.dtype)
        got = conv_im2col(x, w, kernel, stride, pad, dil, groups)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_a_network_runs_spike_for_spike_with_either_conv_model(tmp_path, monkeypatch):
    model = tiny(delay_shift=False)
    path = tmp_path / "m.net"
    export_model(model, path, timesteps=DIRECT["timesteps"], encoding="direct")
    values, _ = input_spikes(images(4), DIRECT, 3)
    runs = {}
    for conv in ("stock", "im2col"):
        monkeypatch.setenv(CONV_MODEL_ENV, conv)
        runs[conv], _ = simulate(path, values, 3, progress=False)
    assert runs["stock"].counts.sum() > 0
    for field in ("counts", "checksums", "output"):
        np.testing.assert_array_equal(getattr(runs["im2col"], field), getattr(runs["stock"], field))


def test_an_unknown_conv_model_is_refused_in_one_line(monkeypatch):
    from neurofed.deploy import DeployError
    from neurofed.deploy.lava_run import run_config

    monkeypatch.setenv(CONV_MODEL_ENV, "cuda")
    with pytest.raises(DeployError, match="allowed: im2col"):
        run_config("fixed_pt")
