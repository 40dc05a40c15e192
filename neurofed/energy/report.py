"""Energy per inference of a trained run, priced on hardware profiles, and reports.

``energy_for_run(run_dir)`` loads the global model, counts spikes (torch pass over
the test set, or Lava's ``lava.json``), counts operations per layer
(:mod:`neurofed.energy.ops`), prices them on each profile and writes
``RUN_DIR/energy.json`` plus ``RUN_DIR/plots/energy_layers.png`` (FedSNN Fig. 9
shape) and ``plots/training_energy.png`` (SFedCA Fig. 8 shape).
``energy_report(run_dirs, out)`` puts several runs side by side (markdown, CSV, PNG).

Pricing per inference, for a profile with per-op energies E (pJ):

    SNN = Σ_layers synaptic_ops·E_syn + analog_macs·E_MAC + membrane_updates·E_neuron
                   + output_spikes·E_spike          (terms the profile does not price are 0)
    ANN = Σ_layers MACs·E_MAC                       (E_MAC of the profile or its ann_baseline)

E_syn is ``synaptic_op`` (neuromorphic) or ``ac`` (digital). ``*_approx`` values
replace the measured synaptic ops by the papers' ``MACs × r × T``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from neurofed.energy.conventions import PAPERS, paper_energy, paper_for
from neurofed.energy.ops import count_layers, neurobench_summary, synapse_masks
from neurofed.energy.profiles import ENERGY_DEFAULTS, Profile, load_profiles
from neurofed.energy.spikes import LAVA_FILE, SpikeMaps, measure_torch, read_lava, read_lava_record
from neurofed.fl.seeds import describe_measured, measured_on, same_measurement

DEFAULT_PROFILES = ENERGY_DEFAULTS["profiles"]
ENERGY_FILE = "energy.json"
PJ = 1e-12
SPIKE_SOURCES = ("auto", "torch", "lava")


# --------------------------------------------------------------------------- loading


@dataclass
class LoadedRun:
    """A finished run as the energy module needs it: config, global model, test data."""

    run_dir: Path
    cfg: dict
    model: torch.nn.Module
    x_test: torch.Tensor
    y_test: torch.Tensor
    summary: dict
    round: int | None = None  # the round whose global model this is


def load_run(run_dir: str | Path, exp=None, model_round: str | int = "last") -> LoadedRun:
    """Load RUN_DIR's config and the global parameters of ``model_round`` (best, last or a
    kept round's number; ``load_global_model``).

    With ``exp`` (the runner's Experiment, right after training) nothing is re-read.
    """
    run_dir = Path(run_dir)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if exp is not None and model_round == "last":
        return LoadedRun(run_dir, exp.cfg, exp.eval_model, exp.x_test, exp.y_test, summary,
                         exp.cfg["federation"]["rounds"])
    from neurofed.deploy.export import load_global_model

    rm = load_global_model(run_dir, model_round=model_round)
    from neurofed.data.encoding import as_tensor

    x = as_tensor(rm.dataset.x_test)  # as stored (uint8 pixels stay uint8; encoded per batch)
    return LoadedRun(run_dir, rm.cfg, rm.model, x, torch.as_tensor(rm.dataset.y_test), summary, rm.round)


def _measure(run: LoadedRun, spikes: str, samples: int | None) -> SpikeMaps:
    from neurofed.fl.seeds import seed_for

    cfg = run.cfg
    x, y = run.x_test, run.y_test
    if samples:
        x, y = x[:samples], y[:samples]
    if spikes == "auto":
        spikes = "lava" if (run.run_dir / LAVA_FILE).is_file() else "torch"
    if spikes == "torch":
        return measure_torch(run.model, x, cfg["data"], seed_for(cfg["seed"], "eval"), y)
    if spikes == "lava":
        from neurofed.deploy.lava_run import input_spikes

        # A one-sample torch pass sets weight-norm weights for the nonzero masks.
        measure_torch(run.model, run.x_test[:1], cfg["data"], seed_for(cfg["seed"], "eval"))
        record = read_lava_record(run.run_dir)
        if run.round is not None and record.get("round") not in (None, run.round):
            raise ValueError(f"--spikes lava: {run.run_dir / LAVA_FILE} is of round {record['round']}, not "
                             f"{run.round}; run `neurofed lava {run.run_dir} --round {run.round}` first")
        n = int(record.get("samples", 0))
        # Lava received exactly these input spikes (lava_run draws them from this seed).
        s, _ = input_spikes(run.x_test[:n].numpy(), cfg["data"], seed_for(cfg["seed"], "lava"))
        first = torch.from_numpy(s != 0).double().sum(dim=(0, s.ndim - 1))  # a graded value is one message
        return read_lava(run.run_dir, run.model, cfg["data"], first_map=first)
    raise ValueError(f"--spikes: got {spikes!r}; allowed: {', '.join(SPIKE_SOURCES)}")


# --------------------------------------------------------------------------- pricing


def price(rows: list[dict], profile: Profile) -> dict:
    """Energy per inference (J) of each layer and in total on one profile."""
    mac = profile.mac_pj
    syn = profile.synaptic_pj
    neuron = profile.pj("neuron_update") or 0.0
    spike = profile.pj("spike") or 0.0
    layers, parts = [], {"synaptic_ops": 0.0, "analog_macs": 0.0, "neuron_updates": 0.0, "spikes": 0.0}
    snn_total = approx_total = 0.0
    known = profile.priced
    for r in rows:
        ann = r["macs"] * mac * PJ
        entry = {"name": r["name"], "ann_j": ann, "snn_j": None, "snn_approx_j": None}
        if known and r["synaptic_ops"] is not None:
            extra = {"analog_macs": r["analog_macs"] * mac * PJ,
                     "neuron_updates": r["membrane_updates"] * neuron * PJ,
                     "spikes": (r["output_spikes"] or 0.0) * spike * PJ}
            syn_j = r["synaptic_ops"] * syn * PJ
            entry["snn_j"] = syn_j + sum(extra.values())
            entry["snn_approx_j"] = r["synaptic_ops_approx"] * syn * PJ + sum(extra.values())
            parts["synaptic_ops"] += syn_j
            for k, v in extra.items():
                parts[k] += v
            snn_total += entry["snn_j"]
            approx_total += entry["snn_approx_j"]
        else:
            known = False
        layers.append(entry)
    ann_total = sum(e["ann_j"] for e in layers)
    result = {
        "snn_energy_j": snn_total if known else None,
        "ann_energy_j": ann_total,
        "ann_over_snn": (ann_total / snn_total) if known and snn_total > 0 else None,
        "snn_energy_approx_j": approx_total if known else None,
        "ann_over_snn_approx": (ann_total / approx_total) if known and approx_total > 0 else None,
        "snn_breakdown_j": parts if known else None,
        "layers": layers,
        "profile": profile.summary(),
    }
    if not profile.priced:
        result["note"] = (f"{profile.name}: no per-operation energy figures; op counts only"
                          + (" (measure power on hardware, see the profile's notes)" if profile.measured_only else ""))
    return result


def compute_energy(layers, maps: SpikeMaps, profiles: list[Profile], masks=None, convention: str = "exact",
                   algorithm: str = "fedavg") -> dict:
    """energy.json's content from a topology, measured spikes and profiles.

    ``convention`` (``energy.convention``): ``exact`` headlines the measured count;
    ``paper`` the formula of ``algorithm``'s paper (:mod:`neurofed.energy.conventions`),
    the exact figures kept under ``exact``. ``paper_conventions`` always holds all three
    papers' figures per profile (and SFedHIFI's Eq. 15 as printed)."""
    rows = count_layers(layers, maps.input_maps, maps.output_spikes, maps.samples, maps.timesteps,
                        masks=masks, analog_input=maps.analog_input, skip_maps=maps.skip_maps)
    priced = {p.name: price(rows, p) for p in profiles}
    for j, r in enumerate(rows):
        r["energy"] = {name: {k: v for k, v in res["layers"][j].items() if k != "name"}
                       for name, res in priced.items()}
    first = profiles[0].name
    head = priced[first]
    notes = list(maps.notes)
    if maps.analog_input:
        notes.append("layer 1 gets analog input (direct encoding): priced as MACs once per inference, as "
                     "SFedHIFI Eq. 16 (the input is constant over T; SLAYER recomputes it every step)")
    notes.append("synaptic_ops count only synapses whose 8-bit quantized weight is nonzero "
                 "(NeuroBench Effective_ACs); synaptic_ops_all_weights keeps zero weights")
    notes.append("the exact count includes pool layers on both sides (FedSNN/SFedCA leave them out: energy.convention paper)")
    if any(r.get("shortcut") for r in rows):
        notes.append("residual joins include their shortcut: a 1x1 conv counted as any conv (all weights), "
                     "an identity as one accumulate per shortcut spike and no MAC")
    papers = {p.name: {paper: paper_energy(rows, p, paper, maps.timesteps) for paper in PAPERS} for p in profiles}
    result = {
        "profile": first,
        "convention": convention,
        "snn_energy_j": head["snn_energy_j"],
        "ann_energy_j": head["ann_energy_j"],
        "ann_over_snn": head["ann_over_snn"],
        "snn_energy_approx_j": head["snn_energy_approx_j"],
        "ann_over_snn_approx": head["ann_over_snn_approx"],
        "layers": rows,
        "profiles": {name: {k: v for k, v in res.items() if k != "layers"} for name, res in priced.items()},
        "neurobench": neurobench_summary(rows, maps.timesteps),
        "spikes": {"source": maps.source, "spread": maps.spread, "samples": maps.samples,
                   "timesteps": maps.timesteps, "analog_input": maps.analog_input},
        "accuracy": maps.accuracy,
        "notes": notes,
        "paper_conventions": papers,
    }
    if convention == "paper":
        paper = paper_for(algorithm)
        result["paper"] = paper
        keys = ("snn_energy_j", "ann_energy_j", "ann_over_snn")
        for name, entry in [(first, result)] + list(result["profiles"].items()):
            entry["exact"] = {k: entry[k] for k in keys}
            entry.update({k: papers[name][paper][k] for k in keys})
        notes.append(f"convention paper: headline energies by {paper}'s formula "
                     f"(neurofed.energy.conventions); the measured count is under 'exact'")
    else:
        notes.append("pool layers are counted on both sides (FedSNN/SFedCA leave them out; "
                     "paper_conventions has their formulas)")
    return result


def _ann_only(layers, profiles: list[Profile], convention: str = "exact", algorithm: str = "fedavg") -> dict:
    """An ANN run: only the MACs of its own network; with ``convention`` paper the headline is
    the ANN energy by ``algorithm``'s paper's formula (as its tables print the ANN rows)."""
    rows = count_layers(layers, [None] * len(layers), [None] * len(layers), 1, 1)
    for r in rows:
        for k in ("synaptic_ops", "synaptic_ops_all_weights", "synaptic_ops_approx", "firing_rate",
                  "activation_sparsity", "membrane_updates", "input_spikes", "input_rate", "output_spikes"):
            r[k] = None
    priced = {p.name: price(rows, p) for p in profiles}
    for j, r in enumerate(rows):
        r["energy"] = {name: {k: v for k, v in res["layers"][j].items() if k != "name"}
                       for name, res in priced.items()}
    first = profiles[0].name
    papers = {p.name: {paper: {"ann_energy_j": paper_energy(rows, p, paper, 1)["ann_energy_j"]} for paper in PAPERS}
              for p in profiles}
    headline = {n: (papers[n][paper_for(algorithm)]["ann_energy_j"] if convention == "paper" else r["ann_energy_j"])
                for n, r in priced.items()}
    notes = ["an ANN run (model.kind=ann): MACs of its own network only"]
    if convention == "paper":
        notes.append(f"convention paper: ANN energy by {paper_for(algorithm)}'s formula (neurofed.energy.conventions); "
                     f"the exact count is under each profile's 'exact'")
    return {"profile": first, "convention": convention, "snn_energy_j": None, "ann_energy_j": headline[first],
            "ann_over_snn": None, "layers": rows,
            "profiles": {n: {"ann_energy_j": headline[n], "profile": r["profile"],
                             **({"exact": {"ann_energy_j": r["ann_energy_j"]}} if convention == "paper" else {})}
                         for n, r in priced.items()},
            "paper_conventions": papers, **({"paper": paper_for(algorithm)} if convention == "paper" else {}),
            "notes": notes}


# --------------------------------------------------------------------------- one run


def energy_for_run(run_dir: str | Path, profiles=None, spikes: str = "torch", samples: int | None = None,
                   exp=None, write: bool = True, plots: bool = True, targets=None,
                   convention: str | None = None, model_round: str | int = "last") -> dict:
    """Count, price and (by default) write RUN_DIR/energy.json and its plots, for the
    global model of ``model_round`` (best, last or a kept round's number).
    ``convention``: ``exact`` | ``paper`` (default: the run's ``energy.convention``)."""
    if spikes not in SPIKE_SOURCES:
        raise ValueError(f"--spikes: got {spikes!r}; allowed: {', '.join(SPIKE_SOURCES)}")
    run = load_run(run_dir, exp=exp, model_round=model_round)
    refs = profiles or run.cfg.get("energy", {}).get("profiles") or DEFAULT_PROFILES
    profs = load_profiles(refs)
    model = run.model
    if getattr(model, "kind", "snn") == "ann":
        result = _ann_only(model.layers, profs, convention=convention or run.cfg.get("energy", {}).get("convention", "exact"),
                           algorithm=run.cfg["algorithm"]["name"])
    else:
        maps = _measure(run, spikes, samples)
        result = compute_energy(model.layers, maps, profs, masks=synapse_masks(model),
                                convention=convention or run.cfg.get("energy", {}).get("convention", "exact"),
                                algorithm=run.cfg["algorithm"]["name"])
    result["run"] = {
        "dir": str(run.run_dir), "dataset": run.cfg["data"]["name"], "model": run.cfg["model"]["name"],
        "model_kind": run.cfg["model"].get("kind", "snn"), "width": run.cfg["model"].get("width", 1.0),
        "algorithm": run.cfg["algorithm"]["name"], "encoding": run.cfg["data"]["encoding"],
        "timesteps": run.cfg["data"]["timesteps"],
        "final_accuracy": run.summary.get("final_accuracy"),
        "final_accuracy_measured_on": run.summary.get("accuracy_measured_on"),
        "round": run.round,
    }
    if result.get("spikes"):  # `accuracy`: the model on the samples and spikes the energies were counted on
        source = result["spikes"]["source"]
        result["accuracy_measured_on"] = measured_on(run.cfg["data"], result["spikes"]["samples"], len(run.y_test),
                                                     "lava" if source == "lava" else "eval")
    from neurofed.energy.training import plot_training_energy, training_energy

    try:
        result["training"] = training_energy(run.run_dir, result, targets=targets, cfg=run.cfg)
    except FileNotFoundError as exc:  # e.g. no metrics.jsonl: inference energy stands alone
        result["training"] = {"skipped": str(exc)}
    if write:
        (run.run_dir / ENERGY_FILE).write_text(json.dumps(result, indent=2))
    if plots:
        plot_layers(result, run.run_dir / "plots" / "energy_layers.png")
        if "skipped" not in result["training"]:
            plot_training_energy([result["training"]], run.run_dir / "plots" / "training_energy.png")
    return result


def config_numbers(cfg: dict, profiles=None) -> dict:
    """The training-free numbers of a config's model: its ANN twin's operations per inference
    (no spikes, so no SNN energy) under the exact count and each paper's formula, priced on
    ``profiles`` (default: the config's), at each width of a heterogeneous-width algorithm."""
    from neurofed.data.images import IMAGE_SETS
    from neurofed.models import build_model

    data = cfg["data"]
    if data["name"] in IMAGE_SETS:  # shape and classes without reading the files
        spec = IMAGE_SETS[data["name"]]
        shape, classes = spec.shape, spec.num_classes
        if data["name"] == "cifar100" and data.get("cifar100_labels") == "coarse":
            classes = 20
    else:
        from neurofed.data import load_dataset

        ds = load_dataset(data, cfg["seed"])
        shape, classes = ds.input_shape, ds.num_classes
    profs = load_profiles(profiles or cfg.get("energy", {}).get("profiles") or DEFAULT_PROFILES)
    widths = cfg["algorithm"].get("widths") or [cfg["model"]["width"]]
    out = {"model": cfg["model"]["name"], "dataset": data["name"], "input_shape": list(shape), "widths": {}}
    for width in widths:
        layers = build_model({**cfg["model"], "width": width}, shape, classes).layers  # the config's layer options
        rows = count_layers(layers, [None] * len(layers), [None] * len(layers), 1, 1)
        out["widths"][float(width)] = {
            "macs": sum(r["macs"] for r in rows),
            "profiles": {p.name: {"exact": price(rows, p)["ann_energy_j"],
                                  **{paper: paper_energy(rows, p, paper, 1)["ann_energy_j"] for paper in PAPERS}}
                         for p in profs}}
    return out


def format_config_numbers(numbers: dict) -> str:
    """One line per width and profile: the ANN energy (µJ) under each count."""
    counts = ("exact",) + PAPERS
    lines = [f"{numbers['model']} on {numbers['dataset']} {'x'.join(map(str, numbers['input_shape']))}, "
             f"ANN twin, no training (SNN energies need a run's spikes); energy per inference in uJ",
             f"{'width':>6s} {'profile':12s} {'MACs (exact)':>13s} " + " ".join(f"{c:>13s}" for c in counts)]
    for width, w in numbers["widths"].items():
        for name, e in w["profiles"].items():
            lines.append(f"{width:>6g} {name:12s} {w['macs']:>13,} " + " ".join(f"{e[c] * 1e6:>13.3f}" for c in counts))
    return "\n".join(lines)


def format_summary(result: dict) -> str:
    """A few lines for the terminal: totals and ratio per profile."""
    lines = []
    spikes = result.get("spikes", {})
    if spikes:
        on = result.get("accuracy_measured_on")
        acc = f"accuracy {_pct(result.get('accuracy'))}" + (f" on the same samples ({describe_measured(on)})"
                                                            if on else f" on {spikes['samples']} samples")
        run = result.get("run", {})
        final_on = run.get("final_accuracy_measured_on")
        if run.get("final_accuracy") is not None and not same_measurement(on, final_on):
            acc += (f"; the run's final accuracy {_pct(run['final_accuracy'])} (summary.json) is on "
                    + (describe_measured(final_on) if final_on else "its whole test set"))
        lines.append(f"spikes: {spikes['source']} ({spikes['spread']}), {spikes['samples']} samples, "
                     f"T={spikes['timesteps']}; {acc}")
    convention = result.get("convention", "exact")
    if result.get("spikes"):
        lines.append(_CONVENTION_LINES["paper"].format(paper=result.get("paper", "?")) if convention == "paper"
                     else _CONVENTION_LINES["exact"])
    for name, p in result["profiles"].items():
        snn, ann = p.get("snn_energy_j"), p["ann_energy_j"]
        ratio = p.get("ann_over_snn")
        line = f"{name:12s} SNN {_uj(snn):>12s}  ANN {_uj(ann):>12s}  ANN/SNN {'-' if ratio is None else f'{ratio:.2f}x'}"
        if snn is None and result.get("spikes"):
            line += f"  (SNN not priced: {_unpriced_reason(name, p)})"
        if p.get("ann_over_snn_approx"):
            line += f"  (with the papers' MACs x rate x T for synaptic ops: {p['ann_over_snn_approx']:.2f}x)"
        why = _why_snn_costs_more(p) if ratio is not None and ratio < 1 else None
        if why:
            line += f"  ({why})"
        lines.append(line)
    return "\n".join(lines)


_CONVENTION_LINES = {
    "exact": "energies: convention exact (measured synaptic ops, pools included; energy.json paper_conventions "
             "has the papers' formulas)",
    "paper": "energies: convention paper ({paper}'s formula, neurofed.energy.conventions; the measured count "
             "is under 'exact' in energy.json)",
}


def _unpriced_reason(name: str, p: dict) -> str:
    """Why a profile prices no SNN energy (its ``note``, or the profile's own flags)."""
    prof = p.get("profile") or {}
    if prof.get("measured_only"):
        return f"{name} publishes no per-operation energies; measure power on the chip (hw_profiles/{name}.yaml)"
    return p.get("note") or f"{name} lacks an energy per synaptic op"


def _why_snn_costs_more(p: dict) -> str | None:
    """One clause for ANN/SNN < 1: which priced part dominates the SNN, and what the ANN is priced on."""
    parts = p.get("snn_breakdown_j") or {}
    snn = p.get("snn_energy_j")
    if not parts or not snn:
        return None
    part, joules = max(parts.items(), key=lambda kv: kv[1])
    what = {"neuron_updates": "neuron updates (every neuron, every time step)", "synaptic_ops": "synaptic ops",
            "analog_macs": "the analog first layer's MACs", "spikes": "spike routing"}.get(part, part)
    prof = p.get("profile") or {}
    ann_on = f"; the ANN is priced on {prof['ann_baseline']}'s MAC" if prof.get("ann_baseline") else ""
    return f"the SNN costs {1 / p['ann_over_snn']:.1f}x the ANN: {what} are {100 * joules / snn:.0f}% of it{ann_on}"


def _uj(j):
    return "-" if j is None else f"{j * 1e6:.4g} uJ"


def _pct(a):
    return "-" if a is None else f"{100 * a:.1f}%"


# --------------------------------------------------------------------------- plots


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_layers(result: dict, path: str | Path) -> Path:
    """Per-layer inference energy, SNN vs ANN twin, one panel per priced profile."""
    plt = _plt()
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


# --------------------------------------------------------------------------- several runs

TABLE_COLUMNS = ["run", "dataset", "model", "kind", "algorithm", "encoding", "T", "accuracy", "accuracy_on", "profile",
                 "snn_uJ", "ann_uJ", "ann_over_snn", "ann_over_snn_approx", "spikes"]


def report_rows(results: list[dict]) -> list[dict]:
    rows = []
    for res in results:
        run = res.get("run", {})
        # the accuracy measured with the energies' own spikes (same samples); an ANN run,
        # whose energy counts no spikes, shows its final accuracy and says where it is from
        if res.get("accuracy") is not None and res.get("accuracy_measured_on"):
            acc, on = res["accuracy"], _short_measured(res["accuracy_measured_on"])
        elif run.get("final_accuracy") is not None:
            acc = run["final_accuracy"]
            on = "summary.json" + (f", {_short_measured(run['final_accuracy_measured_on'])}"
                                   if run.get("final_accuracy_measured_on") else "")
        else:
            acc, on = res.get("accuracy"), None
        for name, p in res["profiles"].items():
            snn = p.get("snn_energy_j")
            rows.append({
                "run": Path(run.get("dir", "?")).name, "dataset": run.get("dataset"), "model": run.get("model"),
                "kind": run.get("model_kind"), "algorithm": run.get("algorithm"), "encoding": run.get("encoding"),
                "T": run.get("timesteps"), "accuracy": acc, "accuracy_on": on, "profile": name,
                "snn_uJ": snn * 1e6 if snn is not None else None, "ann_uJ": p["ann_energy_j"] * 1e6,
                "ann_over_snn": p.get("ann_over_snn"), "ann_over_snn_approx": p.get("ann_over_snn_approx"),
                "spikes": (f"{res['spikes']['source']}/{res['spikes']['samples']}" if res.get("spikes") else None),
            })
    return rows


def _short_measured(m: dict) -> str:
    """``100/450 test, draw eval``."""
    return f"{m['samples']}/{m['of']} {m['split']}" + (f", draw {m['input_draw']}" if m.get("input_draw") else "")


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def energy_report(run_dirs, out: str | Path, profiles=None, spikes: str = "torch", recompute: bool = False,
                  samples: int | None = None, convention: str | None = None) -> dict:
    """One table (markdown + CSV) and one plot across runs, datasets and profiles.

    Uses each run's energy.json when it exists (and ``profiles`` is not given or it
    already has them, and ``convention`` is not given or is its convention), else
    computes it.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if not run_dirs:
        raise ValueError("energy-report: name at least one RUN_DIR")
    results = []
    for d in run_dirs:
        path = Path(d) / ENERGY_FILE
        res = json.loads(path.read_text()) if path.is_file() and not recompute else None
        wanted = [p.name for p in load_profiles(profiles)] if profiles else None
        if res is None or (wanted and not all(w in res.get("profiles", {}) for w in wanted)) \
                or (convention and res.get("convention", "exact") != convention):
            res = energy_for_run(d, profiles=profiles, spikes=spikes, samples=samples, convention=convention)
        if wanted:
            res = dict(res, profiles={k: v for k, v in res["profiles"].items() if k in wanted})
        results.append(res)
    rows = report_rows(results)
    with (out / "energy_report.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    for r in rows:
        r2 = dict(r, accuracy=_pct(r["accuracy"]) if r["accuracy"] is not None else "-")
        md.append("| " + " | ".join(_fmt(r2[c]) for c in TABLE_COLUMNS) + " |")
    md.append("")
    md.append("Energy per inference (one test sample, all time steps); ANN = the same topology as an ANN "
              "priced with the profile's MAC (or its ann_baseline). accuracy: the model's on the samples in "
              "accuracy_on (those the energies were counted on; summary.json's final accuracy may be on others). "
              "See each run's energy.json for sources.")
    (out / "energy_report.md").write_text("\n".join(md) + "\n")
    plot_report(rows, out / "energy_report.png")
    return {"rows": rows, "markdown": str(out / "energy_report.md"), "csv": str(out / "energy_report.csv"),
            "plot": str(out / "energy_report.png")}


def plot_report(rows: list[dict], path: Path) -> Path:
    """Energy per inference (log) and ANN/SNN ratio per run, one bar per profile."""
    plt = _plt()
    runs = list(dict.fromkeys(r["run"] for r in rows))
    every = list(dict.fromkeys(r["profile"] for r in rows))
    # profiles without per-op figures (Loihi 2) have nothing to draw
    profiles = [p for p in every if any(r["profile"] == p and r["snn_uJ"] is not None for r in rows)] or every[:1]
    by = {(r["run"], r["profile"]): r for r in rows}
    acc = {r["run"]: r["accuracy"] for r in rows}
    meta = {r["run"]: f"{r['dataset']}/{r['model']}" for r in rows}
    labels = [f"{run}\n{meta[run]}\nacc {_pct(acc[run])}" for run in runs]
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
