"""Energy per inference across data sets: short real runs, then one ``neurofed energy-report``.

Runs (each skipped when its run directory already holds a ``summary.json``):

- ``digits_rate``: ``examples/digits_fedavg.yaml`` (FedAvg, IID, rate input, T = 32);
- ``digits_events_fedavg``: the same recipe on ``digits_events`` (synthetic event
  input, T = 16);
- ``digits_events``: ``examples/digits_events_fedlec.yaml`` (FedLEC, #cnum=2, events);
- with ``--root DIR``: every file data set whose files ``neurofed datasets --root DIR``
  finds (mnist, fashion_mnist, cifar10, cifar100, svhn, nmnist, dvsgesture,
  cifar10dvs), with the ``digits_rate`` recipe (event sets with event input, T = 16)
  plus ``--set`` items, e.g. ``data.train_subset=0.1`` for a CPU-sized slice (the
  run's summary.json records it);

all with ``--rounds`` rounds (default 10) and one torch thread, and writes
``energy_report.{md,csv,png}`` over every run found in ``--runs`` to ``--out``.
Only real data: the embedded digits (and their synthetic events) and files on disk.

    python benchmarks/energy_per_dataset.py                          # the recorded rows
    python benchmarks/energy_per_dataset.py --root ~/data            # + a row per data set found there
    python benchmarks/energy_per_dataset.py --root ~/data --set data.train_subset=0.1 --set data.test_subset=0.2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVENT_SETS = ("nmnist", "dvsgesture", "cifar10dvs")


def planned_runs(root, rounds: int, extra: list[str]) -> list[tuple[str, str, list[str]]]:
    """(name, config, --set items) of every run to make."""
    common = [f"federation.rounds={rounds}", "federation.threads=1"]
    runs = [
        ("digits_rate", "examples/digits_fedavg.yaml", common),
        ("digits_events_fedavg", "examples/digits_fedavg.yaml",
         ["data.name=digits_events", "data.encoding=events", "data.timesteps=16", *common]),
        ("digits_events", "examples/digits_events_fedlec.yaml", [f"federation.rounds={rounds}", "lava.samples=100"]),
    ]
    if root:
        from neurofed.data.catalog import catalog

        for row in catalog(root):
            if not row.get("found") or row.get("sizes_from") == "embedded":
                continue
            name = row["name"]
            sets = [f"data.name={name}", f"data.root={root}", *common, *extra]
            if name in EVENT_SETS:
                sets += ["data.encoding=events", "data.timesteps=16"]
            runs.append((name, "examples/digits_fedavg.yaml", sets))
    return runs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", help="folder holding data sets' files (as data.root); adds a run per data set found")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                    help="extra override for the file data sets' runs (repeatable)")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "energy_per_dataset"), help="run directories' parent")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "energy_per_dataset"))
    args = ap.parse_args()
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    runs_dir = Path(args.runs)
    log = []
    for name, config, sets in planned_runs(args.root, args.rounds, args.sets):
        out = runs_dir / name
        cmd = [sys.executable, "-m", "neurofed.cli", "run", config, "--quiet", "--out", str(out)]
        for s in sets:
            cmd += ["--set", s]
        if (out / "summary.json").is_file():
            print(f"{name}: kept {out}")
        else:
            print(f"{name}: {' '.join(cmd[2:])}", flush=True)
            t = time.perf_counter()
            subprocess.run(cmd, cwd=ROOT, check=True)
            print(f"{name}: {time.perf_counter() - t:.0f} s")
        log.append({"run": name, "command": "neurofed " + " ".join(cmd[3:]),
                    "summary": json.loads((out / "summary.json").read_text())})
    from neurofed.energy.table import energy_report

    dirs = [runs_dir / r["run"] for r in log]
    res = energy_report([str(d) for d in dirs], args.out)
    Path(args.out, "runs.json").write_text(json.dumps(log, indent=1) + "\n")
    print(Path(res["markdown"]).read_text())
    print(f"-> {res['markdown']}, {res['csv']}, {res['plot']}, {Path(args.out, 'runs.json')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("MPLBACKEND", "Agg")
    sys.exit(main())
