"""The benchmark scripts refuse bad input as the ``neurofed`` commands do: one line naming the
argument and what it allows, exit status 2, no traceback and nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("script, args, said", [
    ("fit_check.py", ["{tmp}/missing"], "{tmp}/missing: no such folder"),
    ("fit_check.py", ["{tmp}", "--samples", "0"], "argument --samples: got 0; expected an integer >= 1"),
    ("paper_tables.py", ["--root", "{tmp}", "--out", "{tmp}/out", "--rounds", "0"],
     "argument --rounds: got 0; expected an integer >= 1"),
    ("twin_curves.py", ["--preset", "no_such_preset", "--out", "{tmp}/out"], "'no_such_preset': no such config file"),
    ("twin_curves.py", ["--preset", "digits_fedavg", "--out", "{tmp}/out", "--epochs", "two"],
     "argument --epochs: got 'two'; expected an integer >= 1"),
    ("first_steps.py", ["--steps", "0"], "argument --steps: got 0; expected an integer >= 1"),
    ("first_steps.py", ["--preset", "no_such_preset"], "'no_such_preset': no such config file"),
    ("first_steps.py", ["--set", "model.width=7"], "model.width: got 7; expected <= 1"),
])
def test_a_benchmark_says_what_is_wrong_in_one_line(tmp_path, script, args, said):
    argv = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *argv], capture_output=True, text=True,
                          timeout=300)
    errors = [line for line in done.stderr.splitlines() if ": error: " in line]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(errors) == 1 and errors[0].startswith(f"{script}: error: ") and said.format(tmp=tmp_path) in errors[0]
    assert not (tmp_path / "out").exists()
