"""Lava over shards of the samples in parallel workers (neurofed.deploy.lava_shards): the
same spikes, counts and predictions as one process, in real Lava fixed_pt."""

from __future__ import annotations

import numpy as np
import pytest

from neurofed.deploy import DeployError
from neurofed.deploy.export import export_model
from neurofed.deploy.lava_run import simulate
from neurofed.deploy.lava_shards import check_workers, simulate_shards
from test_deploy import random_spikes, tiny_model


def test_two_workers_give_the_one_process_result(tmp_path):
    model = tiny_model("mlp")
    path = tmp_path / "model.net"
    export_model(model, path)
    spikes = random_spikes(5)
    one, t1 = simulate(path, spikes, 3, progress=False)
    ticks = []
    two, t2 = simulate_shards(path, spikes, 3, workers=2, progress=False, simulate=simulate)
    assert t2["workers"] == 2 and t2["samples_per_s"] > 0
    assert one.counts[:, :-1].min() > 0, "test input too weak: a hidden layer never spikes"
    for field in ("counts", "checksums", "output"):
        np.testing.assert_array_equal(getattr(two, field), getattr(one, field))
    np.testing.assert_array_equal(two.predictions, one.predictions)
    for a, b in zip(two.neuron_totals, one.neuron_totals):
        np.testing.assert_array_equal(a, b)
    # progress as a callable: it hears every sample once (one process)
    simulate(path, spikes[:2], 3, progress=ticks.append, chunk=1)
    assert ticks == [1, 1]


def test_a_failing_worker_names_its_shard(tmp_path):
    model = tiny_model("mlp")
    path = tmp_path / "model.net"
    export_model(model, path)
    spikes = random_spikes(2, data_cfg={"encoding": "rate", "timesteps": 2, "max_rate": 1.0})
    with pytest.raises(DeployError, match=r"Lava worker \d \(shard \d of 2\): .*timesteps"):
        simulate_shards(path, spikes, 3, workers=2, progress=False, simulate=simulate)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_worker_counts_are_refused(bad):
    with pytest.raises(DeployError, match="--workers"):
        check_workers(bad, "fixed_pt")


def test_default_workers_are_the_usable_cores_and_a_chip_runs_one():
    import os

    assert check_workers(None, "fixed_pt") == len(os.sched_getaffinity(0))
    assert check_workers(4, "loihi2") == 1
