"""benchmarks/deploy_presets.py's rows are runnable: every row names a preset, its overrides
make a valid config that exports and runs Lava on 100 test samples out of the run's test subset."""

import pytest

from neurofed.config import load_config
from neurofed.presets import presets


@pytest.fixture
def bench(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))  # undone after the test
    import deploy_presets

    return deploy_presets


def test_every_row_is_a_preset_whose_reduced_config_exports_and_runs_lava(bench):
    known = presets()
    for name, (_, over, _) in bench.ROWS.items():
        assert name in known, name
        # the real-data row's folder need not exist here (a user's clone has no ../shared)
        over = [o if not o.startswith("data.root=") else "data.root=/nonexistent" for o in over]
        cfg = load_config(known[name], overrides=[*over, *bench.COMMON])  # raises ConfigError when invalid
        assert cfg["export"] is True and cfg["lava"]["samples"] == 100, name
        assert cfg["data"]["test_subset"] is None or cfg["data"]["test_subset"] >= 100, name
        twin = load_config(known[name], overrides=[*over, *bench.COMMON, *bench.FLOAT_TWIN])  # the float twin
        assert twin["model"]["quantize"] is False and twin["export"] is False, name
        preset = load_config(known[name], overrides=["data.root=/nonexistent"])
        assert cfg["model"]["quantize"] == preset["model"]["quantize"], name  # the row trains as the preset does


def test_an_unknown_row_is_refused_in_one_line(bench, capsys):
    assert bench.main(["--only", "no_such_preset"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no_such_preset" in err and "sfedca_mnist_dir03" in err and "\n" not in err
