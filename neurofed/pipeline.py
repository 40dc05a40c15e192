"""The orchestrator of a run: training (:func:`neurofed.fl.runner.train`), then the
steps after it, in order: export to netx, Lava run, energy report.

:func:`plan_steps` decides before training which steps run: a step known not to apply
(a residual net cannot be exported; an encoding Lava does not take) is refused
there, said once, so no one waits hours for a step that cannot work.
:func:`after_training` runs the rest; a failure in one step is reported without losing
the run's results (they are already written). Both outcomes go to summary.json's
``after_training`` record ({step: {"status": ok|failed|refused|skipped, ...}}) and a
failed step makes ``neurofed run`` exit 1.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable

from neurofed.fl.experiment import Experiment
from neurofed.fl.runner import train
from neurofed.rundir import RunDir

log = logging.getLogger(__name__)

STEP_FAILED = "failed"


def run(cfg: dict, out: str | Path, resume: bool = False, progress: bool = True, after: bool = True,
        experiment: Callable[[dict], Experiment] = Experiment) -> dict:
    """Run (or resume) the experiment in ``out`` and, with ``after``, the steps after
    training; return the summary dict (:func:`neurofed.fl.runner.train`)."""
    return train(cfg, out, resume, progress, experiment, PostTraining(cfg) if after else None)


class PostTraining:
    """The steps after training of one run (:class:`neurofed.fl.runner.AfterTraining`)."""

    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.planned: tuple[list, dict] | None = None

    def plan(self, exp) -> None:
        self.planned = plan_steps(self.cfg, exp)

    def run(self, run_dir: RunDir, exp, summary: dict) -> dict:
        return after_training(run_dir.path, self.cfg, exp, summary, self.planned)


def plan_steps(cfg: dict, exp) -> tuple[list, dict]:
    """(steps to run, records of steps refused or skipped) for this run's config and model."""
    steps, records = [], {}
    snn = cfg["model"].get("kind", "snn") == "snn"
    if cfg.get("export"):
        refusal = _export_refusal(exp) if snn else None
        if not snn:  # the default export: true on an ANN run: nothing to export, nothing to say
            records["export"] = {"status": "skipped", "reason": f"model.kind is {cfg['model']['kind']!r}"}
        elif refusal:
            records["export"] = {"status": "refused", "reason": refusal}
            if cfg.get("lava", {}).get("samples", 0) > 0:
                records["lava"] = {"status": "refused", "reason": "needs the netx export"}
            log.warning("note: export: true, but this model cannot be exported to netx (%s); the export%s skipped "
                        "(set export: false to silence this)", refusal,
                        " and Lava steps are" if "lava" in records else " step is")
        else:
            steps.append(("export", _export))
            if cfg.get("lava", {}).get("samples", 0) > 0:
                from neurofed.deploy import DeployError
                from neurofed.deploy.lava_run import check_encoding

                try:
                    check_encoding(cfg["data"])
                    steps.append(("lava", _lava))
                except DeployError as exc:
                    records["lava"] = {"status": "refused", "reason": str(exc)}
                    log.warning("note: lava.samples is %d, but %s; the Lava step is skipped",
                                cfg["lava"]["samples"], exc)
    if cfg.get("energy", {}).get("enabled"):
        steps.append(("energy", _energy))
        if snn and exp.server.global_models() is not None:
            steps.append(("energy per model", _energy_per_model))
    return steps, records


def _export_refusal(exp) -> str | None:
    return export_refusal(exp.eval_model)


def export_refusal(model) -> str | None:
    """Why ``model`` cannot be deployed: folded for the chip (batch norm, an analog pool), then
    held by netx or, with residual joins, by the Lava graph (sizes are checked at export)."""
    from neurofed.deploy import DeployError
    from neurofed.deploy.constraints import structure_problems
    from neurofed.deploy.deployable import deployable_copy, has_residual_joins

    try:
        deployable = deployable_copy(model)
    except DeployError as exc:
        return str(exc)
    if has_residual_joins(deployable):
        from neurofed.deploy.lava_graph import graph_refusal

        return graph_refusal(deployable)
    problems = structure_problems(deployable)
    return None if not problems else problems[0] + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")


def after_training(out: Path, cfg: dict, exp, summary: dict, plan: tuple[list, dict] | None = None) -> dict:
    """Run the planned steps; return every step's record (see the module docstring)."""
    steps, records = plan if plan is not None else plan_steps(cfg, exp)
    records = dict(records)
    for name, step in steps:
        log.info("%s step", name)
        try:
            step(out, cfg, exp)
            records[name] = {"status": "ok"}
        except Exception as exc:  # results on disk stay valid; say what failed
            records[name] = {"status": STEP_FAILED, "error": f"{type(exc).__name__}: {exc}"}
            log.error("%s step failed: %s", name, f"{type(exc).__name__}: {exc}".splitlines()[0])
            log.info("%s step's traceback", name, exc_info=True)  # run.log only
    return records


def failed_steps(summary: dict) -> list[str]:
    return [name for name, r in summary.get("after_training", {}).items() if r.get("status") == STEP_FAILED]


def step_failure(summary: dict) -> str | None:
    """One line naming the first failed step and its error (None when none failed): a sweep
    shows such a point as failed and ``--resume`` runs it again."""
    failed = failed_steps(summary)
    if not failed:
        return None
    more = f" (and {len(failed) - 1} more failed step(s))" if len(failed) > 1 else ""
    error = str(summary["after_training"][failed[0]].get("error", "")).splitlines()
    return f"{failed[0]} step failed: {error[0] if error else 'no message'}{more}"


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

    from neurofed.energy.profiles import load_profiles
    from neurofed.energy.pricing import compute_energy
    from neurofed.energy.spikes import measure_torch
    from neurofed.models.opcounts import synapse_masks
    from neurofed.training.params import ParamSpec
    from neurofed.seeds import seed_for

    profiles = load_profiles(cfg["energy"]["profiles"])
    by = exp.server.models_by
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
