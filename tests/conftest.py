"""Shared fixtures: small, fast configs on the embedded digits set."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def tiny_overrides(**extra) -> list[str]:
    """A federated run that takes a few seconds: mlp at width 0.25, T=4."""
    base = {
        "model.name": "mlp",
        "model.width": 0.25,
        "data.timesteps": 4,
        "partition.num_clients": 4,
        "federation.clients_per_round": 2,
        "federation.local_epochs": 1,
        "federation.rounds": 2,
        "federation.batch_size": 64,
        "export": False,
        # the tests' exact equalities (resume, Flower vs in process) hold on the CPU;
        # tests/test_device.py covers the other devices
        "federation.device": "cpu",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


@pytest.fixture
def tiny_cfg():
    from neurofed.config import load_config

    def make(**extra):
        return load_config(None, tiny_overrides(**extra))

    return make


@pytest.fixture
def run_dir(finished, tmp_path):
    """A copy of the module's ``finished`` run (its own fixture), for a test to change."""
    import shutil

    out = tmp_path / "r"
    shutil.copytree(finished, out)
    return out


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` are skipped where torch sees no CUDA GPU."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)
