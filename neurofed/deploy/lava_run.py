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

import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from neurofed.deploy import DeployError
from neurofed.deploy.deployable import deployable_copy, has_residual_joins
from neurofed.deploy.export import (NET_FILE, check_net_digest, digest_file, export_run,
                                   load_global_model, read_net)
from neurofed.deploy.lava_plan import (MESSAGE_BITS, LavaPlan, SpikeStats, check_encoding, input_spikes, layer_seeds,  # noqa: F401
                                       plan_for, predict, to_lava_layout, to_torch_order, torch_reference, unlagged_plan)
from neurofed.deploy.lava_shards import check_workers, simulate_shards, usable_cores
from neurofed.seeds import describe_measured, measured_on, seed_for

BACKENDS = ("fixed_pt", "loihi2")
RESULT_FILE = "lava.json"
SPIKES_FILE = "lava_layer_spikes.npy"  # (samples, layers) spike counts
NEURON_SPIKES_FILE = "lava_neuron_spikes.npz"  # layer<j>: each neuron's spikes over all samples, (C, H, W)


# ----------------------------------------------------------------------------- Lava


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
        plan = LavaPlan(t, tuple(recorded["lags"]), recorded.get("input_bits"), bool(recorded.get("voltage")))
    if plan.voltage and backend == "loihi2":
        raise DeployError("model.readout voltage: the voltage is read by a host process's RefPort, which reaches "
                          "the simulator's neurons but not a chip's (that needs lava-loihi's probes); use --backend "
                          "fixed_pt")
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
        if plan.voltage:  # a Python process reading the neurons' Var: the simulator's (see docs/deployment.md)
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
            output = np.asarray(reader.values.get()).reshape(n, -1) if reader is not None else stats[-1][:, 2:]
            t3 = time.perf_counter()
        finally:
            if bar is not None:
                bar.close()
            net.stop()
    result = SpikeStats(np.stack([s[:, 0] for s in stats], 1).round().astype(np.int64),
                        np.stack([s[:, 1] for s in stats], 1).round().astype(np.int64),
                        output.round().astype(np.int64), [t.round().astype(np.int64) for t in totals])
    timing = {"compile_s": t1 - t0, "run_s": t2 - t1, "readout_s": t3 - t2,
              "samples_per_s": n / (t2 - t1) if t2 > t1 else None}
    return result, timing


# ----------------------------------------------------------------------------- a run


def compare(lava_stats: SpikeStats, torch_stats: SpikeStats, labels: np.ndarray) -> dict:
    """Prediction and per-layer agreement of Lava with torch, and both accuracies."""
    pl, pt = lava_stats.predictions, torch_stats.predictions
    return {
        "accuracy": float(np.mean(pl == labels)),
        "torch_accuracy": float(np.mean(pt == labels)),
        "agreement": float(np.mean(pl == pt)),
        "layer_count_agreement": np.mean(lava_stats.counts == torch_stats.counts, 0).round(6).tolist(),
        "layer_raster_agreement": np.mean(lava_stats.checksums == torch_stats.checksums, 0).round(6).tolist(),
        "spike_for_spike": bool(np.array_equal(lava_stats.checksums, torch_stats.checksums)
                                and np.array_equal(lava_stats.output, torch_stats.output)
                                and all(np.array_equal(a, b) for a, b in
                                        zip(lava_stats.neuron_totals, torch_stats.neuron_totals))),
    }


def run_lava(run_dir: str | Path, samples: int = 200, backend: str = "fixed_pt", progress: bool = True,
             quiet: bool = False, model_round: str | int = "last", workers: int | None = None) -> dict:
    """Run ``samples`` test samples of ``run_dir``'s global model of ``model_round`` (best,
    last or a kept round's number) on Lava, in ``workers`` processes (default: the usable
    cores; :mod:`neurofed.deploy.lava_shards`); write ``lava.json``.

    Exports ``model.net`` first when the run has none, or one of another round.
    Returns the result dict.
    """
    run_dir = Path(run_dir)
    if not isinstance(samples, int) or samples < 1:
        raise DeployError(f"--samples: got {samples!r}; expected a positive integer")
    run_config(backend)  # fail before any work when the backend or the worker count is unusable
    workers = check_workers(workers, backend)
    model, cfg, ds, rnd = load_global_model(run_dir, model_round=model_round)
    check_encoding(cfg["data"])
    deployable = deployable_copy(model)  # what the chip runs: norms and an analog pool folded, 8-bit weights
    plan = plan_for(deployable, cfg["data"]["timesteps"], cfg["data"]["encoding"])
    if has_residual_joins(deployable):  # no netx file: the process graph is wired from the model
        from neurofed.deploy.lava_graph import simulate_graph

        net, simulate_fn = deployable, simulate_graph
    else:
        net_path = run_dir / NET_FILE
        if (not net_path.exists() or not digest_file(net_path).exists() or read_net(net_path).get("round") != rnd
                or read_net(net_path).get("lava_plan") != plan.to_meta()):
            export_run(run_dir, quiet=quiet, model_round=rnd)
        check_net_digest(net_path)
        read_net(net_path, deployable)
        net, simulate_fn = net_path, simulate

    n = min(samples, len(ds.y_test))
    seed = seed_for(cfg["seed"], "lava")
    spikes, notes = input_spikes(ds.x_test[:n], cfg["data"], seed)
    labels = np.asarray(ds.y_test[:n])
    t0 = time.perf_counter()
    torch_stats = torch_reference(deployable, spikes, seed, plan)  # the exported network: 8-bit weights
    torch_s = time.perf_counter() - t0
    # the model as trained (float weights unless model.quantize; direct input: the unquantized image)
    trained = trained_predictions(model, ds.x_test[:n] if plan.input_bits is not None else spikes, cfg["data"])
    notes.update(trained_accuracy=float(np.mean(trained == labels)),
                 trained_agreement=float(np.mean(trained == torch_stats.predictions)))
    lava_stats, timing = simulate_shards(net, spikes, seed, backend, workers, progress=progress and not quiet,
                                         simulate=simulate_fn, plan=plan)

    neurons = np.array(deployable.neurons_per_layer, dtype=np.float64)
    t = spikes.shape[-1]
    result = {
        "samples": n,
        # accuracy and torch_accuracy: these samples, the same input spikes on both sides;
        # not summary.json's (all test samples, draw 'eval')
        "accuracy_measured_on": measured_on(cfg["data"], n, len(ds.y_test), "lava"),
        "backend": backend,
        "conv_model": conv_model() if backend == "fixed_pt" else None,
        "round": rnd,
        **compare(lava_stats, torch_stats, labels),
        "timesteps": t,
        "lava_window": plan.window,  # T + the last layer's lag (lava_plan)
        "readout": "voltage" if plan.voltage else "spikes",
        "layer_kinds": [l.kind for l in deployable.layers if l.has_neurons],
        "neurons_per_layer": neurons.astype(int).tolist(),
        "layer_spikes_mean": lava_stats.counts.mean(0).round(4).tolist(),
        "torch_layer_spikes_mean": torch_stats.counts.mean(0).round(4).tolist(),
        "layer_firing_rates": (lava_stats.counts.mean(0) / (neurons * t)).round(6).tolist(),
        "layer_spikes": lava_stats.counts.tolist(),  # (samples, layers): what the energy module reads
        "layer_spikes_file": SPIKES_FILE,
        "neuron_spikes_file": NEURON_SPIKES_FILE,
        "predictions": lava_stats.predictions.tolist(),
        **{k: (round(v, 4) if isinstance(v, float) else v) for k, v in timing.items()},
        "torch_s": round(torch_s, 4),
        **notes,
        "machine": f"{platform.machine()}, {usable_cores()} CPU(s), Python {platform.python_version()}",
    }
    if samples > n:
        result["note"] = f"asked for {samples} samples; the test set has {n}"
    np.save(run_dir / SPIKES_FILE, lava_stats.counts)
    np.savez(run_dir / NEURON_SPIKES_FILE, **{f"layer{j}": tot for j, tot in enumerate(lava_stats.neuron_totals)})
    # one key per line; long lists (per-sample counts) stay on theirs
    (run_dir / RESULT_FILE).write_text("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}"
                                                          for k, v in result.items()) + "\n}\n")
    plot_lava(result, run_dir / "plots" / "lava_spikes.png")
    if not quiet:
        print(summary_line(result) + f" -> {run_dir / RESULT_FILE}")
    return result


@torch.no_grad()
def trained_predictions(model, x: np.ndarray, data_cfg: dict) -> np.ndarray:
    """The run's model as trained on ``x``: images for direct input (encoded as in training,
    unquantized), else the input spikes."""
    from neurofed.data.encoding import as_tensor, encode

    s = torch.from_numpy(x).float() if data_cfg["encoding"] != "direct" else encode(
        as_tensor(np.asarray(x)), "direct", data_cfg["timesteps"], mean=data_cfg.get("mean"), std=data_cfg.get("std"))
    return np.concatenate([model.readout(model(s[i:i + 256])).argmax(1).numpy() for i in range(0, len(s), 256)])


def agreement_head(r: dict) -> str:
    """What a Lava and a NIR run's line say first: the samples, the accuracy beside
    torch's on the same input spikes, and the prediction agreement."""
    on = describe_measured(r["accuracy_measured_on"]) if "accuracy_measured_on" in r else f"{r['samples']} samples"
    return (f"{on}: accuracy {r['accuracy']:.4f} (torch on the same input spikes {r['torch_accuracy']:.4f}), "
            f"prediction agreement {r['agreement']:.4f}")


def raster_shares(r: dict) -> str:
    """Per layer, the share of samples whose whole raster equals torch's."""
    return "samples with the layer's raster identical to torch's " + ", ".join(
        f"{100 * a:.0f}%" for a in r["layer_raster_agreement"])


def summary_line(r: dict) -> str:
    return (f"lava {r['backend']}: {agreement_head(r)}, spike-for-spike {'yes' if r['spike_for_spike'] else 'NO'} "
            f"({raster_shares(r)}); compile {r['compile_s']:.2f} s, {r['samples_per_s']:.3g} samples/s"
            + (f"; the model as trained (before 8-bit export{', on the unrounded image' if r.get('input_bits') else ''}): "
               f"accuracy {r['trained_accuracy']:.4f}, agreement with the exported {r['trained_agreement']:.4f}"
               if "trained_accuracy" in r else ""))


def plot_lava(result: dict, path: Path) -> Path:
    """Mean spikes per sample per layer, torch vs Lava."""
    import neurofed.plots  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    kinds = result["layer_kinds"]
    x = np.arange(len(kinds))
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.bar(x - 0.2, result["torch_layer_spikes_mean"], 0.4, label="torch (SLAYER)")
    ax.bar(x + 0.2, result["layer_spikes_mean"], 0.4, label=f"Lava {result['backend']}")
    ax.set_xticks(x, [f"{j}:{k}" for j, k in enumerate(kinds)])
    ax.set_ylabel("spikes per sample")
    ax.set_title(f"{result['samples']} samples: accuracy {100 * result['accuracy']:.1f}% "
                 f"(torch {100 * result['torch_accuracy']:.1f}%), agreement {100 * result['agreement']:.1f}%",
                 fontsize=9)
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
