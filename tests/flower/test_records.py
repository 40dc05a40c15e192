"""neurofed.flower.records: every message, metric and state survives Flower's records."""

from __future__ import annotations

import numpy as np

import flower_helpers  # noqa: F401
from flwr.app import RecordDict
from neurofed.flower.records import (from_arrays, from_config, from_metrics, load_state, save_state, to_arrays,
                                     to_config, to_metrics)


def test_records_carry_every_message_losslessly():
    rng = np.random.default_rng(0)
    arrays = {"blocks.0.synapse.weight": rng.normal(size=(3, 4, 1, 1, 1)).astype(np.float32),
              "scaffold/c": rng.normal(size=7).astype(np.float32)}
    back = from_arrays(to_arrays(arrays))
    assert back.keys() == arrays.keys()
    for k in arrays:
        assert back[k].dtype == arrays[k].dtype and np.array_equal(back[k], arrays[k])

    config = {"round": 3, "seed": 2**31 - 1, "lr": 0.5, "name": "x", "flag": True, "none": None,
              "nested": {"a": [1, 2]}, "np": np.int64(4)}
    assert from_config(to_config(config)) == {**config, "np": 4}

    metrics = {"train_loss": 0.25, "steps": 7, "label_counts": [3, 0, 5], "delta_r": np.float64(1e-3),
               "rates": [0.5, 0.25], "ok": True, "note": None, "mixed": [1, 2.5], "empty": []}
    numeric, extra = to_metrics(metrics)
    assert set(numeric) == {"train_loss", "steps", "label_counts", "delta_r", "rates", "empty"}
    assert set(from_config(extra)) == {"ok", "note", "mixed"}
    assert from_metrics(numeric, extra) == {**metrics, "delta_r": 1e-3}

    store = RecordDict()
    save_state(store, {"c_i": arrays["scaffold/c"], "seen": 3})
    state = load_state(store)
    assert np.array_equal(state["c_i"], arrays["scaffold/c"]) and state["seen"] == 3
