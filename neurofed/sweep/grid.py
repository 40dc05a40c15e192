"""The sweep file: its keys, grid dimensions and points, and every run's validated config."""

from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from neurofed.config import ConfigError, check_yaml_file, load_config, parse_override, set_dotted, yaml_load
from neurofed.sweep.values import canon, fmt, point_id, short_names

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
            set_dotted(data, key, copy.deepcopy(value), merge=True)
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
    check_yaml_file(path, "sweep file")
    try:
        raw = yaml_load(path.read_text(), f"sweep file {str(path)!r}") or {}  # a key given twice is refused, not silently dropped
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
        keys = [canon(v) for v in d.values]
        dup = next((d.values[i] for i, c in enumerate(keys) if keys.index(c) != i), None)
        if dup is not None:
            name = d.keys[0] if len(d.keys) == 1 else "/".join(d.keys)
            problems.append(f"grid {name}: value {fmt(dup[0] if len(dup) == 1 else dup)} is listed twice")

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
        seeds = [int((yaml_load(base_path.read_text()) or {}).get("seed", 0))]
    sweep = Sweep(name=name, source=str(path), base=_display_path(base_path), fixed=fixed, dims=dims,
                  seeds=list(seeds), target_accuracy=target, description=str(description).strip())
    short = short_names(sweep.varied)
    for combo in itertools.product(*[d.values for d in dims]):
        values = {k: v for d, vals in zip(dims, combo) for k, v in zip(d.keys, vals)}
        sweep.points.append(Point(point_id(values, short), values))
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
            missing = [w for w in wanted if canon(w) not in {canon(a) for a in allowed}]
            if missing:
                problems.append(f"{at}.where.{key}: got {fmt(missing[0])}; the grid has "
                                f"{', '.join(fmt(a) for a in allowed)}")
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


def with_overrides(sweep: Sweep, overrides) -> Sweep:
    """The sweep with ``--set KEY=VALUE`` items added to its ``set`` (replacing a key it
    already fixes), for every run. A key the grid varies, or ``seed``, is refused: the
    override would silently flatten that dimension."""
    problems = []
    for item in overrides:
        key, value = parse_override(item)
        if key == "seed":
            problems.append(f"--set {item!r}: the seeds of a sweep are its seeds: [..] list; edit that")
        elif key in sweep.varied or any(k.startswith(key + ".") or key.startswith(k + ".") for k in sweep.varied):
            problems.append(f"--set {item!r}: {key} is varied by the sweep's grid/zip; an override would make its "
                            f"points identical (allowed: any key the grid does not vary)")
        else:
            sweep.fixed[key] = value
    if problems:
        raise ConfigError("\n".join(problems))
    return sweep


def _applicable(data: dict) -> dict:
    """A point's settings less the algorithm keys its own algorithm does not read: a zip
    column such as SFedHIFI's ``fusion_until`` applies to the points that run SFedHIFI,
    while the grid's baseline algorithms of the same column run without it."""
    algo = data.get("algorithm")
    if not isinstance(algo, dict) or "name" not in algo:
        return data
    from neurofed.config import sections

    known = sections()["algorithm"].keys_for(algo)
    if known is None:
        return data
    return {**data, "algorithm": {k: v for k, v in algo.items() if k == "name" or k in known}}


def point_configs(sweep: Sweep) -> dict[str, dict]:
    """Validate and return every run's config (run id -> config); all problems in one error."""
    base = Path(sweep.base)
    configs: dict[str, dict] = {}
    problems: dict[str, list[str]] = {}
    for point in sweep.points:
        for seed in sweep.seeds:
            try:
                configs[point.run_id(seed)] = load_config(base, data=_applicable(sweep.config_data(point, seed)))
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
