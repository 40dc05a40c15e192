"""Client-side training energy over rounds, and to reach target accuracies (SFedCA Fig. 8).

For each round r of a run (``metrics.jsonl``):

    samples(r)  = Σ_{clients that trained in r} |shard| × federation.local_epochs
    SNN(r)      = samples(r) × F × forward_SNN(r)
    ANN twin(r) = samples(r) × F × Σ_layers MACs × E_MAC

F = 3: a training step costs the forward pass plus a backward pass of about twice
its cost (the usual estimate for backprop, e.g. Kaplan et al. 2020). This is an
assumption that flatters the SNN: surrogate-gradient BPTT computes dense gradients,
not spike-driven accumulates. forward_SNN(r) reprices the measured inference count
of the final model with round r's firing rates (``layer_firing_rates`` of the
global model on the test set, a proxy for the clients' rates on their shards):
each layer's synaptic ops scale with its input spike rate, its spike costs with its
output rate; membrane updates and analog first-layer MACs do not depend on rates.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from neurofed.energy.conventions import PJ

DEFAULT_TARGETS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
BACKWARD_FACTOR = 3.0


def _prices(summary: dict) -> dict:
    e = summary["energy_pj"]
    return {"syn": e.get("synaptic_op", e.get("ac")), "mac": summary["mac_pj_for_ann"],
            "neuron": e.get("neuron_update", 0.0), "spike": e.get("spike", 0.0)}


def _shard_sizes(run_dir: Path) -> np.ndarray:
    path = run_dir / "partition.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir}: no partition.json (needed for the samples each client trains)")
    return np.asarray(json.loads(path.read_text())["label_counts"]).sum(1)


def forward_energy(rows: list[dict], prices: dict, rates: list | None, timesteps: int) -> float | None:
    """SNN forward energy (J) per sample with per-layer output rates ``rates``
    (None: the measured counts as they are)."""
    if prices["syn"] is None or any(r["synaptic_ops"] is None for r in rows):
        return None
    total = 0.0
    for j, r in enumerate(rows):
        syn, out = r["synaptic_ops"], r["output_spikes"] or 0.0
        if rates is not None:
            in_rate = r["input_rate"] if j == 0 else rates[j - 1]
            if r["input"] == "spikes":
                syn = syn * in_rate / r["input_rate"] if r["input_rate"] else r["macs"] * in_rate * timesteps
            out = rates[j] * r["neurons"] * timesteps
        total += (syn * prices["syn"] + r["analog_macs"] * prices["mac"]
                  + r["membrane_updates"] * prices["neuron"] + out * prices["spike"])
    return total * PJ


def training_energy(run_dir: str | Path, energy: dict | None = None, profile: str | None = None, targets=None,
                    cfg: dict | None = None, backward_factor: float = BACKWARD_FACTOR) -> dict:
    """Cumulative client-side training energy of a run, SNN vs its ANN twin.

    ``energy`` is the run's energy.json content (op counts and profiles; read from
    RUN_DIR when not given); ``profile`` defaults to the first one with per-op figures.
    """
    run_dir = Path(run_dir)
    if energy is None:
        path = run_dir / "energy.json"
        if not path.is_file():
            raise FileNotFoundError(f"{run_dir}: no energy.json; run `neurofed energy {run_dir}` first")
        energy = json.loads(path.read_text())
    metrics_path = run_dir / "metrics.jsonl"
    if not metrics_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl")
    if cfg is None:
        from neurofed.config import load_config

        cfg = load_config(run_dir / "config.yaml")
    history = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    sizes = _shard_sizes(run_dir)
    profiles = energy["profiles"]
    if profile is None:
        profile = next((n for n, p in profiles.items() if p.get("snn_energy_j") is not None), energy["profile"])
    if profile not in profiles:
        raise ValueError(f"training energy: profile {profile!r} not in energy.json; have: {', '.join(profiles)}")
    prices = _prices(profiles[profile]["profile"])
    rows = energy["layers"]
    timesteps = cfg["data"]["timesteps"]
    epochs = cfg["federation"]["local_epochs"]
    is_snn = cfg["model"].get("kind", "snn") == "snn"
    ann_fwd = sum(r["macs"] for r in rows) * prices["mac"] * PJ
    notes = [f"training step = {backward_factor:g} x forward (forward + backward ~ 2x forward); "
             "SNN rates per round from the global model's layer_firing_rates"]
    if is_snn:
        notes.append("the ANN twin is priced on this SNN run's rounds and samples (it was not trained); "
                     "compare with a model.kind=ann run for the ANN's own rounds to target")
    rounds, accs, samples, snn_cost, ann_cost = [], [], [], [], []
    for h in history:
        n = int(sum(sizes[c] for c in h.get("trained", []))) * epochs
        rates = h.get("layer_firing_rates")
        if rates is not None and len(rates) != len(rows):
            rates = None
        fwd = forward_energy(rows, prices, rates, timesteps) if is_snn else None
        rounds.append(h["round"])
        accs.append(h["accuracy"])
        samples.append(n)
        snn_cost.append(None if fwd is None else n * backward_factor * fwd)
        ann_cost.append(n * backward_factor * ann_fwd)
    have_snn = is_snn and all(c is not None for c in snn_cost)
    snn_cum = np.cumsum(snn_cost).tolist() if have_snn else None
    ann_cum = np.cumsum(ann_cost).tolist()
    wanted = sorted(set(targets or DEFAULT_TARGETS) | ({cfg["federation"]["target_accuracy"]}
                                                       if cfg["federation"].get("target_accuracy") else set()))
    to_target = []
    for t in wanted:
        k = next((i for i, a in enumerate(accs) if a >= t), None)
        to_target.append({"target": t, "round": rounds[k] if k is not None else None,
                          "snn_j": snn_cum[k] if (k is not None and snn_cum) else None,
                          "ann_j": ann_cum[k] if k is not None else None})
    return {
        "run": run_dir.name, "kind": "snn" if is_snn else "ann", "profile": profile,
        "backward_factor": backward_factor, "rounds": rounds, "accuracy": accs, "samples": samples,
        "snn_cumulative_j": snn_cum, "ann_cumulative_j": ann_cum, "to_target": to_target, "notes": notes,
    }


def plot_training_energy(curves: list[dict], path: str | Path) -> Path:
    """Cumulative training energy over rounds (left) and to reach each target accuracy
    (right, SFedCA Fig. 8 shape), for one or more runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker  # noqa: F401

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    series = []  # (label, cumulative, to_target key)
    for c in curves:
        if c.get("snn_cumulative_j"):
            series.append((f"{c['run']} SNN", c["snn_cumulative_j"], "snn_j", c))
        twin = "ANN twin (SNN's rounds)" if c["kind"] == "snn" else "ANN"
        series.append((f"{c['run']} {twin}", c["ann_cumulative_j"], "ann_j", c))
    for label, cum, _, c in series:
        ax1.plot(c["rounds"], cum, marker="o", ms=3, ls="--" if "ANN" in label else "-", label=label)
    ax1.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax1.set_xlabel("round")
    ax1.set_ylabel("cumulative client training energy (J)")
    ax1.set_yscale("log")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    targets = sorted({t["target"] for c in curves for t in c["to_target"] if t["round"] is not None})
    width = 0.8 / max(len(series), 1)
    x = np.arange(len(targets))
    for j, (label, _, key, c) in enumerate(series):
        by = {t["target"]: t[key] for t in c["to_target"]}
        ax2.bar(x + (j - (len(series) - 1) / 2) * width, [by.get(t) or np.nan for t in targets], width,
                label=label)
    ax2.set_xticks(x, [f"{100 * t:.0f}%" for t in targets])
    ax2.set_xlabel("target test accuracy")
    ax2.set_ylabel("training energy to reach it (J)")
    if not targets:
        ax2.text(0.5, 0.5, "no target reached", ha="center", transform=ax2.transAxes)
    ax2.grid(axis="y", alpha=0.3)
    ax2.legend(fontsize=7)
    prof = curves[0]["profile"] if curves else ""
    fig.suptitle(f"client-side training energy ({prof}; step = {curves[0]['backward_factor']:g}× forward)"
                 if curves else "", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
