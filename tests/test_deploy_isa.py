"""benchmarks/deploy_isa.py: a run's export and Lava check redone with the libraries held to
SSE give the same netx file and the same spikes as the native check (the digits data are
bytes and the rate input is drawn from numpy's generator, so nothing float enters the input)."""

import platform

import pytest


@pytest.fixture
def bench(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import deploy_isa

    return deploy_isa


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the limits are x86 instruction sets")
def test_the_export_and_lava_check_are_the_same_with_the_libraries_held_to_sse(bench, tmp_path, tiny_cfg, capsys):
    from neurofed.pipeline import run

    out = tmp_path / "run"
    run(tiny_cfg(export=True, **{"lava.samples": 6, "model.threshold": 0.6, "data.timesteps": 8}), out, progress=False)
    capsys.readouterr()
    assert bench.main([str(out), "--isa", "sse", "--samples", "6"]) == 0
    printed = capsys.readouterr().out
    assert "torch's kernels: DEFAULT" in printed  # the limits reached the child
    total = printed.split("model.net: ")[1].split(" of ")[1].split()[0]
    assert f"model.net: {total} of {total} datasets bit-identical" in printed
    assert "spike for spike True, agreement 1.0000" in printed
    assert "predictions 1.0000 identical (ratio 6/6), per-layer spike counts 1.0000 identical" in printed


def test_a_run_without_a_native_check_is_refused(bench, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        bench.main([str(tmp_path), "--isa", "avx2"])
    assert exit_.value.code == 2 and "run `neurofed lava" in capsys.readouterr().err
