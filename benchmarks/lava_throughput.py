"""Lava throughput: one compiled network streaming samples vs one compile per sample.

The digits CNN of ``examples/digits_fedavg.yaml`` (1x8x8 input, conv 16, pool,
conv 32, dense 64, dense 10; T = its data.timesteps, 32; weights from a trained run with ``--run``,
otherwise the seeded initial weights) is exported to netx and run in Lava's
fixed_pt CPU simulator on rate-coded digits test images:

* streaming (neurofed): ``netx.hdf5.Network(reset_interval=T, reset_offset=1)``,
  compiled once, samples back to back (:func:`neurofed.deploy.lava_run.simulate`);
* baseline: a fresh network compiled and started for every sample (the same
  function called with one sample at a time), on the last few of those samples;
* workers (``--workers 1,2``): the streamed samples over that many parallel Lava
  processes, one shard each (:mod:`neurofed.deploy.lava_shards`): run-only samples/s and
  its ratio to one worker, the spikes checked equal to the one-process run.

Both give the same spikes (checked per sample). Throughput counts compile, run
and read-back time, since the baseline pays the compile per sample.

    python benchmarks/lava_throughput.py                 # prints, ends with a RESULT line
    python benchmarks/lava_throughput.py --save          # also writes benchmarks/results/lava_throughput.txt
    python benchmarks/lava_throughput.py --run RUN_DIR --workers 1,2 --baseline-samples 0
    python benchmarks/lava_throughput.py --preset examples/papers/fedsnn_cifar10_iid.yaml --set model.readout=spikes \
        --samples 4 --baseline-samples 0 --workers 1,2   # a paper's network, seeded weights, its stand-in's images
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from common import Report, machine_header, with_one_line_errors  # noqa: E402


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (Lava's, the workers') so far."""
    import resource

    return sum(u.ru_utime + u.ru_stime for u in map(resource.getrusage, (resource.RUSAGE_SELF,
                                                                         resource.RUSAGE_CHILDREN)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", help="a finished digits run directory (trained weights); default: initial weights")
    ap.add_argument("--preset", help="a preset's network instead (seeded initial weights, its data's stand-in)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="an override of --preset")
    ap.add_argument("--samples", type=int, default=50, help="samples streamed through one compile (default 50)")
    ap.add_argument("--baseline-samples", type=int, default=4, help="samples with one compile each (default 4)")
    ap.add_argument("--workers", default="", help="comma-separated worker counts to time, e.g. 1,2 (default: none)")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/lava_throughput[_PRESET][_workers].txt")
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    from neurofed.config import load_config
    from neurofed.data import load_dataset
    from neurofed.deploy.export import export_model, load_global_model
    from neurofed.deploy.lava_run import input_spikes, simulate
    from neurofed.deploy.lava_shards import simulate_shards, usable_cores
    from neurofed.seeds import seed_for
    from neurofed.models import build_model

    report = Report()
    say = report.emit
    say(machine_header("lava_throughput"))
    say(f"# command: python benchmarks/lava_throughput.py {' '.join(argv or sys.argv[1:])}".rstrip())
    if args.run:
        model, cfg, ds, rnd = load_global_model(args.run)
        weights = f"trained run {args.run} (round {rnd})"
    else:
        if args.preset:
            from neurofed.data.standins import standin_name

            name = load_config(args.preset, ["data.root=/nonexistent"])["data"]["name"]
            cfg = load_config(args.preset, [f"data.name={standin_name(name)}", *args.set])
        else:
            cfg = load_config(ROOT / "examples" / "digits_fedavg.yaml")
        ds = load_dataset(cfg["data"], cfg["seed"])
        torch.manual_seed(seed_for(cfg["seed"], "init"))
        model = build_model(cfg["model"], ds.input_shape, ds.num_classes, cfg["federation"]["logit_scale"]).eval()
        weights = "initial weights (seeded)"
        if cfg["model"]["init"] == "firing":  # the preset's own start: every layer firing in init_rates
            from neurofed.data.encoding import as_tensor
            from neurofed.models.init import initialize

            initialize(model, cfg, as_tensor(ds.x_train))
            weights += ", model.init: firing"
    n = args.samples + args.baseline_samples
    spikes, _ = input_spikes(ds.x_test[:n], cfg["data"], seed_for(cfg["seed"], "lava"))
    t = spikes.shape[-1]
    say(f"model: {cfg['data']['name']} {cfg['model']['name']}, {sum(model.neurons_per_layer):,} neurons in "
        f"{len(model.neurons_per_layer)} layers, T={t}, {weights}")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.net"
        with redirect_stdout(io.StringIO()):  # the simulator runs what a chip might not hold: say so, go on
            hw = export_model(model, path, check=not args.preset)
        say(f"hardware check (loihi2): {hw.cores} cores" + "".join(f"; refused on a chip: {v}" for v in hw.violations))
        stream, timing = simulate(path, spikes, 0, progress=False)
        total = timing["compile_s"] + timing["run_s"] + timing["readout_s"]
        stream_rate = n / total
        say(f"streaming: compile {timing['compile_s']:.2f} s once, {n} samples run in "
            f"{timing['run_s']:.2f} s ({1000 * timing['run_s'] / n:.0f} ms/sample, "
            f"{timing['samples_per_s']:.2f} samples/s), read-back {timing['readout_s']:.2f} s; "
            f"with compile {stream_rate:.2f} samples/s")

        compiles, per_sample, same = [], [], True
        for i in range(args.samples, n):  # the last samples again, one compile each
            t0 = time.perf_counter()
            one, tm = simulate(path, spikes[i:i + 1], 0, progress=False)
            per_sample.append(time.perf_counter() - t0)
            compiles.append(tm["compile_s"])
            same &= bool(np.array_equal(one.checksums[0], stream.checksums[i]))
        base_rate = len(per_sample) / sum(per_sample) if per_sample else float("nan")
        if per_sample:
            say(f"baseline (compile per sample): {len(per_sample)} samples in {sum(per_sample):.2f} s "
                f"({base_rate:.2f} samples/s; compile {np.mean(compiles):.2f} s/sample)")
            say(f"streamed and single-sample runs give identical spikes: {same}")
        rates = {}
        for w in [int(x) for x in args.workers.split(",") if x]:
            cpu0, t0 = _cpu_s(), time.perf_counter()
            sharded, tm = simulate_shards(path, spikes[:args.samples], 0, workers=w, progress=False, simulate=simulate)
            busy = (_cpu_s() - cpu0) / (time.perf_counter() - t0)  # < w: the workers waited for a core
            rates[w] = tm["samples_per_s"]
            same = np.array_equal(sharded.checksums, stream.checksums[:args.samples])
            say(f"workers={w}: {args.samples} samples, run {tm['run_s']:.2f} s, {rates[w]:.2f} samples/s, "
                f"compile {tm['compile_s']:.2f} s (slowest worker), {busy:.2f} cores busy, spikes identical to "
                f"one process: {same}" + (f", {rates[w] / rates[1]:.2f}x one worker" if 1 in rates else ""))
        say(f"# load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if rates:
            say(f"# {usable_cores()} usable core(s); the CPU may be shared with other jobs: check the load")

    ratio = stream_rate / base_rate
    say(f"RESULT name=lava_throughput samples_per_s={stream_rate:.3f} run_samples_per_s={timing['samples_per_s']:.3f} "
        f"compile_s={timing['compile_s']:.3f} baseline_samples_per_s={base_rate:.3f} ratio={ratio:.2f}"
        + "".join(f" workers{w}_samples_per_s={r:.3f}" for w, r in rates.items())
        + (f" workers_ratio={rates[max(rates)] / rates[1]:.2f}" if 1 in rates and len(rates) > 1 else ""))
    if args.save:  # the worker and preset runs beside the streaming-vs-compile record, not over it
        report.save("lava_throughput" + (f"_{Path(args.preset).stem}" if args.preset else "")
                    + ("_workers" if args.workers else ""))
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))