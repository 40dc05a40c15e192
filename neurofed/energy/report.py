"""Energy per inference of a trained run, priced on hardware profiles, and reports.

``energy_for_run(run_dir)`` loads the global model, counts spikes (torch pass over
the test set, or Lava's ``lava.json``), counts operations per layer
(:mod:`neurofed.models.opcounts`), prices them on each profile and writes
``RUN_DIR/energy.json`` plus ``RUN_DIR/plots/energy_layers.png`` (FedSNN Fig. 9
shape) and ``plots/training_energy.png`` (SFedCA Fig. 8 shape).
Prices: :mod:`neurofed.energy.pricing`; several runs side by side: :mod:`neurofed.energy.table`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from neurofed.energy.conventions import PAPERS, paper_energy
from neurofed.energy.pricing import ann_only, compute_energy, price
from neurofed.energy.profiles import ENERGY_DEFAULTS, load_profiles
from neurofed.energy.spikes import LAVA_FILE, SpikeMaps, measure_torch, read_lava, read_lava_record
from neurofed.models.opcounts import count_layers, synapse_masks
from neurofed.seeds import measured_on

DEFAULT_PROFILES = ENERGY_DEFAULTS["profiles"]
ENERGY_FILE = "energy.json"
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
    from neurofed.seeds import seed_for

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
        result = ann_only(model.layers, profs, convention=convention or run.cfg.get("energy", {}).get("convention", "exact"),
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
        from neurofed.energy.plots import plot_layers

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


# --------------------------------------------------------------------------- plots


# --------------------------------------------------------------------------- several runs


