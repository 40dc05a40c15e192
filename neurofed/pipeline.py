"""What happens after training, in order: export to netx, Lava run, energy report.

Each step is skipped with a logged reason when it does not apply, and a failure in
one step is reported without losing the run's results (they are already written).
"""

from __future__ import annotations

import sys
from pathlib import Path


def after_training(out: Path, cfg: dict, exp, summary: dict) -> None:
    steps = []
    if cfg.get("export") and cfg["model"].get("kind", "snn") == "snn":
        steps.append(("export", _export))
        if cfg.get("lava", {}).get("samples", 0) > 0:
            steps.append(("lava", _lava))
    if cfg.get("energy", {}).get("enabled"):
        steps.append(("energy", _energy))
        if hasattr(getattr(exp, "server", None), "global_models") and cfg["model"].get("kind", "snn") == "snn":
            steps.append(("energy per model", _energy_per_model))
    for name, step in steps:
        try:
            step(out, cfg, exp)
        except Exception as exc:  # results on disk stay valid; say what failed
            print(f"neurofed: {name} step failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _export(out: Path, cfg: dict, exp) -> None:
    from neurofed.deploy.export import export_run

    export_run(out, exp=exp)


def _lava(out: Path, cfg: dict, exp) -> None:
    from neurofed.deploy.lava_run import run_lava

    run_lava(out, samples=cfg["lava"]["samples"], backend=cfg["lava"]["backend"])


def _energy(out: Path, cfg: dict, exp) -> None:
    from neurofed.energy.report import energy_for_run

    energy_for_run(out, profiles=cfg["energy"]["profiles"], spikes=cfg["energy"]["spikes"], exp=exp)


def _energy_per_model(out: Path, cfg: dict, exp) -> None:
    """A server with several global models (``Server.global_models()``, e.g. SFedHIFI's
    one per width): each one's energy per inference on the first profile, measured as
    the headline energy.json is (torch spike counts on the test set), in
    ``energy_per_<models_by>.json``."""
    import json

    from neurofed.energy.ops import synapse_masks
    from neurofed.energy.profiles import load_profiles
    from neurofed.energy.report import compute_energy
    from neurofed.energy.spikes import measure_torch
    from neurofed.fl.params import ParamSpec
    from neurofed.fl.seeds import seed_for

    profiles = load_profiles(cfg["energy"]["profiles"])
    by = getattr(exp.server, "models_by", "model")
    rows = {}
    for label, (model_cfg, flat) in exp.server.global_models().items():
        model = exp.model_for(model_cfg)
        ParamSpec.from_model(model).set(model, flat)
        maps = measure_torch(model, exp.x_test, cfg["data"], seed_for(cfg["seed"], "eval"), exp.y_test)
        e = compute_energy(model.layers, maps, profiles, masks=synapse_masks(model),
                           convention=cfg["energy"].get("convention", "exact"), algorithm=cfg["algorithm"]["name"])
        rows[label] = {"accuracy": e["accuracy"], **{k: e[k] for k in ("snn_energy_j", "ann_energy_j", "ann_over_snn",
                                                                        "snn_energy_approx_j")},
                       "synaptic_ops": sum(r["synaptic_ops"] or 0.0 for r in e["layers"]),
                       "macs": sum(r["macs"] for r in e["layers"])}
    (out / f"energy_per_{by}.json").write_text(json.dumps({"profile": profiles[0].name, f"{by}s": rows}, indent=2))
