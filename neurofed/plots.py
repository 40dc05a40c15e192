"""PNG plots of run results (matplotlib, Agg backend: no screen needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_accuracy(history: list[dict], path: str | Path, title: str = "") -> Path:
    """Test accuracy (and mean firing rate, right axis) over rounds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rounds = [h["round"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(rounds, [100 * h["accuracy"] for h in history], marker="o", ms=3, label="test accuracy")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.grid(alpha=0.3)
    rates = [h.get("firing_rate") for h in history]
    if any(r is not None for r in rates):
        ax2 = ax.twinx()
        ax2.plot(rounds, [r if r is not None else float("nan") for r in rates], color="tab:orange",
                 alpha=0.6, label="firing rate")
        ax2.set_ylabel("mean firing rate", color="tab:orange")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def class_coverage(history: list[dict], label_counts) -> dict:
    """SFedCA Fig. 7: after each round, the class proportions of all samples held by the
    clients aggregated so far (a client aggregated in k rounds counts k times; once per
    round, whatever its aggregation weight).

    ``history`` is the run's metrics.jsonl lines (``aggregated``, else ``trained``: the
    clients whose models entered the global model); ``label_counts`` the (clients,
    classes) counts of partition.json. Returns rounds, per-round proportions
    (rounds × classes) and the proportions of the whole training set for reference.
    """
    import numpy as np

    counts = np.asarray(label_counts, dtype=np.float64)
    total = np.zeros(counts.shape[1])
    rounds, props = [], []
    for h in history:
        total = total + counts[list(h.get("aggregated", h.get("trained", [])))].sum(0)
        rounds.append(h["round"])
        props.append((total / total.sum()).tolist() if total.sum() else [0.0] * len(total))
    overall = counts.sum(0)
    return {"rounds": rounds, "proportions": props, "global": (overall / overall.sum()).tolist()}


def plot_class_coverage(coverage: dict, path: str | Path, title: str = "", columns: int = 30) -> Path:
    """Dot plot in the shape of SFedCA Fig. 7: x = round, y = class, dot area ∝ the
    cumulative share of that class among the aggregated clients' samples (at most
    ``columns`` rounds shown, evenly spaced); the last column is the whole training set.

    ``coverage`` is one :func:`class_coverage` result, or ``{label: result}`` for one
    panel per run (same scale in all panels)."""
    import numpy as np

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    panels = {"": coverage} if "rounds" in coverage else dict(coverage)
    if len(panels) > 1:
        columns = min(columns, 15)  # several panels: fewer, larger dots
    vmax = max(max((float(np.max(c["proportions"])) for c in panels.values() if c["rounds"]), default=0.0),
               max(float(np.max(c["global"])) for c in panels.values()), 1e-9)
    width = max(min(2 + 0.3 * (min(columns, max(len(c["rounds"]) for c in panels.values())) + 2), 12), 4)
    k = max(len(c["global"]) for c in panels.values())
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, (0.35 * k + 1.6) * nrows + 0.4), squeeze=False)
    for ax, (label, cov) in zip(axes.flat, panels.items()):
        _coverage_panel(ax, cov, columns, 400.0 / vmax, vmax)
        ax.set_title(label, fontsize=9)
        ax.set_ylabel("class")
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    fig.suptitle(title or "cumulative class share of aggregated clients' samples", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _coverage_panel(ax, coverage: dict, columns: int, scale: float, vmax: float) -> None:
    import numpy as np

    rounds = coverage["rounds"]
    props = np.asarray(coverage["proportions"], dtype=float)
    glob = np.asarray(coverage["global"], dtype=float)
    k = len(glob)
    keep = np.unique(np.linspace(0, len(rounds) - 1, min(columns, len(rounds))).round().astype(int)) if rounds else []
    for j, i in enumerate(keep):
        ax.scatter(np.full(k, j), np.arange(k), s=props[i] * scale, c=props[i], cmap="viridis", vmin=0, vmax=vmax,
                   edgecolors="none")
    ax.scatter(np.full(k, len(keep) + 0.5), np.arange(k), s=glob * scale, color="tab:red", edgecolors="none")
    step = max(1, len(keep) // 8)
    ax.set_xticks(list(range(0, len(keep), step)) + [len(keep) + 0.5],
                  [str(rounds[i]) for i in keep[::step]] + ["train\nset"], fontsize=8)
    ax.set_yticks(np.arange(k), [str(c) for c in range(k)])
    ax.set_xlabel("round")
    ax.grid(alpha=0.2)


def coverage_gap(coverage: dict) -> dict:
    """How far the final cumulative class share is from the training set's and from
    uniform: total-variation distances ½ Σ_c |p_c − q_c| (0 = identical)."""
    import numpy as np

    if not coverage["rounds"]:
        return {"tv_to_train_set": None, "tv_to_uniform": None}
    p = np.asarray(coverage["proportions"][-1], dtype=float)
    q = np.asarray(coverage["global"], dtype=float)
    return {"tv_to_train_set": float(0.5 * np.abs(p - q).sum()),
            "tv_to_uniform": float(0.5 * np.abs(p - 1.0 / len(p)).sum())}


def write_class_coverage(out: str | Path, history: list[dict], label_counts, title: str = "") -> dict:
    """``class_coverage.json`` and ``plots/class_coverage.png`` in run directory ``out``."""
    import json

    out = Path(out)
    cov = class_coverage(history, label_counts)
    (out / "class_coverage.json").write_text(json.dumps(cov))
    plot_class_coverage(cov, out / "plots" / "class_coverage.png", title=title)
    return cov


def run_coverage(run_dir: str | Path) -> tuple[str, dict]:
    """(label, coverage) of a finished run directory (partition.json + metrics.jsonl)."""
    import json

    import yaml

    from neurofed.rundir import require_run_folder

    run_dir = require_run_folder(run_dir)
    for name in ("partition.json", "metrics.jsonl"):
        if not (run_dir / name).is_file():
            raise FileNotFoundError(f"{run_dir}: no {name}; expected a run directory written by `neurofed run`")
    counts = json.loads((run_dir / "partition.json").read_text())["label_counts"]
    history = [json.loads(l) for l in (run_dir / "metrics.jsonl").read_text().splitlines() if l.strip()]
    label = run_dir.name
    if (run_dir / "config.yaml").is_file():
        try:
            cfg = yaml.safe_load((run_dir / "config.yaml").read_text(errors="replace"))
            label = f"{cfg['algorithm']['name']} ({cfg['model'].get('kind', 'snn')}), {cfg['partition']['scheme']}"
        except (yaml.YAMLError, KeyError, TypeError, AttributeError):
            pass  # a label only: a config the run did not write leaves the folder's name
    return label, class_coverage(history, counts)


def cmd_coverage(args) -> int:
    panels = {}
    for d in args.run_dirs:
        label, cov = run_coverage(d)
        while label in panels:
            label += "'"
        panels[label] = cov
    plot_class_coverage(panels, args.out)
    print("| run | rounds | final class share (%) | TV to train set | TV to uniform |")
    print("|---|---|---|---|---|")
    for label, cov in panels.items():
        gap = coverage_gap(cov)
        share = " ".join(f"{100 * p:.0f}" for p in (cov["proportions"][-1] if cov["rounds"] else []))
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"| {label} | {len(cov['rounds'])} | {share} | {fmt(gap['tv_to_train_set'])} | "
              f"{fmt(gap['tv_to_uniform'])} |")
    print(f"-> {args.out}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("coverage", help="class share of the aggregated clients' samples over rounds "
                                        "(SFedCA Fig. 7), one panel per run")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument("--out", default="class_coverage.png", help="PNG path (default ./class_coverage.png)")
    p.set_defaults(func=cmd_coverage)
