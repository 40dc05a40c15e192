"""What the benchmark scripts share: the machine header of a recorded result and the
report that prints each line and, with ``--save``, writes them to benchmarks/results/."""

from __future__ import annotations

import io
import os
import platform
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
