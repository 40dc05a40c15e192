"""Memory of DivFL's server at the papers' scale (issue 32, item 13).

DivFL keeps every client's last update (N × P, float32) to select on. The server before
this change also took a float64 copy of the whole table, and its square, at every
selection; it now keeps the Gram matrix of the table (N × N) and recomputes the rows of
the clients that replied a block of parameters at a time
(:func:`neurofed.algorithms.divfl.gram_rows`).

Each measurement runs a DivFL server in its own process through two rounds — round 1:
all N clients reply (the runner holds their N parameter vectors, as here), the table is
filled and the greedy P are averaged; round 2: the selection on the stale table, then P
replies — on random float32 updates, and reads the peak of numpy's allocations
(``tracemalloc``, which numpy reports to) and the process's peak RSS. The old server is
the module as it was at commit OLD_COMMIT (``git show``), so both run the same driver.

    python benchmarks/divfl_memory.py                    # N = 100, P from sfedca_cifar10_dir03's model
    python benchmarks/divfl_memory.py --params 1000000   # another P
    python benchmarks/divfl_memory.py --save             # also writes benchmarks/results/divfl_memory.txt

The old server at the full scale needs more memory than a 24 GB machine has, so it is
measured at ``--old-params`` (default P / 16) and its peak scaled by P / old-params (every
large array it allocates is N × P); the new server is measured at the full P.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.common import ROOT, Report, machine_header  # noqa: E402

OLD_COMMIT = "919f94d"  # the last commit with the float64-copy server
GB = 1e9

DRIVER = r"""
import json, resource, sys, time, tracemalloc, importlib.util
import numpy as np
from neurofed.algorithms.base import FitResult, ServerContext
from neurofed.training.params import ParamSpec

path, n, p, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
spec_ = importlib.util.spec_from_file_location("divfl_under_test", path)
mod = importlib.util.module_from_spec(spec_)
spec_.loader.exec_module(mod)
cfg = {"seed": 0, "federation": {"clients_per_round": k}, "algorithm": {"name": "divfl"}}
rng = np.random.default_rng(0)
tracemalloc.start()
t0 = time.perf_counter()
server = mod.DivFLServer(cfg, ParamSpec(("w",), ((p,),)), np.zeros(p, np.float32), ServerContext(n))
# updates around 10 directions (client c near direction c % 10), so that the greedy picks are
# well separated and both servers must make the same ones
centres = rng.standard_normal((10, p), dtype=np.float32)
def update(c):
    return centres[c % 10] * (1 + 0.1 * (c % 7)) + 0.3 * rng.standard_normal(p, dtype=np.float32)
results = [FitResult(c, update(c), 10, {}) for c in range(n)]
server.aggregate(1, results)
del results
chosen = [c for c, _ in server.configure(2)]
server.aggregate(2, [FitResult(c, update(c), 10, {}) for c in chosen])
chosen3 = [c for c, _ in server.configure(3)]
_, peak = tracemalloc.get_traced_memory()
print(json.dumps({"peak_bytes": peak, "maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "seconds": time.perf_counter() - t0, "round2": chosen, "round3": chosen3}))
"""


def measure(module_path: str, n: int, p: int, k: int) -> dict:
    env = {**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", DRIVER, module_path, str(n), str(p), str(k)], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def preset_params(preset: str) -> int:
    from neurofed.config import load_config
    from neurofed.data.images import IMAGE_SETS
    from neurofed.models import build_model

    cfg = load_config(os.path.join(ROOT, "examples", "papers", f"{preset}.yaml"))
    info = IMAGE_SETS[cfg["data"]["name"]]
    model = build_model(cfg["model"], tuple(info.shape), info.num_classes, 1.0)
    return sum(x.numel() for x in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=100, help="N (the SFedCA presets: 100)")
    ap.add_argument("--per-round", type=int, default=2, help="P aggregated per round (SFedCA: 2)")
    ap.add_argument("--preset", default="sfedca_cifar10_dir03", help="whose model gives the parameter count")
    ap.add_argument("--params", type=int, default=None, help="parameter count (default: the preset model's)")
    ap.add_argument("--old-params", type=int, default=None, help="P for the old server (default: P / 16)")
    ap.add_argument("--save", action="store_true")
    args = ap.parse_args()
    p = args.params or preset_params(args.preset)
    p_old = args.old_params or max(1, p // 16)
    n, k = args.clients, args.per_round

    rep = Report()
    rep.emit(machine_header("divfl_memory"))
    rep.emit(f"# N = {n} clients, P = {p:,} parameters ({'--params' if args.params else args.preset}), "
             f"{k} aggregated per round; table N x P float32 = {n * p * 4 / GB:.2f} GB; "
             f"the runner's round-1 replies another {n * p * 4 / GB:.2f} GB")
    with tempfile.TemporaryDirectory() as tmp:
        old_path = os.path.join(tmp, "divfl_old.py")
        with open(old_path, "w", encoding="utf-8") as fh:
            fh.write(subprocess.run(["git", "-C", ROOT, "show", f"{OLD_COMMIT}:neurofed/algorithms/divfl.py"],
                                    capture_output=True, text=True, check=True).stdout)
        new_path = os.path.join(ROOT, "neurofed", "algorithms", "divfl.py")
        same_old = measure(old_path, n, p_old, k)
        same_new = measure(new_path, n, p_old, k)
        same = same_old["round2"] == same_new["round2"] and same_old["round3"] == same_new["round3"]
        rep.emit(f"at P = {p_old:,}: old peak {same_old['peak_bytes'] / GB:.3f} GB "
                 f"({same_old['peak_bytes'] / (n * p_old):.1f} B per table entry), new peak "
                 f"{same_new['peak_bytes'] / GB:.3f} GB ({same_new['peak_bytes'] / (n * p_old):.1f} B per entry); "
                 f"same selections: {same}")
        full = measure(new_path, n, p, k)
    old_full = same_old["peak_bytes"] * p / p_old
    rep.emit(f"at P = {p:,}: new peak {full['peak_bytes'] / GB:.2f} GB (numpy, tracemalloc), process peak RSS "
             f"{full['maxrss_bytes'] / GB:.2f} GB, {full['seconds']:.1f} s for 2 rounds; old peak scaled from "
             f"P = {p_old:,}: {old_full / GB:.2f} GB")
    rep.emit(f"RESULT divfl_memory N={n} P={p} new_peak_gb={full['peak_bytes'] / GB:.2f} "
             f"old_peak_gb={old_full / GB:.2f} ratio_old_over_new={old_full / full['peak_bytes']:.2f}")
    if args.save:
        rep.save("divfl_memory")


if __name__ == "__main__":
    main()
