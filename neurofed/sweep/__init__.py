"""Experiment grids: ``neurofed sweep SWEEP.yaml`` runs every point of a grid of configs
(× seeds) as a normal run directory; ``neurofed report DIR`` tables and plots them.

A sweep file (paths relative to the sweep file's folder)::

    name: fedsnn_scaling                  # optional; default: the file's stem
    base: ../digits_fedavg.yaml           # the config every point starts from
    set: {federation.rounds: 20, export: false}   # fixed overrides (dotted keys, as --set;
                                          # neurofed sweep --set KEY=VALUE adds to them)
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

from pathlib import Path

from neurofed.sweep.grid import Sweep, load_sweep, point_configs
from neurofed.sweep.report import report
from neurofed.sweep.run import default_workers, run_sweep

__all__ = ["Sweep", "add_commands", "default_workers", "load_sweep", "point_configs", "report", "run_sweep"]


def cmd_sweep(args) -> int:
    rows = run_sweep(args.sweep, out=args.out, workers=args.workers, resume=args.resume, progress=not args.quiet,
                     overrides=args.overrides)
    out = Path(args.out) if args.out else Path("sweeps") / load_sweep(args.sweep).name
    if not rows:  # the report was refused (said why on stderr)
        return 1
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
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key of every run, as the sweep's set: (not a key the grid varies; "
                        "repeatable)")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="rewrite a sweep directory's results.csv/.md and plots from its runs")
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directory (holds sweep.json)")
    p.set_defaults(func=cmd_report)
