"""What `neurofed run` writes while it trains: progress bars on a terminal; sent to a file or a
pipe, one line per round and the warnings, no bar (issue 49: `make run > log 2>&1` wrote 1,862
lines of redrawn bars for 30 rounds); `--quiet`: neither."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import tiny_overrides

ROOT = Path(__file__).resolve().parents[1]


def _argv(out: Path, *extra: str) -> list[str]:
    sets = [a for kv in tiny_overrides(**{"federation.rounds": 3, "energy.enabled": False}) for a in ("--set", kv)]
    return [sys.executable, "-m", "neurofed.cli", "run", "digits_fedavg", *sets, "--out", str(out), *extra]


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "OMP_NUM_THREADS": "1", "COLUMNS": "100"}


def test_a_log_gets_one_line_per_round_and_no_bars(tmp_path):
    res = subprocess.run(_argv(tmp_path / "r"), capture_output=True, text=True, timeout=600, env=_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert "\r" not in res.stderr and "\x1b[" not in res.stderr  # nothing redrawn
    rounds = [line for line in res.stderr.splitlines() if line.startswith("fedavg round ")]
    assert [line.split(":")[0] for line in rounds] == ["fedavg round 1/3", "fedavg round 2/3", "fedavg round 3/3"]
    assert all("accuracy" in line and "client(s) trained" in line for line in rounds)
    others = [line for line in res.stderr.splitlines() if line not in rounds]
    assert all(line.startswith("neurofed: ") for line in others), others  # the device line and warnings
    log = (tmp_path / "r" / "run.log").read_text()
    assert "\r" not in log and log.count(" round ") >= 3


@pytest.mark.skipif(not hasattr(pty, "openpty"), reason="needs a pseudo-terminal")
def test_a_terminal_gets_the_progress_bars(tmp_path):
    import fcntl
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new pty is 0 columns wide
    proc = subprocess.Popen(_argv(tmp_path / "r"), stdout=subprocess.DEVNULL, stderr=follower, env=_env())
    os.close(follower)
    chunks = []
    while True:
        try:
            data = os.read(leader, 65536)
        except OSError:  # the process closed its end
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=600) == 0
    os.close(leader)
    screen = b"".join(chunks).decode(errors="replace")
    assert "fedavg rounds" in screen and "\r" in screen  # tqdm's bar, redrawn in place
    assert "fedavg round 1/3:" not in screen  # no log lines on a terminal
