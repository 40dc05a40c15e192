"""benchmarks/first_steps.py: Adam's first step moves every weight by the learning rate, so a
tensor's relative change is lr × √(its weights) / its norm, whatever its gradient's size."""

import math

import pytest
import torch


@pytest.fixture
def bench(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import first_steps

    return first_steps


def test_the_first_adam_step_moves_each_tensor_by_lr_times_its_root_size_over_its_norm(bench):
    lr = 1e-3
    torch.set_num_threads(1)
    probe, model, cfg, _ = bench.probe_steps(
        "sfedca_mnist_dir03", None, 2, "snn", 1,
        ["federation.optimizer=adam", f"federation.lr={lr}", "federation.weight_decay=0", "federation.batch_size=32"])
    assert cfg["federation"]["optimizer"] == "adam" and len(probe.rows) == 2
    first = probe.rows[0]["moved"]
    assert set(first) == set(probe.weights) and len(first) >= 4  # every trained weight tensor, none of the pools'
    for name, w in probe.weights.items():
        sign_step = lr * math.sqrt(w.numel()) / float(w.norm())  # every element moved by ±lr
        assert 0.5 * sign_step < first[name] <= sign_step * (1 + 1e-3), name
    row = probe.rows[1]
    assert row["loss"] > 0 and row["logit_std"] > 0 and len(row["rates"]) == len(model.neurons_per_layer)
    assert all(0 <= r <= 1 for r in row["rates"]) and max(row["rates"]) > 0  # spikes per neuron per step
