"""The energy figures: per-layer energy of one run, and several runs side by side."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from neurofed.energy.text import percent
from neurofed.plots import plt


def plot_layers(result: dict, path: str | Path) -> Path:
    """Per-layer inference energy, SNN vs ANN twin, one panel per priced profile."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = result["layers"]
    names = [r["name"] for r in rows]
    priced = [n for n, p in result["profiles"].items() if p.get("snn_energy_j") is not None] \
        or [result["profile"]]
    ncols = min(2, len(priced))
    nrows = -(-len(priced) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.5, 0.55 * len(names) + 2.5) * ncols, 3.4 * nrows + 0.6),
                             squeeze=False)
    for ax in axes.flat[len(priced):]:
        ax.set_visible(False)
    x = np.arange(len(names))
    handles = []
    for ax, name in zip(axes.flat, priced):
        energy = [r.get("energy", {}).get(name, {}) for r in rows]
        uj = lambda key: [(e.get(key) or np.nan) * 1e6 for e in energy]  # noqa: E731
        ax.bar(x - 0.2, uj("ann_j"), 0.4, label="ANN twin", color="tab:gray")
        ax.bar(x + 0.2, uj("snn_j"), 0.4, label="SNN (measured spikes)", color="tab:blue")
        ax.plot(x + 0.2, uj("snn_approx_j"), "k_", ms=14, mew=2, label="SNN, MACs×r×T")
        p = result["profiles"][name]
        ratio = p.get("ann_over_snn")
        base = p["profile"].get("ann_baseline")
        ax.set_title((f"{name}: ANN/SNN {ratio:.2f}×" if ratio else name)
                     + (f" (ANN on {base})" if base else ""), fontsize=10)
        ax.set_xticks(x, names, rotation=45 if len(names) > 6 else 0)
        ax.set_ylabel("energy per inference (µJ)")
        ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        rates = [r.get("input_rate") for r in rows]
        if any(v is not None for v in rates):
            ax2 = ax.twinx()
            ax2.plot(x, [v if v is not None else np.nan for v in rates], "o-", color="tab:orange", ms=3,
                     label="input spike rate")
            ax2.set_ylabel("input spikes / neuron / step", color="tab:orange")
            ax2.set_ylim(bottom=0)
        if not handles:
            handles = [h for a in ax.figure.axes[-1:] + [ax] for h in a.get_legend_handles_labels()[0]]
    run = result.get("run", {})
    fig.suptitle(f"{run.get('dataset', '')} {run.get('model', '')}: inference energy per layer", fontsize=11)
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_report(rows: list[dict], path: Path) -> Path:
    """Energy per inference (log) and ANN/SNN ratio per run, one bar per profile."""
    runs = list(dict.fromkeys(r["run"] for r in rows))
    every = list(dict.fromkeys(r["profile"] for r in rows))
    # profiles without per-op figures (Loihi 2) have nothing to draw
    profiles = [p for p in every if any(r["profile"] == p and r["snn_uJ"] is not None for r in rows)] or every[:1]
    by = {(r["run"], r["profile"]): r for r in rows}
    acc = {r["run"]: r["accuracy"] for r in rows}
    meta = {r["run"]: f"{r['dataset']}/{r['model']}" for r in rows}
    labels = [f"{run}\n{meta[run]}\nacc {percent(acc[run])}" for run in runs]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(runs) + 4), 4.2))
    x = np.arange(len(runs))
    width = 0.8 / (len(profiles) + 1)
    for j, prof in enumerate(profiles):
        snn = [by[(run, prof)]["snn_uJ"] if (run, prof) in by and by[(run, prof)]["snn_uJ"] is not None
               else np.nan for run in runs]
        ratio = [by[(run, prof)]["ann_over_snn"] if (run, prof) in by and by[(run, prof)]["ann_over_snn"]
                 else np.nan for run in runs]
        ax1.bar(x + (j - len(profiles) / 2) * width, snn, width, label=f"SNN, {prof}")
        ax2.bar(x + (j - (len(profiles) - 1) / 2) * (0.8 / len(profiles)), ratio, 0.8 / len(profiles), label=prof)
    ann = [by[(run, profiles[0])]["ann_uJ"] if (run, profiles[0]) in by else np.nan for run in runs]
    ax1.bar(x + (len(profiles) / 2) * width, ann, width, color="tab:gray", label=f"ANN twin, {profiles[0]}")
    ax1.set_yscale("log")
    ax1.set_ylabel("energy per inference (µJ)")
    ax2.axhline(1.0, color="k", lw=0.8, ls="--")
    ax2.set_yscale("log")
    ax2.set_ylabel("ANN / SNN energy (>1: SNN cheaper)")
    for ax in (ax1, ax2):
        ax.set_xticks(x, labels, fontsize=7)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
