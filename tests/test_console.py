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


def test_a_second_run_on_the_same_folder_stops_while_the_first_writes(tmp_path):
    # A resume launched while the first process still runs would interleave its rounds with
    # the first's in metrics.jsonl and race it for the checkpoint; it must stop at once.
    import json
    import signal
    import time

    out = tmp_path / "r"
    metrics = out / "metrics.jsonl"

    def argv(rounds: int, *extra: str) -> list[str]:
        return [a.replace("federation.rounds=3", f"federation.rounds={rounds}") for a in _argv(out, "--quiet", *extra)]

    def rounds_recorded() -> list[int]:
        text = metrics.read_text()
        lines = text.splitlines()[: None if text.endswith("\n") else -1]  # the kill may cut a line short
        return [json.loads(line)["round"] for line in lines]

    first = subprocess.Popen(argv(10_000), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.read_text().strip()):
            assert first.poll() is None and time.monotonic() < deadline, "the first run wrote no round"
            time.sleep(0.2)
        second = subprocess.run(argv(10_000, "--resume"), capture_output=True, text=True, timeout=600, env=_env())
        assert first.poll() is None  # still training: the second ran beside it
    finally:
        first.send_signal(signal.SIGKILL)  # however the holder ends, its lock goes with it
        first.wait(timeout=60)
    assert second.returncode == 2, second.stderr[-2000:]
    errors = [line for line in second.stderr.splitlines() if "another neurofed run is writing in this folder" in line]
    assert len(errors) == 1 and str(out) in errors[0], second.stderr[-2000:]
    done = rounds_recorded()
    assert done == list(range(1, len(done) + 1))  # nothing of the second process in the first's record
    more = subprocess.run(argv(len(done) + 1, "--resume"), capture_output=True, text=True, timeout=600, env=_env())
    assert more.returncode == 0, more.stderr[-2000:]
    assert rounds_recorded()[-1] == len(done) + 1 and len(rounds_recorded()) == len(done) + 1
