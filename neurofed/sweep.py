"""Experiment grids: ``neurofed sweep SWEEP.yaml`` runs every point of a grid of configs
(× seeds) as a normal run directory; ``neurofed report DIR`` tables and plots them.

A sweep file (paths relative to the sweep file's folder)::

    name: fedsnn_scaling                  # optional; default: the file's stem
    base: ../digits_fedavg.yaml           # the config every point starts from
    set: {federation.rounds: 20, export: false}   # fixed overrides (dotted keys, as --set)
    grid:                                 # the product of all these lists
      model.kind: [snn, ann]
      partition.scheme: [iid, dirichlet]
    zip:                                  # keys that vary together (equal-length lists);
      partition.num_clients: [1, 5, 10]   # one grid dimension per zip group; a list of
      federation.clients_per_round: [1, 5, 2]   # such mappings gives several groups
    seeds: [0, 1]                         # default: the base config's seed
    target_accuracy: 0.9                  # optional; for the rounds-to-target column
    plots:                                # optional; PNGs under DIR/plots/
      - {kind: bars, x: partition.num_clients, hue: model.kind, panels: partition.scheme}
      - {kind: curves, x: partition.num_clients, hue: model.kind, panels: partition.scheme,
         metric: best_accuracy}
      - {kind: rounds, hue: model.kind, where: {partition.scheme: iid}}

Plot kinds: ``bars`` (grouped bars of ``metric`` over the values of ``x``, one bar per
``hue`` value), ``curves`` (``metric`` against ``x``, one line per ``hue`` value) and
``rounds`` (test accuracy, or ``metric`` from metrics.jsonl, against the round, one
line per point). ``panels`` draws one subplot per value of a key; ``where`` keeps only
the points whose key has the given value (or one of a list of values). In ``bars`` and
``curves`` every varied key must be ``x``, ``hue``, ``panels`` or fixed by ``where``,
so each bar is one point. Error bars and bands are the standard deviation over seeds.

Output: ``DIR/runs/<point id>-seed<k>/`` (what ``neurofed run`` writes, plus
``error.txt`` when the run failed), ``DIR/sweep.json`` (the resolved grid, read by
``report``), ``DIR/results.csv`` and ``DIR/results.md`` (one row per point: the varied
keys, mean ± sample std over seeds of final and best accuracy, rounds to target,
wall time, and energy when runs wrote ``energy.json``), ``DIR/runs.csv`` (one row
per run) and ``DIR/plots/*.png``.
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import math
import os
import re
import time
import traceback
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from neurofed.config import ConfigError, deep_merge, load_config

SWEEP_KEYS = ("name", "description", "base", "set", "grid", "zip", "seeds", "target_accuracy", "plots")
PLOT_KINDS = ("bars", "curves", "rounds")
PLOT_KEYS = ("kind", "x", "hue", "panels", "metric", "where", "name", "title")
# Per-point metrics (results.csv columns, ``metric`` of bars/curves): name -> axis label.
METRICS = {
    "final_accuracy": "final test accuracy (%)",
    "best_accuracy": "best test accuracy (%)",
    "rounds_to_target": "rounds to target accuracy",
    "wall_time_s": "wall time (s)",
    "final_loss": "final test loss",
    "final_firing_rate": "final mean firing rate",
    "snn_energy_j": "SNN inference energy (J)",
    "ann_energy_j": "ANN inference energy (J)",
    "train_energy_to_target_j": "client training energy to target (J)",
}
PERCENT = ("final_accuracy", "best_accuracy")
# Per-round metrics of ``rounds`` plots (keys of metrics.jsonl lines).
ROUND_METRICS = {"accuracy": "test accuracy (%)", "loss": "test loss", "train_loss": "train loss",
                 "firing_rate": "mean firing rate"}
ENERGY_KEYS = ("snn_energy_j", "ann_energy_j", "train_energy_to_target_j")


# --------------------------------------------------------------------------- the sweep file


@dataclass
class Dim:
    """One grid dimension: a single key (``grid``) or keys that vary together (``zip``)."""

    keys: list[str]
    values: list[tuple]  # one tuple (a value per key) per position


@dataclass
class Point:
    id: str
    values: dict[str, Any]  # varied key -> value

    def run_id(self, seed: int) -> str:
        return f"{self.id}-seed{seed}"


@dataclass
class Sweep:
    name: str
    source: str
    base: str
    fixed: dict[str, Any]
    dims: list[Dim]
    seeds: list[int]
    target_accuracy: float | None = None
    plots: list[dict] = field(default_factory=list)
    points: list[Point] = field(default_factory=list)
    description: str = ""

    @property
    def varied(self) -> list[str]:
        return [k for d in self.dims for k in d.keys]

    def config_data(self, point: Point, seed: int) -> dict:
        """The nested overrides of one run: ``set``, then the point's values, then the seed."""
        data: dict = {}
        for key, value in list(self.fixed.items()) + list(point.values.items()):
            _put(data, key, value)
        data["seed"] = seed
        return data

    def to_json(self) -> dict:
        return {
            "name": self.name, "description": self.description, "source": self.source, "base": self.base,
            "set": self.fixed, "dims": [{"keys": d.keys, "values": [list(v) for v in d.values]} for d in self.dims],
            "seeds": self.seeds, "target_accuracy": self.target_accuracy, "plots": self.plots,
            "points": [{"id": p.id, "values": p.values} for p in self.points],
        }

    @classmethod
    def from_json(cls, d: dict) -> "Sweep":
        dims = [Dim(x["keys"], [tuple(v) for v in x["values"]]) for x in d["dims"]]
        points = [Point(p["id"], p["values"]) for p in d["points"]]
        return cls(d["name"], d["source"], d["base"], d["set"], dims, d["seeds"], d.get("target_accuracy"),
                   d.get("plots") or [], points, d.get("description", ""))


def _put(data: dict, key: str, value: Any) -> None:
    """Set dotted ``key`` in nested ``data``; a mapping value merges into what is there."""
    node = data
    parts = key.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    if isinstance(value, dict) and isinstance(node.get(parts[-1]), dict):
        node[parts[-1]] = deep_merge(node[parts[-1]], value)
    else:
        node[parts[-1]] = copy.deepcopy(value)


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def _fmt(value: Any) -> str:
    """A value as it appears in point ids, tables and legends."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (list, tuple)):
        return "-".join(_fmt(v) for v in value)
    if isinstance(value, dict):
        return "+".join(f"{k}-{_fmt(v)}" for k, v in value.items())
    return str(value)


def _show(value: Any) -> str:
    """A value as tables and plots show it: partition settings by their papers' names."""
    if isinstance(value, dict) and "scheme" in value:
        from neurofed.data.partition import scheme_label

        return scheme_label(value)
    return _fmt(value)


def _point_cells(sweep: Sweep, values: dict) -> list[str]:
    """A point's table cells: one per sweep dimension (zipped keys joined by "/")."""
    return ["/".join(_show(values[k]) for k in d.keys) for d in sweep.dims]


def _short_names(keys: list[str]) -> dict[str, str]:
    """Last dotted part of each key, or the whole key where two keys share it."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def _point_id(values: dict[str, Any], short: dict[str, str]) -> str:
    if not values:
        return "base"
    raw = ",".join(f"{short[k]}={_fmt(v)}" for k, v in values.items())
    return re.sub(r"[^A-Za-z0-9._=,+-]", "-", raw)


def _mapping(value, where: str, problems: list[str]) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.append(f"{where}: expected a mapping of dotted config keys, got {type(value).__name__}")
        return {}
    bad = [k for k in value if not isinstance(k, str) or not k]
    if bad:
        problems.append(f"{where}: keys must be dotted config keys (strings), got {bad[0]!r}")
        return {}
    return value


def load_sweep(path: str | Path) -> Sweep:
    """Read and check a sweep file (not yet the configs; see :func:`point_configs`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"sweep file {str(path)!r} not found")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"sweep file {str(path)!r} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"sweep file {str(path)!r}: expected a mapping with base, set, grid, zip, seeds, plots")
    problems: list[str] = []
    for key in raw:
        if key not in SWEEP_KEYS:
            problems.append(f"{key}: unknown sweep key; allowed: {', '.join(SWEEP_KEYS)}")

    base = raw.get("base")
    base_path = None
    if not isinstance(base, str) or not base:
        problems.append("base: expected the path of a config file (relative to the sweep file, or absolute)")
    else:
        base_path = Path(base) if Path(base).is_absolute() else path.parent / base
        if not base_path.is_file():
            problems.append(f"base: config file {str(base_path)!r} not found (a relative base is taken from the "
                            f"sweep file's folder)")

    fixed = _mapping(raw.get("set"), "set", problems)
    grid = _mapping(raw.get("grid"), "grid", problems)
    dims: list[Dim] = []
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            problems.append(f"grid.{key}: expected a non-empty list of values, got {values!r}")
            continue
        dims.append(Dim([key], [(v,) for v in values]))
    zips = raw.get("zip") or []
    zips = [zips] if isinstance(zips, dict) else zips
    if not isinstance(zips, list):
        problems.append("zip: expected a mapping of keys to equal-length lists (or a list of such mappings)")
        zips = []
    for i, group in enumerate(zips):
        where = "zip" if len(zips) == 1 else f"zip[{i}]"
        group = _mapping(group, where, problems)
        lists = list(group.values())
        if not group:
            continue
        if not all(isinstance(v, list) and v for v in lists):
            bad = next(k for k, v in group.items() if not (isinstance(v, list) and v))
            problems.append(f"{where}.{bad}: expected a non-empty list of values")
            continue
        if len({len(v) for v in lists}) != 1:
            lengths = ", ".join(f"{k}: {len(v)}" for k, v in group.items())
            problems.append(f"{where}: the lists of keys that vary together must have equal lengths; got {lengths}")
            continue
        dims.append(Dim(list(group), list(zip(*lists))))

    seen: dict[str, str] = {}
    sections = [("set", k) for k in fixed] + [("grid" if k in grid else "zip", k) for d in dims for k in d.keys]
    for section, k in sections:
        if k == "seed":
            problems.append(f"{section}.seed: the seed is set per run by seeds: [..]; list the seeds there")
        elif k in seen:
            problems.append(f"{section}.{k}: also given in {seen[k]}; a key may appear only once")
        else:
            seen[k] = section
    for d in dims:
        canon = [_canon(v) for v in d.values]
        dup = next((d.values[i] for i, c in enumerate(canon) if canon.index(c) != i), None)
        if dup is not None:
            name = d.keys[0] if len(d.keys) == 1 else "/".join(d.keys)
            problems.append(f"grid {name}: value {_fmt(dup[0] if len(dup) == 1 else dup)} is listed twice")

    seeds = raw.get("seeds")
    if seeds is None:
        seeds = None  # filled from the base config below
    elif (not isinstance(seeds, list) or not seeds
          or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        problems.append(f"seeds: expected a non-empty list of integers >= 0, got {seeds!r}")
    elif len(set(seeds)) != len(seeds):
        problems.append(f"seeds: got {seeds!r}; each seed may appear once")

    target = raw.get("target_accuracy")
    if target is not None and (isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1):
        problems.append(f"target_accuracy: got {target!r}; expected a number in (0, 1]")

    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        problems.append(f"name: got {name!r}; expected letters, digits, '.', '_' or '-'")
    description = raw.get("description") or ""

    if problems:
        raise ConfigError("\n".join(f"{path.name}: {p}" for p in problems))

    if seeds is None:
        seeds = [int((yaml.safe_load(base_path.read_text()) or {}).get("seed", 0))]
    sweep = Sweep(name=name, source=str(path), base=_display_path(base_path), fixed=fixed, dims=dims,
                  seeds=list(seeds), target_accuracy=target, description=str(description).strip())
    short = _short_names(sweep.varied)
    for combo in itertools.product(*[d.values for d in dims]):
        values = {k: v for d, vals in zip(dims, combo) for k, v in zip(d.keys, vals)}
        sweep.points.append(Point(_point_id(values, short), values))
    ids = [p.id for p in sweep.points]
    clash = next((i for i in ids if ids.count(i) > 1), None)
    if clash:
        raise ConfigError(f"{path.name}: two points get the same directory name {clash!r}; make the values differ "
                          f"in letters or digits")
    sweep.plots = _check_plots(raw.get("plots"), sweep, path.name)
    return sweep


def _display_path(p: Path) -> str:
    """Relative to the working directory when inside it (as tables show it), else absolute."""
    p = p.resolve()
    try:
        return str(p.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def _check_plots(plots, sweep: Sweep, fname: str) -> list[dict]:
    if plots is None:
        return []
    if not isinstance(plots, list):
        raise ConfigError(f"{fname}: plots: expected a list of plot mappings (kind: {', '.join(PLOT_KINDS)})")
    problems: list[str] = []
    dim_of = {k: i for i, d in enumerate(sweep.dims) for k in d.keys}
    out = []
    for i, spec in enumerate(plots):
        at = f"plots[{i}]"
        if not isinstance(spec, dict):
            problems.append(f"{at}: expected a mapping with kind, x, hue, panels, metric, where")
            continue
        spec = dict(spec)
        for k in spec:
            if k not in PLOT_KEYS:
                problems.append(f"{at}.{k}: unknown plot key; allowed: {', '.join(PLOT_KEYS)}")
        kind = spec.get("kind")
        if kind not in PLOT_KINDS:
            problems.append(f"{at}.kind: got {kind!r}; allowed: {', '.join(PLOT_KINDS)}")
            continue
        used: dict[int, str] = {}
        for role in ("x", "hue", "panels"):
            key = spec.get(role)
            if key is None:
                continue
            if kind == "rounds" and role == "x":
                problems.append(f"{at}.x: a rounds plot has the round on its x axis; use hue or panels")
            elif key not in dim_of:
                varied = ", ".join(sweep.varied) or "none"
                problems.append(f"{at}.{role}: got {key!r}; expected a key the grid varies ({varied})")
            elif dim_of[key] in used:
                problems.append(f"{at}.{role}: {key} varies together with {used[dim_of[key]]}; "
                                f"use one of them once")
            else:
                used[dim_of[key]] = key
        if kind != "rounds" and spec.get("x") is None:
            problems.append(f"{at}.x: required for a {kind} plot; one of {', '.join(sweep.varied) or '(no varied key)'}")
        metrics = ROUND_METRICS if kind == "rounds" else METRICS
        spec.setdefault("metric", "accuracy" if kind == "rounds" else "final_accuracy")
        if spec["metric"] not in metrics:
            problems.append(f"{at}.metric: got {spec['metric']!r}; allowed for {kind}: {', '.join(metrics)}")
        where = spec.get("where") or {}
        if not isinstance(where, dict):
            problems.append(f"{at}.where: expected a mapping of varied key -> value or list of values")
            where = {}
        fixed_dims = set()
        for key, value in where.items():
            if key not in dim_of:
                problems.append(f"{at}.where.{key}: not a key the grid varies ({', '.join(sweep.varied) or 'none'})")
                continue
            d = sweep.dims[dim_of[key]]
            allowed = [v[d.keys.index(key)] for v in d.values]
            wanted = value if isinstance(value, list) else [value]
            missing = [w for w in wanted if _canon(w) not in {_canon(a) for a in allowed}]
            if missing:
                problems.append(f"{at}.where.{key}: got {_fmt(missing[0])}; the grid has "
                                f"{', '.join(_fmt(a) for a in allowed)}")
            if len(wanted) == 1:
                fixed_dims.add(dim_of[key])
        if kind != "rounds" and spec.get("x") in dim_of:
            free = [sweep.dims[j].keys[0] for j in range(len(sweep.dims))
                    if j not in used and j not in fixed_dims]
            if free:
                problems.append(f"{at}: {free[0]} varies but is not x, hue or panels; add it to one of them "
                                f"or fix it with where: {{{free[0]}: ...}}")
        out.append(spec)
    if problems:
        raise ConfigError("\n".join(f"{fname}: {p}" for p in problems))
    return out


def point_configs(sweep: Sweep) -> dict[str, dict]:
    """Validate and return every run's config (run id -> config); all problems in one error."""
    base = Path(sweep.base)
    configs: dict[str, dict] = {}
    problems: dict[str, list[str]] = {}
    for point in sweep.points:
        for seed in sweep.seeds:
            try:
                configs[point.run_id(seed)] = load_config(base, data=sweep.config_data(point, seed))
            except ConfigError as exc:
                for line in str(exc).splitlines():
                    problems.setdefault(line, []).append(point.id)
    if problems:
        lines = []
        for line, ids in problems.items():
            ids = list(dict.fromkeys(ids))
            where = f"point {ids[0]}" + (f" (and {len(ids) - 1} more)" if len(ids) > 1 else "")
            lines.append(f"{Path(sweep.source).name}: {where}: {line}")
        raise ConfigError("\n".join(lines))
    return configs


# --------------------------------------------------------------------------- running


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers() -> tuple[int, int]:
    """(worker processes, torch threads each): half the cores as workers, one thread
    each, so workers × threads never exceeds the cores. One thread, because these
    small models gain little from intra-op threads and lose much when the cores are
    shared: on this 2-core machine at load 6, three ANN digits rounds took 4.8 s with
    one thread and 30 s with two."""
    return max(1, _cores() // 2), 1


def _init_worker(threads: int) -> None:
    # Set here rather than as federation.threads so that the run configs (and with them
    # --resume's config check) do not depend on --workers.
    import torch

    torch.set_num_threads(threads)


def _execute(task: dict) -> dict:
    """Run one grid point × seed; never raises (a failure is written to error.txt)."""
    from neurofed.fl import runner

    out = Path(task["out"])
    err = out / "error.txt"
    t0 = time.perf_counter()
    try:
        if err.exists():
            err.unlink()
        summary = runner.run(task["cfg"], out, resume=task["resume"], progress=False)
        return {"run": task["run"], "ok": True, "final_accuracy": summary.get("final_accuracy")}
    except Exception as exc:
        line = f"{type(exc).__name__}: {exc}".splitlines()[0]
        out.mkdir(parents=True, exist_ok=True)
        err.write_text(line + "\n\n" + traceback.format_exc())
        return {"run": task["run"], "ok": False, "error": line, "seconds": time.perf_counter() - t0}


def _plan(sweep: Sweep, configs: dict[str, dict], out: Path, resume: bool) -> tuple[list[dict], int]:
    """The runs still to do (and how many are already finished)."""
    from neurofed.fl.runner import RUN_FILES, _comparable

    runs_dir = out / "runs"
    tasks, done = [], 0
    existing = []
    for point in sweep.points:
        for seed in sweep.seeds:
            rid = point.run_id(seed)
            cfg, rdir = configs[rid], runs_dir / rid
            has_run = any((rdir / f).exists() for f in RUN_FILES)
            if has_run and not resume:
                existing.append(rid)
                continue
            if resume and (rdir / "config.yaml").exists():
                old = yaml.safe_load((rdir / "config.yaml").read_text())
                if _comparable(old) != _comparable(cfg):
                    raise ConfigError(f"--resume: {rdir} was run with a different config than the sweep now gives; "
                                      f"only federation.rounds may change (use another --out for a new sweep)")
            summary = rdir / "summary.json"
            if resume and summary.exists():
                rounds = json.loads(summary.read_text()).get("rounds", 0)
                if rounds >= cfg["federation"]["rounds"]:
                    done += 1
                    continue
            tasks.append({"run": rid, "cfg": cfg, "out": str(rdir), "resume": resume})
    if existing:
        raise ConfigError(f"--out {out}: already holds runs of this sweep ({existing[0]}"
                          f"{f' and {len(existing) - 1} more' if len(existing) > 1 else ''}); pass --resume to "
                          f"finish them, or choose another --out")
    return tasks, done


def run_sweep(path: str | Path, out: str | Path | None = None, workers: int | None = None, resume: bool = False,
              progress: bool = True) -> list[dict]:
    """Validate the sweep and every run's config, run what is not finished, write the report.

    Returns the result rows (one per point) as :func:`report` does.
    """
    sweep = load_sweep(path)
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers: got {workers!r}; expected an integer >= 1")
    configs = point_configs(sweep)
    out = Path(out) if out is not None else Path("sweeps") / sweep.name
    tasks, done = _plan(sweep, configs, out, resume)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(sweep.to_json(), indent=1, default=str))

    default, threads = default_workers()
    workers = default if workers is None else workers
    workers = max(1, min(workers, len(tasks)))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks) + done, initial=done, desc=f"sweep {sweep.name}", unit="run", dynamic_ncols=True)
    failed: list[dict] = []

    def finished(result: dict) -> None:
        if not result["ok"]:
            failed.append(result)
        if bar is not None:
            bar.update(1)
            acc = result.get("final_accuracy")
            bar.set_postfix_str(f"failed {len(failed)}; last {result['run']}: "
                                + (f"acc {acc:.3f}" if acc is not None else "failed"))

    try:
        if workers == 1:
            import torch

            before = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                for task in tasks:  # in-process: no start-up cost, and tests can patch it
                    finished(_execute(task))
            finally:
                torch.set_num_threads(before)
        elif tasks:
            # spawn: forking a process that has loaded torch can deadlock in the child
            with ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_init_worker,
                                     initargs=(threads,)) as pool:
                futures = {pool.submit(_execute, t): t for t in tasks}
                try:
                    for fut in as_completed(futures):
                        try:
                            result = fut.result()
                        except Exception as exc:  # the worker process itself died
                            task = futures[fut]
                            line = f"{type(exc).__name__}: {exc}".splitlines()[0] or type(exc).__name__
                            Path(task["out"]).mkdir(parents=True, exist_ok=True)
                            (Path(task["out"]) / "error.txt").write_text(line + "\n")
                            result = {"run": task["run"], "ok": False, "error": line}
                        finished(result)
                except BaseException:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise
    finally:
        if bar is not None:
            bar.close()
        rows = report(out)
    for f in failed:
        print(f"neurofed sweep: {f['run']} failed: {f['error']} (see {out / 'runs' / f['run'] / 'error.txt'})")
    return rows


# --------------------------------------------------------------------------- report


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


def report(directory: str | Path) -> list[dict]:
    """(Re)write ``results.csv``, ``results.md``, ``runs.csv`` and the plots of a sweep
    directory from its finished runs; return one row per point."""
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
    _write_csv(directory / "results.csv", sweep, rows)
    _write_run_csv(directory / "runs.csv", run_rows)
    (directory / "results.md").write_text(_markdown(sweep, rows))
    for i, spec in enumerate(sweep.plots):
        _plot(sweep, rows, spec, directory / "plots" / f"{_plot_name(spec, i, sweep.plots)}.png")
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
            vals = [v if isinstance(v, (int, float, str)) or v is None else _canon(v)
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
    short = _short_names(sweep.varied)
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
    fixed = ", ".join(f"`{k}={_fmt(v)}`" for k, v in sweep.fixed.items()) or "none"
    lines += [f"Base config `{sweep.base}`; fixed: {fixed}; seeds {', '.join(map(str, sweep.seeds))}. "
              f"Accuracy is the global model's test accuracy in %, mean ± sample std over the seeds that "
              f"finished; rounds to target counts seeds that reached it.", ""]
    lines += ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for r in rows:
        cells = _point_cells(sweep, r["values"])
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
            cells = _point_cells(sweep, r["values"])
            cells += [_pm(*vals.get(l, (None, None)), scale, 1 if metric == "accuracy" else 3) for l in labels]
            means = [vals[l][0] for l in labels if vals.get(l, (None,))[0] is not None]
            cells.append(_pm(float(np.mean(means)) if means else None, None, scale, 1 if metric == "accuracy" else 3))
            lines.append("| " + " | ".join(cells) + " |")
    errors = [e for r in rows for e in r["errors"]]
    if errors:
        lines += ["", "## Failed runs", ""] + [f"- `{e.split(':', 1)[0]}`:{e.split(':', 1)[1]}" for e in errors]
    if sweep.plots:
        lines += ["", "## Plots", ""]
        lines += [f"![{n}](plots/{n}.png)" for n in (_plot_name(s, i, sweep.plots) for i, s in enumerate(sweep.plots))]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- plots


def _plot_name(spec: dict, i: int, plots: list[dict]) -> str:
    if spec.get("name"):
        return re.sub(r"[^A-Za-z0-9._-]", "-", str(spec["name"]))
    key = spec.get("x") or spec.get("hue") or "point"
    return f"{i + 1:02d}_{spec['kind']}_{spec['metric']}_by_{key.rsplit('.', 1)[-1]}"


def _dim_value(sweep: Sweep, point_values: dict, key: str) -> tuple:
    d = next(d for d in sweep.dims if key in d.keys)
    return tuple(point_values[k] for k in d.keys)


def _dim_label(sweep: Sweep, key: str | None) -> str:
    if key is None:
        return ""
    d = next(d for d in sweep.dims if key in d.keys)
    return " / ".join(_short_names(sweep.varied)[k] for k in d.keys)


def _selected(sweep: Sweep, rows: list[dict], spec: dict) -> list[dict]:
    where = spec.get("where") or {}
    keep = []
    for r in rows:
        ok = all(_canon(r["values"][k]) in {_canon(w) for w in (v if isinstance(v, list) else [v])}
                 for k, v in where.items())
        if ok:
            keep.append(r)
    return keep


def _levels(sweep: Sweep, rows: list[dict], key: str | None) -> list[tuple | None]:
    if key is None:
        return [None]
    seen: dict[str, tuple] = {}
    for r in rows:
        v = _dim_value(sweep, r["values"], key)
        seen.setdefault(_canon(v), v)
    return list(seen.values())


def _plot(sweep: Sweep, rows: list[dict], spec: dict, path: Path) -> None:
    import neurofed.plots  # noqa: F401  (selects the Agg backend)
    import matplotlib.pyplot as plt

    rows = _selected(sweep, rows, spec)
    panels = _levels(sweep, rows, spec.get("panels"))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels) + 0.6, 3.8), squeeze=False, sharey=True)
    for ax, pv in zip(axes[0], panels):
        prow = [r for r in rows if pv is None or _dim_value(sweep, r["values"], spec["panels"]) == pv]
        if spec["kind"] == "rounds":
            _draw_rounds(ax, sweep, prow, spec)
        else:
            _draw_metric(ax, sweep, prow, spec)
        if pv is not None:
            ax.set_title(f"{_dim_label(sweep, spec['panels'])} = {'/'.join(_show(v) for v in pv)}", fontsize=10)
        ax.grid(alpha=0.3, axis="y" if spec["kind"] == "bars" else "both")
    axes[0][0].set_ylabel((ROUND_METRICS if spec["kind"] == "rounds" else METRICS)[spec["metric"]])
    title = spec.get("title") or f"{sweep.name}: {spec['metric'].replace('_', ' ')}"
    fig.suptitle(title + f"  (mean ± std over {len(sweep.seeds)} seed{'s' * (len(sweep.seeds) > 1)})", fontsize=10)
    fig.tight_layout()
    handles, labels = axes[0][0].get_legend_handles_labels()
    if labels:
        # beside the panels, not over them: with many hues any spot inside hides data
        # (added after tight_layout so the panels keep their size; the saved canvas grows)
        axes[0][-1].legend(handles, labels, fontsize=8, title=_dim_label(sweep, spec.get("hue")) or None,
                           title_fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def _draw_metric(ax, sweep: Sweep, rows: list[dict], spec: dict) -> None:
    metric, xkey, hkey = spec["metric"], spec["x"], spec.get("hue")
    scale = 100.0 if metric in PERCENT else 1.0
    xs = _levels(sweep, rows, xkey)
    hues = _levels(sweep, rows, hkey)
    numeric = (spec["kind"] == "curves" and len(xs[0]) == 1
               and all(isinstance(x[0], (int, float)) and not isinstance(x[0], bool) for x in xs))
    pos = np.array([x[0] for x in xs], dtype=float) if numeric else np.arange(len(xs), dtype=float)
    width = 0.8 / len(hues)
    for j, hv in enumerate(hues):
        mean, std = [], []
        for xv in xs:
            match = [r for r in rows if _dim_value(sweep, r["values"], xkey) == xv
                     and (hv is None or _dim_value(sweep, r["values"], hkey) == hv)]
            m, s = (match[0][metric], match[0][metric + "_std"]) if match else (None, None)
            mean.append(np.nan if m is None else m * scale)
            std.append(0.0 if s is None else s * scale)
        label = "/".join(_show(v) for v in hv) if hv is not None else None
        if spec["kind"] == "bars":
            ax.bar(pos - 0.4 + width * (j + 0.5), mean, width, yerr=std, capsize=2, label=label)
        else:
            ax.errorbar(pos, mean, yerr=std, marker="o", ms=4, capsize=3, label=label)
    ax.set_xticks(pos)
    ticks = ["/".join(_show(v) for v in x) for x in xs]
    tilt = sum(len(t) for t in ticks) > 60  # long labels (e.g. mapping values) would overlap
    ax.set_xticklabels(ticks, rotation=20 if tilt else 0, ha="right" if tilt else "center",
                       fontsize=8 if tilt else None)
    ax.set_xlabel(_dim_label(sweep, xkey))


def _draw_rounds(ax, sweep: Sweep, rows: list[dict], spec: dict) -> None:
    metric = spec["metric"]
    scale = 100.0 if metric == "accuracy" else 1.0
    hkey = spec.get("hue")
    skip = {k for role in ("panels",) if spec.get(role) for k in next(d for d in sweep.dims if spec[role] in d.keys).keys}
    skip |= {k for k, v in (spec.get("where") or {}).items() if not isinstance(v, list) or len(v) == 1}
    hues = _levels(sweep, rows, hkey)
    colors = plt_colors()
    styles = ["-", "--", ":", "-."]
    others: dict[str, int] = {}
    for r in rows:
        if not r["history"]:
            continue
        n = min(len(h) for h in r["history"])
        curves = np.array([[np.nan if h[i].get(metric) is None else h[i][metric] * scale for i in range(n)]
                           for h in r["history"]], dtype=float)
        rounds = [r["history"][0][i]["round"] for i in range(n)]
        mean = np.nanmean(curves, 0)
        color, style = None, "-"
        if hkey is not None:
            hv = _dim_value(sweep, r["values"], hkey)
            color = colors[hues.index(hv) % len(colors)]
            rest = _canon({k: v for k, v in r["values"].items() if k not in skip and k not in
                           next(d for d in sweep.dims if hkey in d.keys).keys})
            style = styles[others.setdefault(rest, len(others)) % len(styles)]
        label = ", ".join(f"{_short_names(sweep.varied)[k]}={_show(v)}" for k, v in r["values"].items()
                          if k not in skip) or r["point"]
        ax.plot(rounds, mean, color=color, linestyle=style, lw=1.4, label=label)
        if len(curves) > 1:
            std = np.nanstd(curves, 0, ddof=1)
            ax.fill_between(rounds, mean - std, mean + std, color=ax.lines[-1].get_color(), alpha=0.15, lw=0)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("round")


def plt_colors() -> list[str]:
    import matplotlib.pyplot as plt

    return plt.rcParams["axes.prop_cycle"].by_key()["color"]


# --------------------------------------------------------------------------- command line


def cmd_sweep(args) -> int:
    rows = run_sweep(args.sweep, out=args.out, workers=args.workers, resume=args.resume, progress=not args.quiet)
    out = Path(args.out) if args.out else Path("sweeps") / load_sweep(args.sweep).name
    print((out / "results.md").read_text(), end="")
    print(f"{len(rows)} points -> {out / 'results.md'}, {out / 'results.csv'}")
    return 1 if any(r["failed"] for r in rows) else 0


def cmd_report(args) -> int:
    for d in args.dirs:
        rows = report(d)
        print((Path(d) / "results.md").read_text(), end="")
        print(f"{len(rows)} points -> {Path(d) / 'results.md'}, {Path(d) / 'results.csv'}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("sweep", help="run a grid of configs × seeds (a sweep file) and table/plot the results")
    p.add_argument("sweep", help="sweep YAML file (base, set, grid, zip, seeds, plots)")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes (default: half the cores), one torch thread each")
    p.add_argument("--out", help="sweep directory (default sweeps/<name>)")
    p.add_argument("--resume", action="store_true",
                   help="skip finished runs, resume interrupted ones from their checkpoints, retry failed ones")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="rewrite a sweep directory's results.csv/.md and plots from its runs")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directory (holds sweep.json)")
    p.set_defaults(func=cmd_report)
