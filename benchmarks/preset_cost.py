"""What a paper preset costs on this machine: seconds per local training step and per test
sample, with the preset's own model, width, T, batch, optimizer and algorithm, on stand-in
files written in the dataset's published format (tests/dataset_files.py: random pixels, so
no accuracy figure comes out of it), then the extrapolation to one round and the whole run.

    python benchmarks/preset_cost.py examples/papers/fedsnn_cifar10_noniid.yaml [--steps 3]

One round trains ``clients_per_round`` clients (SFedCA: its ``candidates``) for
``local_epochs`` epochs over their share of the training set (the published train size /
``num_clients``) in batches of ``batch_size``, then evaluates the global model(s) on the
published test set (SFedHIFI: one global model per width). Measured: ``--steps`` steps of
one client per width after one warm-up round, and the evaluation of ``batch_size`` test samples.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # tests/dataset_files.py: the published-format writers

import dataset_files  # noqa: E402
import torch  # noqa: E402

from neurofed.config import load_config  # noqa: E402
from neurofed.fl.experiment import Experiment  # noqa: E402

# Published train / test sizes (the datasets' own documentation).
SIZES = {"mnist": (60_000, 10_000), "fashion_mnist": (60_000, 10_000), "cifar10": (50_000, 10_000),
         "cifar100": (50_000, 10_000), "svhn": (73_257, 26_032)}
WRITERS = {"mnist": dataset_files.write_mnist, "fashion_mnist": dataset_files.write_fashion_mnist,
           "cifar10": dataset_files.write_cifar10, "cifar100": dataset_files.write_cifar100,
           "svhn": dataset_files.write_svhn}


def measure(preset: Path, steps: int) -> dict:
    probe = load_config(preset, overrides=["data.root=/nonexistent"])
    name, fed, algo = probe["data"]["name"], probe["federation"], probe["algorithm"]
    batch = fed["batch_size"]
    widths = algo.get("widths") or [probe["model"]["width"]]
    clients = len(widths)
    holders = 3 if algo["name"] == "sfedca" else clients  # SFedCA: 2 candidates train, 1 is aggregated
    train_n = steps * batch * holders
    with tempfile.TemporaryDirectory() as tmp:
        WRITERS[name](tmp, n=max(train_n, 200 if name == "cifar100" else 20), n_test=batch)
        over = [f"data.root={tmp}", "federation.rounds=2", "federation.local_epochs=1", "partition.scheme=iid",
                f"partition.num_clients={holders}", f"federation.clients_per_round={clients}",
                "partition.min_size=1", f"data.train_subset={train_n}", "energy.enabled=false"]
        if algo["name"] == "sfedca":
            over += ["federation.clients_per_round=1", "algorithm.candidates=2"]
            clients = 2
        if algo["name"] == "sfedhifi":
            over += ["algorithm.assign=fixed", f"algorithm.client_widths={json.dumps(widths)}",
                     "algorithm.rate_samples=" + str(batch)]
        cfg = load_config(preset, overrides=over)
        exp = Experiment(cfg)
        exp.train_round(1)  # warm-up: kernel builds, allocator
        t0, c0 = time.perf_counter(), time.process_time()
        exp.train_round(2)
        train_s, train_cpu = time.perf_counter() - t0, time.process_time() - c0
        t0, c0 = time.perf_counter(), time.process_time()
        exp.evaluate_global()
        eval_s, eval_cpu = time.perf_counter() - t0, time.process_time() - c0
    step_s = train_s / (steps * clients)  # mean over the widths (one client each)
    # CPU seconds (all threads): on a shared machine wall time counts the other jobs too;
    # CPU time / threads is what an idle machine's wall clock would show.
    threads = torch.get_num_threads()
    idle_step = train_cpu / (steps * clients) / threads
    n_train, n_test = SIZES[name]
    per_client = n_train / probe["partition"]["num_clients"]
    trained = algo.get("candidates", 10) if algo["name"] == "sfedca" else fed["clients_per_round"]
    round_steps = trained * fed["local_epochs"] * math.ceil(per_client / batch)
    eval_round = eval_s / batch * n_test
    round_s = round_steps * step_s + eval_round
    idle_round = round_steps * idle_step + eval_cpu / threads / batch * n_test
    return {
        "preset": str(preset.relative_to(ROOT)) if preset.is_absolute() else str(preset),
        "model": probe["model"]["name"], "width": widths, "timesteps": probe["data"]["timesteps"],
        "batch_size": batch, "algorithm": algo["name"],
        "seconds_per_step": round(step_s, 3), "eval_seconds_per_sample": round(eval_s / batch, 4),
        "cpu_seconds_per_step": round(train_cpu / (steps * clients), 3), "threads": threads,
        "steps_per_round": round_steps, "round_hours": round(round_s / 3600, 2),
        "rounds": fed["rounds"], "run_days": round(round_s * fed["rounds"] / 86400, 1),
        "idle_round_hours": round(idle_round / 3600, 2), "idle_run_days": round(idle_round * fed["rounds"] / 86400, 1),
        "cpu": platform.processor() or platform.machine(), "load_average": os.getloadavg()[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="+", type=Path)
    ap.add_argument("--steps", type=int, default=3, help="measured steps per client (after a warm-up round)")
    args = ap.parse_args()
    for p in args.presets:
        print(json.dumps(measure(p, args.steps)), flush=True)


if __name__ == "__main__":
    main()
