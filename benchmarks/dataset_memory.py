"""Memory of a federated run on a CIFAR-10-sized data set: images held once, as uint8.

Writes a CIFAR-10-sized STAND-IN in the binary release's format to a temporary folder
(``cifar-10-batches-bin/``: 50,000 training + 10,000 test records of 1 label byte +
3x32x32 random pixel bytes; labels cycle through the 10 classes) and loads it through
the registry (``data.name: cifar10``). Each measurement runs in its own process:

1. the first load (decodes the files into the uint8 cache) and a second load in a
   fresh process (memory-maps the cache);
2. neurofed: an :class:`~neurofed.fl.experiment.Experiment` with 10 and with 100 IID
   clients; every client's shard is materialised once, as a round does
   (``client_data``), and the process's RSS is read afterwards: the training images
   are one uint8 memory map (150 MB) shared by all clients, whatever their number;
3. the baseline it replaces, "float32 per client": the training set converted to
   float32 once (as the runner did before) and every client holding its shard as a
   float32 tensor (the usual simulation, one dataset object per client), 100 clients;
4. a short real run, ``neurofed run`` with 100 clients: 1 round, 2 clients of 500
   images, 1 local epoch (16 steps of 32), the digits ``cnn`` at T = 8, evaluated on a
   2,000-image test subset, no export or energy; its peak RSS (``ru_maxrss``).

    python benchmarks/dataset_memory.py            # prints the figures; RESULT line last
    python benchmarks/dataset_memory.py --save     # also writes benchmarks/results/dataset_memory.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for p in (ROOT, os.path.dirname(os.path.abspath(__file__))):
    if p not in sys.path:
        sys.path.insert(0, p)

import numpy as np  # noqa: E402

from common import Report, machine_header, with_one_line_errors  # noqa: E402

MB = 1e6
TRAIN, TEST, PIXELS = 50_000, 10_000, 3 * 32 * 32


def write_standin(root: str) -> float:
    """The stand-in in CIFAR-10's binary layout, written 10,000 records at a time; seconds."""
    t = time.perf_counter()
    out = os.path.join(root, "cifar-10-batches-bin")
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, start in [(f"data_batch_{i + 1}", i * 10_000) for i in range(5)] + [("test_batch", 0)]:
        rec = np.empty((10_000, 1 + PIXELS), np.uint8)
        rec[:, 0] = (np.arange(start, start + 10_000) % 10).astype(np.uint8)
        rec[:, 1:] = rng.integers(0, 256, (10_000, PIXELS), dtype=np.uint8)
        rec.tofile(os.path.join(out, f"{name}.bin"))
    return time.perf_counter() - t


# --------------------------------------------------------------------------- child processes

CHILD_PRELUDE = """
import json, os, resource, sys, time
sys.path.insert(0, {root!r})
def rss():
    f = {{}}
    for line in open('/proc/self/status'):
        k, _, v = line.partition(':')
        if k in ('VmRSS', 'RssAnon', 'RssFile'):
            f[k] = int(v.split()[0]) * 1024
    return f
def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

LOAD = """
from neurofed.data import load_dataset
t = time.perf_counter()
ds = load_dataset({{'name': 'cifar10', 'root': {data!r}}})
sec = time.perf_counter() - t
print(json.dumps({{'seconds': sec, 'x_train': [list(ds.x_train.shape), str(ds.x_train.dtype),
                  type(ds.x_train).__name__, int(ds.x_train.nbytes)], 'cache': ds.info['cache'],
                  'peak': peak()}}))
"""

NEUROFED = """
import torch
from neurofed.config import load_config
from neurofed.fl.experiment import Experiment
cfg = load_config(None, ['data.name=cifar10', 'data.root={data}', 'data.timesteps=8',
                         'partition.num_clients={clients}', 'federation.clients_per_round=2',
                         'federation.threads=1', 'export=false'])
base = rss()
exp = Experiment(cfg)
built = rss()
x = exp.x_train
shared = x.data_ptr() == exp.dataset.x_train.ctypes.data
per_client = 0
for cid in range(len(exp.parts)):
    d = exp.client_data(cid)      # what a round hands a client: a uint8 copy of its shard only
    per_client = max(per_client, d.x.numel() * d.x.element_size())
    del d
held = int(x.numel() * x.element_size())
index_bytes = int(sum(p.nbytes for p in exp.parts))
print(json.dumps({{'clients': {clients}, 'x_dtype': str(x.dtype), 'images_held': held, 'shared_with_cache': shared,
                  'index_bytes': index_bytes, 'largest_shard': per_client, 'rss_before': base, 'rss_built': built,
                  'rss_after': rss(),
                  'peak': peak()}}))
"""

NAIVE = """
import numpy as np, torch
from neurofed.config import load_config
from neurofed.data.partition import partition
from neurofed.data import load_dataset
from neurofed.seeds import rng_for
ds = load_dataset({{'name': 'cifar10', 'root': {data!r}}})
parts = partition(ds.y_train, 10, {{'scheme': 'iid', 'num_clients': {clients}}}, rng_for(0, 'partition'))
base = rss()
x = torch.as_tensor(np.asarray(ds.x_train, dtype=np.float32) / 255)   # the float32 training set
shards = [x[torch.as_tensor(p)].clone() for p in parts]             # one float32 shard per client
held = int(x.numel() * 4 + sum(s.numel() * 4 for s in shards))
print(json.dumps({{'clients': {clients}, 'images_held': held, 'rss_before': base, 'rss_after': rss(), 'peak': peak()}}))
"""

RUN = """
from neurofed.cli import main
t = time.perf_counter()
rc = main(['run', os.path.join({root!r}, 'examples', 'digits_fedavg.yaml'), '--quiet', '--out', {out!r},
           '--set', 'data.name=cifar10', '--set', 'data.root={data}', '--set', 'data.timesteps=8',
           '--set', 'data.test_subset=2000', '--set', 'partition.num_clients=100',
           '--set', 'federation.clients_per_round=2', '--set', 'federation.rounds=1',
           '--set', 'federation.local_epochs=1', '--set', 'federation.batch_size=32',
           '--set', 'federation.threads=1', '--set', 'export=false', '--set', 'lava.samples=0',
           '--set', 'energy.enabled=false'])
print(json.dumps({{'rc': rc, 'seconds': time.perf_counter() - t, 'peak': peak(), 'rss_end': rss()}}))
"""


def child(code: str, **fmt) -> dict:
    src = CHILD_PRELUDE.format(root=ROOT) + code.format(root=ROOT, **fmt)
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"child failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/dataset_memory.txt and .json")
    ap.add_argument("--keep", help="use (and keep) this folder for the stand-in instead of a temporary one")
    args = ap.parse_args()
    rep = Report()
    rep.emit(machine_header("dataset_memory", "(shared machine: other jobs were running)"))
    tmp = args.keep or tempfile.mkdtemp(prefix="neurofed-memory-")
    data = os.path.join(tmp, "data")
    results: dict = {}
    rep.emit(f"stand-in: CIFAR-10 binary layout, {TRAIN:,} + {TEST:,} random 3x32x32 images in {data} "
             f"(not CIFAR-10: a stand-in of its size and format)")
    if not os.path.isdir(os.path.join(data, "cifar-10-batches-bin")):
        rep.emit(f"  written in {write_standin(data):.1f} s")

    import shutil

    shutil.rmtree(os.path.join(data, ".neurofed_cache"), ignore_errors=True)  # the first load decodes
    first = child(LOAD, data=data)
    second = child(LOAD, data=data)
    results["load"] = {"first_s": first["seconds"], "second_s": second["seconds"], "x_train": second["x_train"],
                       "first_peak": first["peak"], "second_peak": second["peak"]}
    rep.emit(f"load: first {first['seconds']:.1f} s (decode into the uint8 cache, peak RSS "
             f"{first['peak'] / MB:.0f} MB), second {second['seconds']:.2f} s (memory map; peak RSS "
             f"{second['peak'] / MB:.0f} MB); x_train {second['x_train'][0]} {second['x_train'][1]} "
             f"({second['x_train'][2]}, {second['x_train'][3] / MB:.1f} MB)")

    rep.emit("")
    rep.emit("images held by a partition (every shard materialised once, as rounds do):")
    for clients in (10, 100):
        r = child(NEUROFED, data=data, clients=clients)
        results[f"neurofed_{clients}"] = r
        b, a = r["rss_built"], r["rss_after"]
        rep.emit(f"  neurofed, {clients:>3} clients: images {r['x_dtype']} {r['images_held'] / MB:.1f} MB held once "
                 f"(shared with the cache map: {r['shared_with_cache']}), client index arrays "
                 f"{r['index_bytes'] / MB:.2f} MB, largest transient shard {r['largest_shard'] / MB:.2f} MB; "
                 f"RSS after building the experiment {b['VmRSS'] / MB:.0f} MB, after every shard "
                 f"{a['VmRSS'] / MB:.0f} MB (+{(a['RssFile'] - b['RssFile']) / MB:.0f} MB file-backed image pages, "
                 f"+{(a['RssAnon'] - b['RssAnon']) / MB:.0f} MB anonymous), peak {r['peak'] / MB:.0f} MB")
    naive = child(NAIVE, data=data, clients=100)
    results["naive_float32_100"] = naive
    grown = (naive["rss_after"]["VmRSS"] - naive["rss_before"]["VmRSS"]) / MB
    rep.emit(f"  baseline float32 per client, 100 clients: float32 training set + one float32 shard per client "
             f"= {naive['images_held'] / MB:.1f} MB; RSS +{grown:.0f} MB for them "
             f"({naive['rss_after']['VmRSS'] / MB:.0f} MB), peak {naive['peak'] / MB:.0f} MB")
    ours = results["neurofed_100"]["images_held"]
    ratio = naive["images_held"] / ours
    whole_copy = 100 * TRAIN * PIXELS * 4
    rep.emit(f"  ratio: the baseline holds {ratio:.1f}x the image bytes neurofed holds "
             f"({naive['images_held'] / MB:.0f} vs {ours / MB:.0f} MB); a simulation in which each of the 100 "
             f"clients loads its own float32 copy of the set would hold {whole_copy / 1e9:.1f} GB "
             f"({whole_copy / ours:.0f}x)")

    rep.emit("")
    with tempfile.TemporaryDirectory() as out:
        run = child(RUN, data=data, out=os.path.join(out, "run"))
        summary = json.loads(open(os.path.join(out, "run", "summary.json")).read())
    results["run"] = {**run, "summary": {k: summary.get(k) for k in ("final_accuracy", "wall_time_s", "data_subset")}}
    rep.emit(f"short run (neurofed run, 100 clients, 1 round, 2 clients x 16 steps, cnn T=8, test subset 2,000): "
             f"rc {run['rc']}, {run['seconds']:.0f} s, peak RSS {run['peak'] / MB:.0f} MB (limit 2,000 MB)")
    ok = (run["rc"] == 0 and run["peak"] <= 2e9 and results["neurofed_10"]["images_held"] == ours
          and results["neurofed_100"]["x_dtype"] == "torch.uint8")
    results["ok"] = ok
    rep.emit(f"RESULT images held {ours / MB:.1f} MB uint8 for 10 and 100 clients; baseline {ratio:.1f}x; "
             f"run peak RSS {run['peak'] / MB:.0f} MB <= 2000 MB: {'PASS' if ok else 'FAIL'}")
    if args.save:
        rep.save("dataset_memory")
        with open(os.path.join(ROOT, "benchmarks", "results", "dataset_memory.json"), "w") as fh:
            json.dump(results, fh, indent=1)
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))