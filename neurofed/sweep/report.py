"""A sweep directory's tables (results.csv, results.md, runs.csv) and plots, from its run directories."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from neurofed.config import ConfigError
from neurofed.pipeline import step_failure
from neurofed.sweep.grid import ENERGY_KEYS, METRICS, Sweep
from neurofed.sweep.values import canon, fmt, point_cells, short_names
from neurofed.sweep.plots import plot, plot_name


def _read_run(rdir: Path, target: float | None) -> dict:
    """What one run directory holds: status, summary metrics, history, energy, error."""
    run = {"status": "missing"}
    summary_path = rdir / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        history = []
        if (rdir / "metrics.jsonl").exists():
            history = [json.loads(l) for l in (rdir / "metrics.jsonl").read_text().splitlines() if l.strip()]
        if target is None:
            target = summary.get("target_accuracy")
        reached = next((h["round"] for h in history if target is not None and h["accuracy"] >= target), None)
        run.update(status="done", history=history, rounds=summary.get("rounds"), rounds_to_target=reached, target=target,
                   **{k: summary.get(k) for k in ("final_accuracy", "best_accuracy", "wall_time_s", "final_loss",
                                                  "final_firing_rate")})
        if (rdir / "energy.json").exists():
            energy = json.loads((rdir / "energy.json").read_text())
            run.update({k: energy.get(k) for k in ENERGY_KEYS})
            run["train_energy_to_target_j"] = _train_energy_to_target(energy, target)
        run["per_model"] = _per_model(summary, rdir)
        failure = step_failure(summary)
        if failure:  # trained, but its export, Lava or energy step failed: --resume runs it again
            run.update(status="failed", error=failure)
    elif (rdir / "error.txt").exists():
        run.update(status="failed", error=(rdir / "error.txt").read_text().splitlines()[0])
    return run


def _per_model(summary: dict, rdir: Path) -> dict[str, dict[str, float]]:
    """Runs with several global models (e.g. SFedHIFI's one per width): summary.json's
    ``accuracy_per_<by>`` and ``energy_per_<by>.json``'s SNN energy, as
    {"accuracy_per_width": {label: value}, "snn_energy_j_per_width": {...}}."""
    out = {k: v for k, v in summary.items() if k.startswith("accuracy_per_") and isinstance(v, dict)}
    for path in sorted(rdir.glob("energy_per_*.json")):
        by = path.stem[len("energy_per_"):]
        rows = json.loads(path.read_text()).get(f"{by}s", {})
        for key in ("snn_energy_j", "ann_energy_j"):
            out[f"{key}_per_{by}"] = {label: r.get(key) for label, r in rows.items()}
    return out


def _train_energy_to_target(energy: dict, target: float | None) -> float | None:
    """Client training energy (J) until the run first reached ``target``, priced for the
    model it trained (an SNN run's SNN, an ANN run's own ANN): energy.json's
    ``training.to_target`` (neurofed.energy.training)."""
    training = energy.get("training") or {}
    key = "ann_j" if training.get("kind") == "ann" else "snn_j"
    return next((t.get(key) for t in training.get("to_target", [])
                 if target is not None and abs(t["target"] - target) < 1e-9), None)


def _stats(values: list) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (None with fewer than two values)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None, None
    return float(np.mean(vals)), (float(np.std(vals, ddof=1)) if len(vals) > 1 else None)


class ReportRefused(ConfigError):
    """The tables were left as they are: there is nothing to read, or the runs on disk
    hold less than the tables already written."""


def _recorded_seeds(path: Path) -> dict[str, int]:
    """Finished seeds per point in an existing results.csv (empty when there is none)."""
    if not path.is_file():
        return {}
    with path.open(newline="") as fh:
        return {r["point"]: int(r["seeds"] or 0) for r in csv.DictReader(fh) if r.get("point")}


def report(directory: str | Path) -> list[dict]:
    """(Re)write ``results.csv``, ``results.md``, ``runs.csv`` and the plots of a sweep
    directory from its finished runs; return one row per point.

    Never overwrites a table with less than it holds: with no run directories to read,
    or fewer finished seeds for a point than results.csv records, it raises
    :class:`ReportRefused` and writes nothing."""
    directory = Path(directory)
    meta = directory / "sweep.json"
    if not meta.is_file():
        raise ConfigError(f"{directory}: not a sweep directory (no sweep.json); run `neurofed sweep` first")
    sweep = Sweep.from_json(json.loads(meta.read_text()))
    target = sweep.target_accuracy
    rows, run_rows = [], []
    for point in sweep.points:
        runs = {s: _read_run(directory / "runs" / point.run_id(s), target) for s in sweep.seeds}
        done = {s: r for s, r in runs.items() if r["status"] == "done"}
        row: dict[str, Any] = {"point": point.id, "values": point.values, "seeds": len(done),
                               "failed": sum(r["status"] == "failed" for r in runs.values()),
                               "missing": sum(r["status"] == "missing" for r in runs.values()),
                               "errors": [f"{point.run_id(s)}: {r['error']}" for s, r in runs.items()
                                          if r["status"] == "failed"],
                               "reached": sum(r.get("rounds_to_target") is not None for r in done.values()),
                               "target": next((r["target"] for r in done.values() if r.get("target") is not None),
                                              None),
                               "history": [r["history"] for r in done.values()]}
        for m in METRICS:
            row[m], row[m + "_std"] = _stats([r.get(m) for r in done.values()])
        keys = dict.fromkeys(k for r in done.values() for k in r.get("per_model", {}))
        row["per_model"] = {k: {label: _stats([r.get("per_model", {}).get(k, {}).get(label) for r in done.values()])
                                for label in dict.fromkeys(l for r in done.values()
                                                           for l in r.get("per_model", {}).get(k, {}))}
                            for k in keys}
        rows.append(row)
        for s, r in runs.items():
            run_rows.append({"run": point.run_id(s), "seed": s, "status": r["status"],
                             **{m: r.get(m) for m in METRICS}, "error": r.get("error", "")})
    if not any(r["status"] != "missing" for r in run_rows):
        raise ReportRefused(f"{directory}: no runs to read under {directory / 'runs'} "
                            f"(0 of {len(run_rows)} run directories); tables left as they are")
    recorded = _recorded_seeds(directory / "results.csv")
    fewer = [f"{r['point']} ({r['seeds']} < {recorded[r['point']]})" for r in rows
             if recorded.get(r["point"], 0) > r["seeds"]]
    if fewer:
        raise ReportRefused(f"{directory}: the runs on disk hold fewer finished seeds than results.csv records for "
                            f"{len(fewer)} point(s), e.g. {fewer[0]}; tables left as they are "
                            f"(delete results.csv to rebuild from what is there)")
    _write_csv(directory / "results.csv", sweep, rows)
    _write_run_csv(directory / "runs.csv", run_rows)
    (directory / "results.md").write_text(_markdown(sweep, rows))
    for i, spec in enumerate(sweep.plots):
        plot(sweep, rows, spec, directory / "plots" / f"{plot_name(spec, i, sweep.plots)}.png")
    return rows


def _write_csv(path: Path, sweep: Sweep, rows: list[dict]) -> None:
    has_energy = any(r[k] is not None for r in rows for k in ENERGY_KEYS)
    metrics = [m for m in METRICS if m not in ENERGY_KEYS or has_energy]
    header = ["point", *sweep.varied, "seeds", "failed", "missing", "target_reached"]
    header += [c for m in metrics for c in (m + "_mean", m + "_std")]
    per = _per_model_columns(rows)
    header += [f"{k}[{label}]_{s}" for k, label in per for s in ("mean", "std")] + ["errors"]
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            vals = [v if isinstance(v, (int, float, str)) or v is None else canon(v)
                    for v in (r["values"][k] for k in sweep.varied)]
            stats = [("" if r[c] is None else float(f"{r[c]:.6g}")) for m in metrics for c in (m, m + "_std")]
            extra = [("" if v is None else float(f"{v:.6g}")) for k, label in per
                     for v in r["per_model"].get(k, {}).get(label, (None, None))]
            w.writerow([r["point"], *vals, r["seeds"], r["failed"], r["missing"], r["reached"], *stats, *extra,
                        " | ".join(r["errors"])])


def _per_model_columns(rows: list[dict]) -> list[tuple[str, str]]:
    """(key, label) of every per-model value in the rows, labels in numeric order when numbers."""
    keys = dict.fromkeys(k for r in rows for k in r.get("per_model", {}))
    out = []
    for k in keys:
        labels = list(dict.fromkeys(l for r in rows for l in r["per_model"].get(k, {})))
        try:
            labels.sort(key=float)
        except ValueError:
            pass
        out += [(k, label) for label in labels]
    return out


def _write_run_csv(path: Path, run_rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(run_rows[0]) if run_rows else ["run"])
        w.writeheader()
        for r in run_rows:
            w.writerow({k: ("" if v is None else (float(f"{v:.6g}") if isinstance(v, float) else v))
                        for k, v in r.items()})


def _pm(mean, std, scale=1.0, digits=1) -> str:
    if mean is None:
        return "—"
    s = f"{mean * scale:.{digits}f}"
    return s + (f" ± {std * scale:.{digits}f}" if std is not None else "")


def _markdown(sweep: Sweep, rows: list[dict]) -> str:
    short = short_names(sweep.varied)
    head = [" / ".join(short[k] for k in d.keys) for d in sweep.dims]
    target = sweep.target_accuracy
    targets = {r["target"] for r in rows if r.get("target") is not None}
    if target is None and len(targets) == 1:
        target = targets.pop()
    has_target = target is not None or bool(targets)  # no target anywhere: no target columns
    has_energy = any(r[k] is not None for r in rows for k in ENERGY_KEYS)
    cols = head + ["seeds", "final acc (%)", "best acc (%)"]
    cols += [f"rounds to {100 * target:g}%" if target else "rounds to target"] * has_target + ["wall time (s)"]
    if has_energy:
        cols += ["SNN energy (µJ)", "ANN energy (µJ)"] + ["training energy to target (mJ)"] * has_target
    lines = [f"# Sweep `{sweep.name}`", ""]
    if sweep.description:
        lines += [sweep.description, ""]
    fixed = ", ".join(f"`{k}={fmt(v)}`" for k, v in sweep.fixed.items()) or "none"
    lines += [f"Base config `{sweep.base}`; fixed: {fixed}; seeds {', '.join(map(str, sweep.seeds))}. "
              f"Accuracy is the global model's test accuracy in %, mean ± sample std over the seeds that "
              f"finished; rounds to target counts seeds that reached it.", ""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = point_cells(sweep, r["values"])
        seeds = str(r["seeds"]) + (f" ({r['failed']} failed)" if r["failed"] else "")
        rtt = _pm(r["rounds_to_target"], r["rounds_to_target_std"])
        if r["seeds"] and r["reached"] < r["seeds"]:
            rtt = f"{rtt} ({r['reached']}/{r['seeds']} reached)" if r["reached"] else "not reached"
        cells += [seeds, _pm(r["final_accuracy"], r["final_accuracy_std"], 100),
                  _pm(r["best_accuracy"], r["best_accuracy_std"], 100)]
        cells += [rtt] * has_target + [_pm(r["wall_time_s"], r["wall_time_s_std"], digits=0)]
        if has_energy:
            cells += [_pm(r["snn_energy_j"], r["snn_energy_j_std"], 1e6, 3),
                      _pm(r["ann_energy_j"], r["ann_energy_j_std"], 1e6, 3)]
            cells += [_pm(r["train_energy_to_target_j"], r["train_energy_to_target_j_std"], 1e3, 3)] * has_target
        lines.append("| " + " | ".join(cells) + " |")
    per = _per_model_columns(rows)
    for key in dict.fromkeys(k for k, _ in per):
        labels = [label for k, label in per if k == key]
        metric, by = key.rsplit("_per_", 1)
        scale, unit = (100, "%") if metric == "accuracy" else (1e6, "µJ")
        title = {"accuracy": "Test accuracy", "snn_energy_j": "SNN energy per inference",
                 "ann_energy_j": "ANN energy per inference"}.get(metric, metric)
        lines += ["", f"## {title} per {by} ({unit})", "",
                  "| " + " | ".join(head + [f"{by} {l}" for l in labels] + ["mean"]) + " |",
                  "|" + "|".join("---" for _ in head + labels + ["mean"]) + "|"]
        for r in rows:
            vals = r["per_model"].get(key, {})
            cells = point_cells(sweep, r["values"])
            cells += [_pm(*vals.get(l, (None, None)), scale, 1 if metric == "accuracy" else 3) for l in labels]
            means = [vals[l][0] for l in labels if vals.get(l, (None,))[0] is not None]
            cells.append(_pm(float(np.mean(means)) if means else None, None, scale, 1 if metric == "accuracy" else 3))
            lines.append("| " + " | ".join(cells) + " |")
    errors = [e for r in rows for e in r["errors"]]
    if errors:
        lines += ["", "## Failed runs", ""] + [f"- `{e.split(':', 1)[0]}`:{e.split(':', 1)[1]}" for e in errors]
    if sweep.plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{n}](plots/{n}.png)" for n in (plot_name(s, i, sweep.plots) for i, s in enumerate(sweep.plots))]
    return "\n".join(lines) + "\n"
