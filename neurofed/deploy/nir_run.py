"""Run the exported NIR graph in other simulators and compare it with torch.

``neurofed nir RUN_DIR --sim snntorch|norse``: the simulator's own NIR importer
loads ``RUN_DIR/model.nir`` (snnTorch's ``import_from_nir``, Norse's ``from_nir``
at the graph's ``dt``), and the test samples run through it one step at a time
on the input spikes ``neurofed lava`` uses (same seed, :func:`lava_run.input_spikes`),
against the same torch reference (:func:`lava_run.torch_reference`).

Direct input (``data.encoding: direct``): both sides get the normalized image each step,
the analog values torch's model sees (:func:`model_input`); the first layer's current is
then off SLAYER's fixed-point grid, so a few spikes may move by float rounding.

Voltage readout: the output node's voltage at the last step (of the aligned window) is
the prediction, compared with SLAYER's readout voltage, both in units of 1/64.

NIR types carry no batch dimension, and both importers map the graph's Flatten
(``start_dim=0``) to ``torch.nn.Flatten(0, -1)``, so samples run one at a time,
unbatched, each from a fresh state.

Time alignment: SLAYER delays every block's output by one step; the NIR graph does
not (see :mod:`nir_export`). A neuron layer whose SLAYER output lags by k steps
(``latency_steps`` in the graph's metadata) is counted over the graph's steps
0 .. T-1-k, which hold exactly the spikes torch counts over its T steps, and its
raster checksum weighs graph step t as torch step t+k. ``agreement`` is then the
fair comparison; ``agreement_full_window`` counts the output over all T steps, as a
user who runs the graph for T steps and reads every spike would.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from neurofed.deploy import DeployError
from neurofed.deploy.lava_plan import LavaPlan
from neurofed.deploy.lava_run import (SpikeStats, agreement_head, input_spikes, layer_seeds, predict, raster_shares,
                                      torch_reference)
from neurofed.deploy.lava_shards import usable_cores
from neurofed.deploy.nir_energy import energy_rows
from neurofed.deploy.nir_export import NIR_FILE, export_nir_run, graph_meta, nir_model, node_names, read_nir
from neurofed.deploy.nir_simulators import Simulator, _version, get_simulator
from neurofed.rundir import append_check
from neurofed.seeds import measured_on, seed_for

RESULT_FILE = "nir.json"  # {simulator: its latest check}
HISTORY_FILE = "nir_checks.jsonl"  # every check's figures, one line each, beside the result file
PER_SAMPLE_KEYS = ("layer_spikes", "torch_layer_spikes", "predictions", "torch_predictions")
ENCODINGS = ("rate", "events", "direct")


def model_input(x: np.ndarray, data_cfg: dict, seed: int) -> tuple[np.ndarray, dict]:
    """What the simulator and torch receive, (N, C, H, W, T): the input spikes `neurofed lava`
    uses (rate, events), or for direct input the normalized image at every step (float32)."""
    if data_cfg["encoding"] != "direct":
        return input_spikes(x, data_cfg, seed)
    from neurofed.data.encoding import as_tensor, encode

    s = encode(as_tensor(np.asarray(x)), "direct", data_cfg["timesteps"], mean=data_cfg.get("mean"),
               std=data_cfg.get("std"))
    return s.float().numpy(), {"encoding": "direct"}


class NirPlan(LavaPlan):
    def counted(self, j: int) -> tuple[int, int]:
        return 0, self.timesteps  # no Lava reset to skip (before step j + 1 a delay_shift block is silent)


def nir_plan(model, timesteps: int) -> LavaPlan:
    """How torch_reference counts for a NIR run: every layer over torch's own T steps, analog
    input unscaled, the voltage readout read at the last step."""
    voltage = model.is_voltage_layer(len(model.layers) - 1)
    return NirPlan(int(timesteps), (0,) * len(model.neurons_per_layer), None, voltage)


@dataclass
class NirStats(SpikeStats):
    output_full: np.ndarray  # (N, K) output spikes over all T graph steps (no alignment)
    mismatch: np.ndarray  # (N, L) (neuron, step) entries where the graph's raster differs from torch's


@torch.no_grad()
def _torch_rasters(model, x: torch.Tensor) -> list[torch.Tensor]:
    """Per spiking layer, SLAYER's output spikes (n, neurons, T) for the input ``x``."""
    out = []
    for i, (layer, block) in enumerate(zip(model.layers, model.blocks)):
        x = block(x)
        if layer.has_neurons:  # the voltage readout never fires
            out.append((x.reshape(len(x), -1, x.shape[-1]) != 0).double() * (not model.is_voltage_layer(i)))
    return out


@torch.no_grad()
def simulate(graph, sim: Simulator, spikes: np.ndarray, seed: int, lif_names: list[str], model,
             progress: bool = False, chunk: int = 32) -> tuple[NirStats, float]:
    """Run ``spikes`` (N, C, H, W, T) through ``graph`` in ``sim``, one unbatched sample
    at a time; per neuron layer (``lif_names``): counts, raster checksums, per-neuron
    totals over the aligned window (module docstring), and the raster entries that
    differ from ``model``'s (torch) spikes. Returns the statistics and the load time."""
    from neurofed.deploy.lava_procs.streaming import raster_weights

    model = nir_model(model)  # the torch side of the comparison: what the graph holds
    meta = graph_meta(graph)
    dt = float(meta.get("dt", 1e-4))
    lag = [int(k) for k in meta.get("latency_steps", [0] * len(lif_names))]
    voltage = meta.get("readout") == "voltage"
    v_scale = float(model.blocks[-1].neuron.s_scale) if voltage else 1.0
    t0 = time.perf_counter()
    net = sim.load(graph, dt)
    load_s = time.perf_counter() - t0
    net.eval()
    model.eval()
    n, t = spikes.shape[0], spikes.shape[-1]
    shapes = [tuple(int(x) for x in graph.nodes[name].output_type["output"]) for name in lif_names]
    weights = [torch.from_numpy(raster_weights(s, shape, t)).double().reshape(-1, t)
               for s, shape in zip(layer_seeds(seed, len(lif_names)), shapes)]
    modules = dict(net.named_modules())
    missing = [name for name in lif_names if name not in modules]
    if missing:
        raise DeployError(f"--sim {sim.name}: the imported network has no module for node(s) {', '.join(missing)}")
    step_spikes: list = [None] * len(lif_names)
    step_voltage: list = [None]

    def hook(j):
        def record(module, inputs, output):
            z = output[0] if isinstance(output, tuple) else output
            step_spikes[j] = (z.detach() != 0).double().reshape(-1)
            if voltage and j == len(lif_names) - 1:
                step_voltage[0] = sim.voltage(module, output).detach().double().reshape(-1)
        return record

    handles = [modules[name].register_forward_hook(hook(j)) for j, name in enumerate(lif_names)]
    counts = np.zeros((n, len(lif_names)), dtype=np.int64)
    sums = np.zeros_like(counts)
    mismatch = np.zeros_like(counts)
    totals = [torch.zeros(int(np.prod(s)), dtype=torch.float64) for s in shapes]
    out_aligned = np.zeros((n, int(np.prod(shapes[-1]))), dtype=np.int64)
    out_full = np.zeros_like(out_aligned)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, desc=f"nir {sim.name}", unit="sample",
                   dynamic_ncols=True, disable=None)  # None: a terminal only
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one sample's tensors are tiny: threads only add synchronisation
    try:
        x_all = torch.from_numpy(spikes).float()
        for start in range(0, n, chunk):
            reference = _torch_rasters(model, x_all[start:start + chunk])
            for i in range(start, min(start + chunk, n)):
                state = sim.reset(net)
                raster = [torch.zeros(int(np.prod(s)), t, dtype=torch.float64) for s in shapes]
                volts = torch.zeros(int(np.prod(shapes[-1])), t, dtype=torch.float64)
                for step in range(t):
                    state = sim.step(net, x_all[i, ..., step], state)
                    for j in range(len(lif_names)):
                        raster[j][:, step] = step_spikes[j]
                    if voltage:
                        volts[:, step] = step_voltage[0]
                for j, r in enumerate(raster):
                    k = lag[j]
                    window = r[:, :t - k]  # graph step s is torch step s + k
                    counts[i, j] = int(window.sum())
                    sums[i, j] = int(round(float((window * weights[j][:, k:]).sum())))
                    mismatch[i, j] = int((window != reference[j][i - start][:, k:]).sum())
                    totals[j] += window.sum(1)
                if voltage:  # in SLAYER's state units, as torch_reference reads its readout
                    out_aligned[i] = (volts[:, t - 1 - lag[-1]] * v_scale).round().long().numpy()
                    out_full[i] = (volts[:, -1] * v_scale).round().long().numpy()
                else:
                    out_aligned[i] = raster[-1][:, :t - lag[-1]].sum(1).long().numpy()
                    out_full[i] = raster[-1].sum(1).long().numpy()
                if bar is not None:
                    bar.update(1)
    finally:
        torch.set_num_threads(threads)
        for h in handles:
            h.remove()
        if bar is not None:
            bar.close()
    stats = NirStats(counts, sums, out_aligned, [tot.reshape(s).long().numpy() for tot, s in zip(totals, shapes)],
                     tie_voltage=None, output_full=out_full, mismatch=mismatch)  # NIR: ties to the lowest label
    return stats, load_s


def compare(stats: NirStats, torch_stats: SpikeStats, labels: np.ndarray) -> dict:
    ps, pt, pf = stats.predictions, torch_stats.predictions, predict(stats.output_full)
    return {
        "accuracy": float(np.mean(ps == labels)),
        "torch_accuracy": float(np.mean(pt == labels)),
        "agreement": float(np.mean(ps == pt)),
        "accuracy_full_window": float(np.mean(pf == labels)),
        "agreement_full_window": float(np.mean(pf == pt)),
        "layer_count_agreement": np.mean(stats.counts == torch_stats.counts, 0).round(6).tolist(),
        "layer_raster_agreement": np.mean(stats.checksums == torch_stats.checksums, 0).round(6).tolist(),
        "layer_spike_ratio": (stats.counts.sum(0) / np.maximum(torch_stats.counts.sum(0), 1)).round(6).tolist(),
        # differing (neuron, step) entries per torch spike, and per sample the first layer that differs
        "layer_spike_mismatch": (stats.mismatch.sum(0) / np.maximum(torch_stats.counts.sum(0), 1)).round(6).tolist(),
        "first_differing_layer": _first_differing(stats.mismatch),
        "spike_for_spike": bool(not stats.mismatch.any() and np.array_equal(stats.output, torch_stats.output)),
    }


def _first_differing(mismatch: np.ndarray) -> list[int]:
    """Samples whose first differing layer is 0, 1, ..., L-1, then samples identical everywhere."""
    differs = mismatch > 0
    first = np.where(differs.any(1), differs.argmax(1), mismatch.shape[1])
    return np.bincount(first, minlength=mismatch.shape[1] + 1).tolist()


def write_result(path: Path, sim: str, result: dict) -> None:
    """``path`` holds one entry per simulator: this run's replaces ``sim``'s, the others stay."""
    entries = {}
    if path.is_file():
        try:
            entries = json.loads(path.read_text())
        except ValueError:
            entries = {}
        if not isinstance(entries, dict) or not all(isinstance(v, dict) and "sim" in v for v in entries.values()):
            entries = {}  # not ours: replaced
    entries[sim] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    # one key per line; long lists (per-sample counts) stay on theirs
    path.write_text("{\n" + ",\n".join(
        f" {json.dumps(name)}: {{\n" + ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in r.items()) + "\n }"
        for name, r in entries.items()) + "\n}\n")


def run_nir(run_dir: str | Path, samples: int = 200, sim: str = "snntorch", progress: bool = True,
            quiet: bool = False, out: str | Path | None = None, model_round: str | int = "last") -> dict:
    """Run ``samples`` test samples of ``run_dir``'s ``model.nir`` in ``sim``; write the
    result under ``sim`` in ``nir.json`` (or ``out``) and ``plots/nir_<sim>.png``.
    Exports the graph first when the run has none, or one of another round."""
    from neurofed.deploy.export import load_global_model

    run_dir = Path(run_dir)
    if not isinstance(samples, int) or samples < 1:
        raise DeployError(f"--samples: got {samples!r}; expected a positive integer")
    simulator = get_simulator(sim)
    model, cfg, ds, rnd = load_global_model(run_dir, model_round=model_round)
    if cfg["data"]["encoding"] not in ENCODINGS:
        raise DeployError(f"data.encoding is {cfg['data']['encoding']!r}; the NIR comparison takes "
                          f"{', '.join(ENCODINGS)}")
    path = run_dir / NIR_FILE
    if not path.exists() or graph_meta(read_nir(path)).get("round") != rnd:
        export_nir_run(run_dir, quiet=quiet, model_round=rnd)
    graph = read_nir(path, model)
    model = nir_model(model)  # what the graph holds: norms folded, 8-bit weights
    lif_names = [lif for _, lif in node_names(model) if lif is not None]

    n = min(samples, len(ds.y_test))
    seed = seed_for(cfg["seed"], "lava")  # the input spikes `neurofed lava` uses
    spikes, notes = model_input(ds.x_test[:n], cfg["data"], seed)
    labels = np.asarray(ds.y_test[:n])
    t0 = time.perf_counter()
    torch_stats = torch_reference(model, spikes, seed, nir_plan(model, spikes.shape[-1]))
    torch_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    stats, load_s = simulate(graph, simulator, spikes, seed, lif_names, model, progress=progress and not quiet)
    run_s = time.perf_counter() - t1 - load_s

    neurons = np.array(model.neurons_per_layer, dtype=np.float64)
    t = spikes.shape[-1]
    meta = graph_meta(graph)
    result = {
        "samples": n,
        "accuracy_measured_on": measured_on(cfg["data"], n, len(ds.y_test), "lava"),  # as `neurofed lava`
        "sim": sim,
        "sim_version": _version(simulator.package),
        "nir_version": _version("nir"),
        "round": rnd,
        **compare(stats, torch_stats, labels),
        "timesteps": t,
        "dt": meta.get("dt"),
        "latency_steps": meta.get("latency_steps"),
        "layers": lif_names,
        "neurons_per_layer": neurons.astype(int).tolist(),
        "layer_spikes_mean": stats.counts.mean(0).round(4).tolist(),
        "torch_layer_spikes_mean": torch_stats.counts.mean(0).round(4).tolist(),
        "layer_firing_rates": (stats.counts.mean(0) / (neurons * t)).round(6).tolist(),
        "readout": graph_meta(graph).get("readout", "spikes"),
        "energy": energy_rows(model, graph, spikes, stats, torch_stats, analog=cfg["data"]["encoding"] == "direct"),
        "layer_spikes": stats.counts.tolist(),
        "torch_layer_spikes": torch_stats.counts.tolist(),
        "predictions": stats.predictions.tolist(),
        "torch_predictions": torch_stats.predictions.tolist(),
        "load_s": round(load_s, 4),
        "run_s": round(run_s, 4),
        "samples_per_s": round(n / run_s, 3) if run_s > 0 else None,
        "torch_s": round(torch_s, 4),
        **notes,
        "machine": f"{usable_cores()} CPU(s)",
    }
    if samples > n:
        result["note"] = f"asked for {samples} samples; the test set has {n}"
    dest = Path(out) if out else run_dir / RESULT_FILE
    write_result(dest, sim, result)
    append_check(dest.parent / HISTORY_FILE, result, PER_SAMPLE_KEYS)
    plot_nir(result, run_dir / "plots" / f"nir_{sim}.png")
    if not quiet:
        print(summary_line(result) + f" -> {dest}")
    return result


def summary_line(r: dict) -> str:
    """One line; the per-layer figures say what they count: the share of a layer's spikes
    that differ from torch's (small: float rounding in the simulator's LIF), and the
    share of samples whose whole raster in that layer equals torch's (strict: one
    differing spike of one neuron fails the sample)."""
    return (f"nir {r['sim']} {r['sim_version']}: {agreement_head(r)} "
            f"(all {r['timesteps']} steps read: {r['agreement_full_window']:.4f}); spikes differing from torch per "
            f"layer {', '.join(f'{100 * a:.1f}%' for a in r['layer_spike_mismatch'])} ({raster_shares(r)}); "
            f"{r['samples_per_s']} samples/s")


def plot_nir(result: dict, path: Path) -> Path:
    """Mean spikes per sample per layer, torch vs the simulator, and the spikes that differ per layer."""
    import neurofed.plots  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    names = result["layers"]
    x = np.arange(len(names))
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax.bar(x - 0.2, result["torch_layer_spikes_mean"], 0.4, label="torch (SLAYER)")
    ax.bar(x + 0.2, result["layer_spikes_mean"], 0.4, label=f"{result['sim']} (NIR)")
    ax.set_xticks(x, [n.removesuffix("_lif") for n in names])
    ax.set_ylabel("spikes per sample")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    ax2.bar(x, 100 * np.asarray(result["layer_spike_mismatch"]), 0.6, color="tab:red")
    ax2.set_xticks(x, [n.removesuffix("_lif") for n in names])
    ax2.set_ylabel("(neuron, step) spikes that differ\n(% of torch's spikes)")
    ax2.grid(alpha=0.3, axis="y")
    fig.suptitle(f"{result['sim']}: {result['samples']} samples, accuracy {100 * result['accuracy']:.1f}% "
                 f"(torch {100 * result['torch_accuracy']:.1f}%), agreement {100 * result['agreement']:.1f}%",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
