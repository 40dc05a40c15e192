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
    assert line == "neurofed: error: algorithm: got 3; expected a mapping of keys (e.g. algorithm.name=...)"


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
