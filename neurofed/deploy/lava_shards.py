"""Lava runs over shards of the samples in parallel worker processes.

Lava's fixed_pt simulator runs each process model in its own OS process, stepped in
lock-step by a Python runtime: one network uses about one core however many it is
given. Samples are independent (each layer is reset at the start of every sample's
window, :mod:`neurofed.deploy.lava_run`), so a run splits the samples into contiguous
shards, one per worker, and each worker compiles and streams its own copy of the
network. The per-sample results are concatenated in sample order and the per-neuron
totals summed, so the result is the one-process result exactly: the raster checksums
weight (neuron, phase), never the sample's index.

Workers are forked, not spawned: Lava sets the ``fork`` start method when it is
imported, and its own process models are forked from the worker.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import time

import numpy as np

from neurofed.deploy import DeployError


def usable_cores() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def check_workers(workers, backend: str) -> int:
    """``workers`` as a count (None: the usable cores); a chip (loihi2) runs one network."""
    if workers is None:
        workers = usable_cores()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DeployError(f"--workers: got {workers!r}; expected a positive integer (default: the usable cores)")
    return 1 if backend == "loihi2" else workers


def merge(parts: list):
    """One SpikeStats from the shards' (in sample order): per-sample arrays are
    concatenated, per-layer lists of per-neuron totals are summed."""
    values = {}
    for f in dataclasses.fields(parts[0]):
        items = [getattr(p, f.name) for p in parts]
        if items[0] is None:  # a field the run does not read (e.g. no tie-break voltage)
            values[f.name] = None
        elif isinstance(items[0], list):
            values[f.name] = [np.sum(layer, axis=0) for layer in zip(*items)]
        else:
            values[f.name] = np.concatenate(items, axis=0)
    return type(parts[0])(**values)


def _worker(index: int, queue, simulate, args: tuple, kwargs: dict) -> None:
    """Run one shard; report progress ticks, then the result or the error, on ``queue``."""
    try:
        stats, timing = simulate(*args, progress=lambda k: queue.put(("tick", index, k)), **kwargs)
        queue.put(("done", index, (stats, timing, time.time())))
    except BaseException as exc:  # the parent re-raises it with the shard named
        queue.put(("error", index, f"{type(exc).__name__}: {exc}"))


def simulate_shards(net, spikes: np.ndarray, seed: int, backend: str = "fixed_pt", workers: int | None = None,
                    progress: bool = True, *, simulate, **kwargs):
    """``simulate(net, spikes, seed, backend, ...)`` (:func:`neurofed.deploy.lava_run.simulate`
    of a netx file; :func:`neurofed.deploy.lava_graph.simulate_graph` takes a model) over
    ``workers`` shards of ``spikes`` in parallel: the same (SpikeStats, timing) as one
    process, timing with ``workers`` added.

    ``compile_s`` and ``readout_s`` are the slowest worker's; ``run_s`` spans the first
    worker's first step to the last one's last, so ``samples_per_s`` is the parallel run's.
    """
    n = len(spikes)
    workers = min(check_workers(workers, backend), n)
    if workers == 1:
        stats, timing = simulate(net, spikes, seed, backend, progress=progress, **kwargs)
        return stats, {**timing, "workers": 1}
    shards = np.array_split(np.arange(n), workers)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, name=f"neurofed-lava-{i}",
                         args=(i, queue, simulate, (net, spikes[idx], seed, backend), kwargs))
             for i, idx in enumerate(shards)]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"lava {backend} x{workers}", unit="sample", dynamic_ncols=True,
                   disable=None)  # None: a terminal only
    results: dict[int, tuple] = {}
    try:
        for p in procs:
            p.start()
        while len(results) < workers:
            results.update(_collect(queue, procs, results, bar))
    finally:
        if bar is not None:
            bar.close()
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join()
    parts = [results[i] for i in range(workers)]
    stats = merge([s for s, _, _ in parts])
    end = max(e for _, _, e in parts)
    start = min(e - tm["run_s"] - tm["readout_s"] for _, tm, e in parts)
    run_s = end - start - max(tm["readout_s"] for _, tm, _ in parts)
    timing = {"compile_s": max(tm["compile_s"] for _, tm, _ in parts), "run_s": run_s,
              "readout_s": max(tm["readout_s"] for _, tm, _ in parts),
              "samples_per_s": n / run_s if run_s > 0 else None, "workers": workers}
    return stats, timing


def _collect(queue, procs, results: dict, bar) -> dict:
    """Wait for the next message from a worker; return the shard it finished, if any.
    A worker that died without a word (killed, out of memory) is an error too."""
    import queue as queues

    try:
        kind, index, payload = queue.get(timeout=1.0)
    except queues.Empty:
        dead = [i for i, p in enumerate(procs) if i not in results and p.exitcode not in (None, 0)]
        if dead:
            raise DeployError(f"Lava worker {dead[0]} exited with code {procs[dead[0]].exitcode} "
                              f"before returning its shard (out of memory? try fewer --workers)")
        return {}
    if kind == "tick":
        if bar is not None:
            bar.update(payload)
        return {}
    if kind == "error":
        raise DeployError(f"Lava worker {index} (shard {index + 1} of {len(procs)}): {payload}")
    return {index: payload}
