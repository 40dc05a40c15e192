"""Run the exported network on Lava and compare it, spike for spike, with torch.

One compile, many samples: ``netx.hdf5.Network(reset_interval=T, reset_offset=1)``
resets layer j's neurons at the step where the sample's first input reaches it,
so samples stream back to back (resetting with ``Var.set`` instead costs
0.1-1.8 s per sample). Timing, with Lava steps counted from 1 and a sample in the
window of steps kT+1 .. kT+T (phase p = step - kT - 1):

- the source sends the sample's input of torch step p at phase p;
- every Lava layer adds one step (synapse buffer), as SLAYER's ``delay_shift``
  does per block, so Lava layer j's output at phase p *is* torch block j's output
  at step p — no offsets to undo;
- layer j is reset at phase j+1 (its first input of the new sample arrives
  then), so its outputs at phases 0..j are the previous sample's tail. Torch's
  block j cannot spike before step j+1 either, so the counters skip those phases
  and count exactly what torch counts — no zero padding needed.

Both sides get the same input spikes, drawn once from the run's seed (or the
event data, binarized). Each layer's counter keeps the per-sample spike count and
a checksum of the raster; torch computes the same from its block outputs. Equal
checksums mean the same spikes at the same neurons and steps.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from neurofed.deploy import DeployError
from neurofed.deploy.export import read_net
from neurofed.deploy.lava_plan import (MESSAGE_BITS, LavaPlan, SpikeStats, layer_seeds, to_lava_layout,
                                       to_torch_order)

BACKENDS = ("fixed_pt", "loihi2")


CONV_MODEL_ENV = "NEUROFED_LAVA_CONV"  # "stock": Lava's own Conv model (read here, so shard workers see it too)


def conv_model() -> str:
    """The process model fixed_pt runs Lava's ``Conv`` with: ``im2col``
    (:mod:`neurofed.deploy.lava_procs.fast_conv`, the default) or Lava's ``stock`` one."""
    import os

    value = os.environ.get(CONV_MODEL_ENV, "im2col")
    if value not in ("im2col", "stock"):
        raise DeployError(f"{CONV_MODEL_ENV}: got {value!r}; allowed: im2col (default), stock")
    return value


def run_config(backend: str):
    """Lava run configuration for ``backend``; a clear error when it cannot run here."""
    if backend not in BACKENDS:
        raise DeployError(f"--backend: got {backend!r}; allowed: {', '.join(BACKENDS)}")
    from neurofed.compat import lava

    configs = lava("lava.magma.core.run_configs")
    if backend == "fixed_pt":
        from neurofed.deploy.lava_procs.fast_conv import exception_map

        return configs.Loihi2SimCfg(select_tag="fixed_pt", exception_proc_model_map=exception_map(conv_model()))
    if not lava("lava.utils.loihi").is_installed():
        raise DeployError("--backend loihi2 needs Intel's lava-loihi extension (module lava.utils.loihi2_profiler "
                          "is not importable here; it is distributed to INRC members, not on PyPI); "
                          "use --backend fixed_pt for the bit-accurate CPU simulator")
    return configs.Loihi2HwCfg()


def _connect(src, dst, backend: str, to_chip: bool) -> None:
    """Connect a port; on Loihi 2 the host's Python processes reach the chip's
    neurons through spike adapters (lava-loihi's embedded_io)."""
    if backend != "loihi2":
        src.connect(dst)
        return
    from neurofed.compat import lava

    spike_io = lava("lava.proc.embedded_io.spike")
    adapter = (spike_io.PyToNxAdapter if to_chip else spike_io.NxToPyAdapter)(shape=src.shape)
    src.connect(adapter.inp)
    adapter.out.connect(dst)


def simulate(net_path: str | Path, spikes: np.ndarray, seed: int, backend: str = "fixed_pt",
             progress=True, chunk: int = 10, plan: LavaPlan | None = None) -> tuple[SpikeStats, dict]:
    """Stream ``spikes`` (N, C, H, W, T) through the netx network in one compiled run
    (``progress``: a bar, or a callable given the samples done after each chunk).

    ``plan`` (lags, graded input, voltage readout; :mod:`neurofed.deploy.lava_plan`) is the one
    recorded in the file at export unless given. Returns Lava's spike statistics and timings:
    ``compile_s`` (compile and start of the process models), ``run_s`` (all samples),
    ``readout_s`` (reading the counters back), ``samples_per_s`` (run only).
    """
    from neurofed.compat import netx

    run_cfg = run_config(backend)
    t = spikes.shape[-1]
    if plan is None:
        meta = read_net(net_path)
        recorded = meta.get("lava_plan") or {"lags": [0] * sum(k != "flatten" for k, _ in meta["net_layers"][1:])}
        plan = LavaPlan.from_meta(t, recorded)
    plan.check_backend(backend)
    graded = {} if plan.input_bits is None else {"input_message_bits": MESSAGE_BITS}
    net = netx().hdf5.Network(net_config=str(net_path), reset_interval=plan.window, reset_offset=1, **graded)
    try:
        return _stream(net, spikes, seed, backend, run_cfg, progress, chunk, plan)
    finally:
        net.net_config.f.close()  # netx keeps the HDF5 file open; the network is built, let it go


def _stream(net, spikes, seed, backend, run_cfg, progress, chunk, plan):
    from neurofed.compat import lava
    from neurofed.deploy.lava_procs.readout import VoltageReader
    from neurofed.deploy.lava_procs.streaming import SpikeCounter, SpikeSource

    RunSteps = lava("lava.magma.core.run_conditions").RunSteps
    n, t, w = spikes.shape[0], spikes.shape[-1], plan.window
    layers = list(net.layers)
    if plan.lags[-1] == 0 and t <= len(layers):
        raise DeployError(f"data.timesteps is {t}, but the output of a {len(layers)}-layer network "
                          f"cannot spike before step {len(layers)}; use more time steps")
    with tempfile.TemporaryDirectory(prefix="neurofed-lava-") as tmp:
        data_path = Path(tmp) / "input.npy"
        np.save(data_path, to_lava_layout(spikes, tuple(net.inp.shape)))
        source = SpikeSource(path=data_path, shape=tuple(net.inp.shape), window=w, samples=n, steps=t)
        _connect(source.s_out, net.inp, backend, to_chip=True)
        counters = []
        for j, (layer, s) in enumerate(zip(layers, layer_seeds(seed, len(layers)))):
            skip, stop = plan.counted(j)
            counter = SpikeCounter(shape=tuple(layer.out.shape), window=w, skip=skip, stop=stop, samples=n, seed=s,
                                   per_neuron=j == len(layers) - 1 and not plan.voltage)
            _connect(layer.out, counter.s_in, backend, to_chip=False)
            counters.append(counter)
        reader = None
        if plan.voltage or plan.tie_voltage:  # a Python process reading the neurons' Var: the simulator's (docs/deployment.md)
            reader = VoltageReader(shape=tuple(layers[-1].neuron.v.shape), window=w, phase=plan.read_phase, samples=n)
            reader.ref.connect_var(layers[-1].neuron.v)

        bar, tick = None, progress if callable(progress) else None
        try:
            t0 = time.perf_counter()
            net.create_runtime(run_cfg=run_cfg)  # compile, then start the process models
            t1 = time.perf_counter()
            if progress is True:
                from tqdm.auto import tqdm

                bar = tqdm(total=n, desc=f"lava {backend}", unit="sample",
                           dynamic_ncols=True, disable=None)  # None: a terminal only
                tick = bar.update
            done = 0
            while done < n:
                step = min(chunk, n - done)
                net.run(condition=RunSteps(num_steps=step * w), run_cfg=run_cfg)
                done += step
                if tick is not None:
                    tick(step)
            t2 = time.perf_counter()
            stats = [np.asarray(c.stats.get()).reshape(n, -1) for c in counters]
            totals = [to_torch_order(np.asarray(c.totals.get()).reshape(c.totals.shape)) for c in counters]
            voltage = np.asarray(reader.values.get()).reshape(n, -1) if reader is not None else None
            output = voltage if plan.voltage else stats[-1][:, 2:]
            t3 = time.perf_counter()
        finally:
            if bar is not None:
                bar.close()
            net.stop()
    result = SpikeStats(np.stack([s[:, 0] for s in stats], 1).round().astype(np.int64),
                        np.stack([s[:, 1] for s in stats], 1).round().astype(np.int64),
                        output.round().astype(np.int64), [t.round().astype(np.int64) for t in totals],
                        voltage if plan.tie_voltage else None)
    timing = {"compile_s": t1 - t0, "run_s": t2 - t1, "readout_s": t3 - t2,
              "samples_per_s": n / (t2 - t1) if t2 > t1 else None}
    return result, timing
