"""Bad input, hardened (issue 35; issue 34 items 3, 9, 10, 11): no run or file a user
already has is overwritten, no value or file makes a run silently wrong, nothing hangs,
and every refusal is one line naming the problem, with exit code 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import tiny_overrides
from neurofed.cli import main
from neurofed.config import MAX_PROBLEMS, ConfigError, load_config

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits_fedavg.yaml"


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


def refused(capsys, *argv) -> str:
    """Run the CLI; assert it answered with exit 2 and one line; return that line."""
    code, err = cli(capsys, *argv)
    errors = [l for l in err if l.startswith("neurofed: error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in "\n".join(err), (code, err)
    return errors[0]


# --------------------------------------------------------------------------- configs (35.4, 35.10, 35.11, 34.9)


@pytest.mark.parametrize("key", ["federation.lr", "federation.lr_decay", "federation.momentum",
                                 "federation.weight_decay", "federation.logit_scale", "federation.straggler_prob",
                                 "federation.ldp_laplace", "federation.update_noise", "federation.target_accuracy",
                                 "data.max_rate", "partition.alpha"])
@pytest.mark.parametrize("value", [".nan", ".inf"])
def test_every_float_option_is_finite(key, value):
    with pytest.raises(ConfigError) as exc:
        load_config(None, [f"{key}={value}"])
    assert str(exc.value) == f"{key}: got {float(value[1:])}; expected a finite number"


def test_non_finite_values_inside_lists_and_algorithm_keys_are_refused():
    with pytest.raises(ConfigError, match=r"^partition\.ratio: got \[inf, 1\]; expected a finite number$"):
        load_config(None, ["partition.ratio=[.inf, 1]"])
    with pytest.raises(ConfigError, match=r"^algorithm\.mu: got nan; expected a finite number$"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.mu=.nan"])


def test_a_typo_in_a_key_suggests_the_nearest():
    with pytest.raises(ConfigError, match=r"^federation\.rouds: unknown key; did you mean federation\.rounds\?$"):
        load_config(None, ["federation.rouds=3"])
    with pytest.raises(ConfigError, match=r"^federaton\.lr: unknown key; did you mean federation\.lr\?$"):
        load_config(None, ["federaton.lr=0.1"])
    with pytest.raises(ConfigError, match=r"algorithm\.muu: unknown key for fedprox; did you mean algorithm\.mu\?"):
        load_config(None, ["algorithm.name=fedprox", "algorithm.muu=0.1"])


def test_a_section_set_to_a_scalar_is_one_line(capsys):
    line = refused(capsys, "run", EXAMPLE, "--set", "algorithm=3", "--out", "unused")
    assert line == ("neurofed: error: algorithm: got 3; expected a mapping of keys (an empty section runs its "
                    "defaults: remove it instead)")


BOMB = "".join(f"{a}: &{a} [{', '.join([f'*{p}'] * 9) if p else ', '.join(['lol'] * 9)}]\n"
               for p, a in zip(["", *"abcdefgh"], "abcdefghi"))


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text(BOMB)
    t0 = time.perf_counter()
    line = refused(capsys, "run", cfg, "--out", tmp_path / "o")
    assert time.perf_counter() - t0 < 5
    assert "holds more than 100,000 values once its YAML aliases are expanded" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["file", "set value", "set key"])
def test_nesting_thousands_deep_is_one_line(tmp_path, capsys, where):
    deep = "[" * 5000 + "]" * 5000
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"seed: 0\nfederation:\n  lr: {deep}\n" if where == "file" else "seed: 0\n")
    extra = {"file": [], "set value": ["--set", f"federation.lr={deep}"],
             "set key": ["--set", "a" + ".a" * 5000 + "=1"]}[where]
    line = refused(capsys, "run", cfg, *extra, "--out", tmp_path / "o")
    assert "levels deep" in line and len(line) < 300


def test_big_configs_are_refused_and_errors_are_capped(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_text("federation:\n" + "  pad: " + "x" * (2 << 20) + "\n")
    line = refused(capsys, "run", big, "--out", tmp_path / "o")
    assert "bytes; a config holds at most 1,048,576" in line
    many = tmp_path / "many.yaml"
    many.write_text("federation:\n" + "".join(f"  unknown_{i}: 1\n" for i in range(500)))
    code, err = cli(capsys, "run", many, "--out", tmp_path / "o")
    assert code == 2 and len(err) == MAX_PROBLEMS + 1
    assert err[-1] == f"neurofed: error: ... and {500 - MAX_PROBLEMS} more problems (fix these first)"
    long_value = tmp_path / "long.yaml"
    long_value.write_text("federation:\n  optimizer: " + "x" * 500_000 + "\n")
    line = refused(capsys, "run", long_value, "--out", tmp_path / "o")
    assert line.startswith("neurofed: error: federation.optimizer: got 'xxx") and len(line) < 300


# --------------------------------------------------------------------------- run directories (35.1-35.5, 35.11, 34.3)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-round run, written by the command line."""
    from neurofed.fl.runner import run

    out = tmp_path_factory.mktemp("run") / "r"
    run(load_config(None, tiny_overrides(**{"federation.privacy_noise": "seeded_not_private"})), out,
        progress=False, after=False)
    return out


@pytest.fixture
def run_dir(finished, tmp_path):
    out = tmp_path / "r"
    shutil.copytree(finished, out)
    return out


def run_argv(run_dir, *extra):
    return ["run", run_dir / "config.yaml", "--out", run_dir, "--quiet", *extra]


def snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_without_a_checkpoint_keeps_the_results(run_dir, capsys):
    (run_dir / "checkpoint.npz").unlink()
    before = snapshot(run_dir)
    line = refused(capsys, *run_argv(run_dir, "--resume"))
    assert "but no checkpoint.npz to continue from; starting again would overwrite them" in line
    assert "metrics.jsonl" in line and "model_best.npz" in line
    assert snapshot(run_dir) == before


def test_no_file_of_an_existing_run_is_overwritten(run_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    for name in ("model_best.npz", "model_last.npz"):
        shutil.copy(run_dir / name, out / name)
    (out / "config.yaml").write_text("# my own notes on this experiment\n" + (run_dir / "config.yaml").read_text())
    before = snapshot(out)
    line = refused(capsys, *run_argv(run_dir)[:2], "--out", out, "--quiet")
    assert "already holds config.yaml, model_best.npz, model_last.npz, which this run would overwrite" in line
    assert snapshot(out) == before


def test_a_half_written_metrics_line_is_recovered(run_dir, tmp_path, capsys):
    """A kill mid-write of round 3's line: --resume drops the half line (the checkpoint is
    at round 2) and ends exactly where the uninterrupted run does."""
    from neurofed.fl.runner import run

    cfg = load_config(run_dir / "config.yaml", ["federation.rounds=3"])
    whole = run(cfg, tmp_path / "whole", progress=False, after=False)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 3, "accuracy": 0.1')
    code, err = cli(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=3"))
    assert code == 0, err
    assert any("dropped a half-written last line" in l for l in err)
    lines = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [l["round"] for l in lines] == [1, 2, 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final_accuracy"] == whole["final_accuracy"] and summary["rounds"] == 3


def test_a_damaged_line_inside_metrics_is_named(run_dir, capsys):
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("{garbage\n" + "\n".join(lines[1:]) + "\n")
    line = refused(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=3"))
    assert line.endswith("metrics.jsonl: line 1 is not a round's JSON record (damaged file); "
                         "expected one JSON object per round")


def test_resume_with_fewer_rounds_than_done_is_refused(run_dir, capsys):
    line = refused(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=1"))
    assert line.endswith("federation.rounds: got 1; " + f"{run_dir} has already completed 2 rounds "
                         "(resume with federation.rounds >= 2, or read its results as they are)")


@pytest.mark.parametrize("where", ["file", "below a file"])
def test_out_that_is_a_file_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("mine")
    out = tmp_path / "f" if where == "file" else tmp_path / "f" / "run"
    line = refused(capsys, "run", EXAMPLE, "--out", out, "--quiet")
    assert ("is a file; expected a folder" if where == "file" else f"lies below {tmp_path / 'f'}, which is a file") \
        in line
    assert (tmp_path / "f").read_text() == "mine"


def test_a_checkpoint_that_does_not_fit_the_model_is_one_line(run_dir, capsys):
    from neurofed.runfiles import load_state, save_state

    state = load_state(run_dir / "checkpoint.npz", "checkpoint")
    state["server"]["params"] = state["server"]["params"][:-7]  # save_state recomputes the digest
    save_state(run_dir / "checkpoint.npz", state, "checkpoint")
    line = refused(capsys, *run_argv(run_dir, "--resume", "--set", "federation.rounds=3"))
    assert "checkpoint.npz: does not fit this run's model and algorithm" in line


def test_a_failed_start_leaves_no_run_directory(tmp_path, capsys):
    """A data set whose files are missing: the start fails after the run directory was
    made; it is removed, so a second try is not refused as existing."""
    out = tmp_path / "runs" / "mnist-seed0"
    argv = ["run", EXAMPLE, "--set", "data.name=mnist", "--set", f"data.root={tmp_path / 'nothing'}",
            "--out", out, "--quiet"]
    first = refused(capsys, *argv)
    assert "no MNIST files found" in first and not out.exists()
    assert refused(capsys, *argv) == first
    out.mkdir(parents=True)  # a folder the user made: kept, and left as it was
    refused(capsys, *argv)
    assert out.is_dir() and not any(out.iterdir())


def test_a_run_in_which_no_update_was_aggregated_fails(tmp_path, capsys):
    """Noise of 1e39 overflows every float32 update: each client's reply is dropped as
    non-finite, so the global model never changes. That is not a success."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("seed: 0\n")
    argv = ["run", cfg, *sum((["--set", o] for o in tiny_overrides(**{
        "federation.rounds": 1, "federation.update_noise": 1e39, "federation.update_noise_mode": "absolute"})), []),
        "--out", tmp_path / "o", "--quiet"]
    line = refused(capsys, *argv)
    assert "no client's update was aggregated in any of the 1 rounds (2 client replies failed, first: client" in line
    assert "update has non-finite values" in line
    assert (tmp_path / "o" / "summary.json").exists()  # the results are kept


# --------------------------------------------------------------------------- exported networks (35.9, 35.11)


def test_an_altered_network_is_refused_before_lava_runs_it(run_dir, capsys):
    import h5py

    from neurofed.deploy.export import export_run, file_sha256

    net = export_run(run_dir, quiet=True)
    assert (run_dir / "model.net.sha256").read_text() == f"{file_sha256(net)}  model.net\n"
    with h5py.File(net, "r+") as h:  # still valid HDF5, same shapes: only the digest tells
        w = h["layer/2/weight"]
        w[...] = -w[()]
    line = refused(capsys, "lava", run_dir, "--samples", 2, "--quiet")
    assert line.endswith("model.net: SHA-256 differs from the one recorded at export (model.net.sha256): the "
                         f"network was changed after `neurofed export`; re-create it with `neurofed export {run_dir}`")
    assert not (run_dir / "lava.json").exists()


@pytest.mark.parametrize("content", ["- 1\n- 2\n", "federation: [1]\n", "federation:\n  lr: .nan\n"])
def test_export_reads_the_run_config_validated(run_dir, capsys, content):
    (run_dir / "config.yaml").write_text(content)
    line = refused(capsys, "export", run_dir)
    assert f"{run_dir / 'config.yaml'}: " in line
