"""What the benchmark scripts share: the machine header of a recorded result and the
report that prints each line and, with ``--save``, writes them to benchmarks/results/."""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def at_least(minimum: int):
    """An argparse type: an integer >= ``minimum`` (rounds, samples, epochs, threads)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"got {text!r}; expected an integer >= {minimum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"got {value}; expected an integer >= {minimum}")
        return value
    return parse


def with_one_line_errors(main) -> int:
    """``main()``, with neurofed's input errors (a run folder, a preset, a data file) said one line
    each with exit status 2, as the ``neurofed`` commands say them, instead of a traceback."""
    from neurofed.cli import INPUT_ERRORS, error_lines

    try:
        return main()
    except INPUT_ERRORS as exc:
        for line in error_lines(exc):
            print(f"{os.path.basename(sys.argv[0])}: error: {line}", file=sys.stderr)
        return 2


def machine_header(name: str, load_note: str = "") -> str:
    """Comment lines describing the machine and software."""
    import torch

    model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        lava_dl = version("lava-dl")
    except Exception:
        lava_dl = "?"
    load = os.getloadavg() if hasattr(os, "getloadavg") else ("?",)
    return "\n".join([
        f"# {name} benchmark",
        f"# date: {time.strftime('%Y-%m-%d %H:%M:%S')}",
        f"# machine: nproc={os.cpu_count()} cpu='{model}' ({platform.machine()}, {platform.system()})",
        f"# torch {torch.__version__}, torch threads {torch.get_num_threads()}, lava-dl {lava_dl}, "
        f"python {platform.python_version()}",
        f"# load average at start: {' '.join(f'{x:.2f}' for x in load)} {load_note}".rstrip(),
    ])


class Report:
    """Lines printed as they come and kept, to be saved as the recorded result."""

    def __init__(self) -> None:
        self._buf = io.StringIO()

    def emit(self, line: str = "") -> None:
        print(line, flush=True)
        self._buf.write(line + "\n")

    def save(self, name: str) -> str:
        """Write the lines to ``benchmarks/results/<name>.txt``; return the path."""
        path = os.path.join(ROOT, "benchmarks", "results", f"{name}.txt")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self._buf.getvalue())
        print(f"saved {path}")
        return path


def run_rounds(run_dir) -> list[dict]:
    """The per-round records of a run folder's metrics.jsonl, as the run itself reads them (a
    last line cut by an interrupted run is skipped: the resumed run writes it again)."""
    from neurofed.rundir import read_metrics

    return read_metrics(run_dir, None)[0]


# The ``neurofed run`` children of run_to now running. A SIGTERM to the benchmark alone (``pkill -f``
# on its command line) once left its child training, and a resume then ran a second one on the folder.
_RUNNING: set = set()


def stop_runs_with_the_benchmark() -> None:
    """From the main thread: a SIGTERM to the benchmark stops its ``neurofed run`` children too
    (each run folder keeps its last checkpoint and resumes), then exits with 143."""
    import signal

    def stop(signum, frame):
        for proc in list(_RUNNING):
            proc.terminate()
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def run_to(config: str, run_dir, rounds: int, sets: list[str], log_path) -> int:
    """``neurofed run config`` in ``run_dir`` up to ``rounds`` rounds: nothing when it holds
    them already, resumed when it holds fewer (only federation.rounds may grow), started
    otherwise. Output goes to ``log_path``; returns the exit status."""
    import subprocess
    import sys
    from pathlib import Path

    run_dir = Path(run_dir)
    if len(run_rounds(run_dir)) >= rounds:
        return 0
    cmd = [str(Path(sys.executable).with_name("neurofed")), "run", config, "--out", str(run_dir), "--quiet"]
    if run_dir.exists():
        cmd.append("--resume")
    for s in [*sets, f"federation.rounds={rounds}"]:
        cmd += ["--set", s]
    print(" ".join(cmd[1:]), flush=True)
    with open(log_path, "a", encoding="utf-8") as log, \
            subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT) as proc:
        _RUNNING.add(proc)
        try:
            return proc.wait()
        finally:
            _RUNNING.discard(proc)
