"""Several runs' energy side by side: ``neurofed energy-report`` (markdown, CSV, PNG)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from neurofed.energy.profiles import load_profiles
from neurofed.energy.report import ENERGY_FILE, energy_for_run
from neurofed.energy.text import percent


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
        r2 = dict(r, accuracy=percent(r["accuracy"]) if r["accuracy"] is not None else "-")
        md.append("| " + " | ".join(_fmt(r2[c]) for c in TABLE_COLUMNS) + " |")
    md.append("")
    md.append("Energy per inference (one test sample, all time steps); ANN = the same topology as an ANN "
              "priced with the profile's MAC (or its ann_baseline). accuracy: the model's on the samples in "
              "accuracy_on (those the energies were counted on; summary.json's final accuracy may be on others). "
              "See each run's energy.json for sources.")
    (out / "energy_report.md").write_text("\n".join(md) + "\n")
    from neurofed.energy.plots import plot_report

    plot_report(rows, out / "energy_report.png")
    return {"rows": rows, "markdown": str(out / "energy_report.md"), "csv": str(out / "energy_report.csv"),
            "plot": str(out / "energy_report.png")}


