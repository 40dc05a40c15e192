"""A sweep's plots (bars, curves, rounds), drawn from its result rows."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from neurofed.sweep.grid import METRICS, PERCENT, ROUND_METRICS, Sweep
from neurofed.sweep.values import canon, short_names, show


def plot_name(spec: dict, i: int, plots: list[dict]) -> str:
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
    return " / ".join(short_names(sweep.varied)[k] for k in d.keys)


def _selected(sweep: Sweep, rows: list[dict], spec: dict) -> list[dict]:
    where = spec.get("where") or {}
    keep = []
    for r in rows:
        ok = all(canon(r["values"][k]) in {canon(w) for w in (v if isinstance(v, list) else [v])}
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
        seen.setdefault(canon(v), v)
    return list(seen.values())


def plot(sweep: Sweep, rows: list[dict], spec: dict, path: Path) -> None:
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
            ax.set_title(f"{_dim_label(sweep, spec['panels'])} = {'/'.join(show(v) for v in pv)}", fontsize=10)
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
        label = "/".join(show(v) for v in hv) if hv is not None else None
        if spec["kind"] == "bars":
            ax.bar(pos - 0.4 + width * (j + 0.5), mean, width, yerr=std, capsize=2, label=label)
        else:
            ax.errorbar(pos, mean, yerr=std, marker="o", ms=4, capsize=3, label=label)
    ax.set_xticks(pos)
    ticks = ["/".join(show(v) for v in x) for x in xs]
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
            rest = canon({k: v for k, v in r["values"].items() if k not in skip and k not in
                           next(d for d in sweep.dims if hkey in d.keys).keys})
            style = styles[others.setdefault(rest, len(others)) % len(styles)]
        label = ", ".join(f"{short_names(sweep.varied)[k]}={show(v)}" for k, v in r["values"].items()
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
