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


def test_a_row_trained_afresh_drops_the_earlier_rows_seeds_and_a_reused_one_keeps_them(bench, tmp_path, monkeypatch):
    """Extra seeds belong to the run they repeat: a row retrained (another preset or neurofed)
    must not carry the seeds of the row it replaces; a reused run (only exported again) keeps them."""
    import json

    monkeypatch.setattr(bench, "table", lambda rows, header: "")  # the README's layout is not this test's
    preset = next(iter(bench.ROWS))
    seeds = {"1": {"status": "ok", "twin_float": 0.5, "qat8": 0.5, "twin8": 0.5}}
    bench.save([{"preset": preset, "status": "ok", "reused": False, "seeds": seeds}], "h", out=tmp_path)
    bench.save([{"preset": preset, "status": "ok", "reused": True}], "h", out=tmp_path)
    assert json.loads((tmp_path / "results.jsonl").read_text())["seeds"] == seeds
    bench.save([{"preset": preset, "status": "ok", "reused": False}], "h", out=tmp_path)
    assert "seeds" not in json.loads((tmp_path / "results.jsonl").read_text())
