"""``neurofed lava RUN_DIR``: the run's exported network (or, for a residual model, its
process graph) on Lava, compared spike for spike with torch; ``lava.json``. How samples
stream through one compiled network is :mod:`neurofed.deploy.lava_stream`."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import numpy as np
import torch

from neurofed.deploy import DeployError
from neurofed.deploy.deployable import deployable_copy, has_residual_joins
from neurofed.deploy.export import (NET_FILE, check_net_digest, digest_file, export_run,
                                   load_global_model, read_net)
from neurofed.deploy.lava_plan import (MESSAGE_BITS, LavaPlan, SpikeStats, check_encoding, input_spikes, layer_seeds,  # noqa: F401
                                       plan_for, predict, to_lava_layout, to_torch_order, torch_reference)
from neurofed.deploy.lava_plan import fitting_input_bits
from neurofed.deploy.lava_readout import MAX_BIAS_EXP, NETX_BIAS_EXP
from neurofed.deploy.lava_shards import check_workers, simulate_shards, usable_cores
from neurofed.deploy.lava_stream import BACKENDS, CONV_MODEL_ENV, conv_model, run_config, simulate  # noqa: F401
from neurofed.rundir import append_check
from neurofed.seeds import describe_measured, measured_on, seed_for

RESULT_FILE = "lava.json"  # the latest check, whole
HISTORY_FILE = "lava_checks.jsonl"  # every check's figures, one line each (lava.json is replaced)
PER_SAMPLE_KEYS = ("layer_spikes", "predictions")  # lists as long as the samples: in lava.json only
SPIKES_FILE = "lava_layer_spikes.npy"  # (samples, layers) spike counts
NEURON_SPIKES_FILE = "lava_neuron_spikes.npz"  # layer<j>: each neuron's spikes over all samples, (C, H, W)


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
                                and (lava_stats.tie_voltage is None  # the tie-break's voltages too, where read
                                     or np.array_equal(lava_stats.tie_voltage, torch_stats.tie_voltage))
                                and all(np.array_equal(a, b) for a, b in
                                        zip(lava_stats.neuron_totals, torch_stats.neuron_totals))),
    }


def run_lava(run_dir: str | Path, samples: int = 200, backend: str = "fixed_pt", progress: bool = True,
             quiet: bool = False, model_round: str | int = "last", workers: int | None = None,
             tie_break: str | None = None) -> dict:
    """Run ``samples`` test samples of ``run_dir``'s global model of ``model_round`` (best,
    last or a kept round's number) on Lava, in ``workers`` processes (default: the usable
    cores; :mod:`neurofed.deploy.lava_shards`); write ``lava.json``.

    ``tie_break`` (``lowest_label`` or ``voltage``; default: the run's ``model.tie_break``)
    is the rule for tied spike counts, applied alike to Lava's, torch's and the trained
    model's predictions; the exported network is the same under both.

    Exports ``model.net`` first when the run has none, or one of another round.
    Returns the result dict.
    """
    run_dir = Path(run_dir)
    if not isinstance(samples, int) or samples < 1:
        raise DeployError(f"--samples: got {samples!r}; expected a positive integer")
    run_config(backend)  # fail before any work when the backend or the worker count is unusable
    workers = check_workers(workers, backend)
    model, cfg, ds, rnd = load_global_model(run_dir, model_round=model_round, tie_break=tie_break)
    check_encoding(cfg["data"])
    deployable = deployable_copy(model)  # what the chip runs: norms and an analog pool folded, 8-bit weights
    residual = has_residual_joins(deployable)
    bits = fitting_input_bits(deployable, bias_exp=MAX_BIAS_EXP if residual else NETX_BIAS_EXP)
    plan = plan_for(deployable, cfg["data"]["timesteps"], cfg["data"]["encoding"], bits)
    if residual:  # no netx file: the process graph is wired from the model's entries
        from neurofed.deploy.lava_graph import graph_entries, simulate_graph

        # written here, once: the shard workers wire Lava from these arrays and never call torch
        net, simulate_fn = graph_entries(deployable, plan.input_bits), simulate_graph
    else:
        net_path = run_dir / NET_FILE
        if (not net_path.exists() or not digest_file(net_path).exists() or read_net(net_path).get("round") != rnd
                or not plan.same_network(read_net(net_path).get("lava_plan"))):
            export_run(run_dir, quiet=quiet, model_round=rnd)
        check_net_digest(net_path)
        read_net(net_path, deployable)
        net, simulate_fn = net_path, simulate

    n = min(samples, len(ds.y_test))
    seed = seed_for(cfg["seed"], "lava")
    spikes, notes = input_spikes(ds.x_test[:n], cfg["data"], seed, input_bits=bits)
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
        "tie_break": "voltage" if plan.tie_voltage else "lowest_label",  # predictions' rule (model.tie_break)
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
    append_check(run_dir / HISTORY_FILE, result, PER_SAMPLE_KEYS)
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
            f"prediction agreement {r['agreement']:.4f}"
            + ("; ties between spike counts broken by voltage" if r.get("tie_break") == "voltage" else ""))


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
