"""The ``neurofed`` command line.

Each subcommand lives beside the code it drives and registers itself through an
``add_commands(subparsers)`` function in the modules listed in ``COMMAND_MODULES``;
this file only dispatches and turns bad input into one-line errors (exit 2).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from neurofed.config import ConfigError
from neurofed.logs import configure as configure_logging
from neurofed.presets import resolve as resolve_preset

COMMAND_MODULES = (
    "neurofed.cli",  # run, partition
    "neurofed.deploy.cli",  # export, lava
    "neurofed.energy.cli",  # energy, energy-report
    "neurofed.sweep",  # sweep, report
    "neurofed.plots",  # coverage
    "neurofed.data.catalog",  # datasets
    "neurofed.presets",  # presets, presets copy
)


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="experiment YAML file, or a preset's name (`neurofed presets` lists them)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key by dotted path, e.g. --set federation.lr=0.01 (repeatable)")


def default_run_dir(config_path: str, cfg: dict) -> Path:
    return Path("runs") / f"{Path(config_path).stem}-seed{cfg['seed']}"


def cmd_run(args) -> int:
    from neurofed.config import load_config
    from neurofed.pipeline import failed_steps, run

    cfg = load_config(resolve_preset(args.config), args.overrides)
    out = Path(args.out) if args.out else default_run_dir(args.config, cfg)
    summary = run(cfg, out, resume=args.resume, progress=not args.quiet)
    print(f"final accuracy {summary['final_accuracy']:.4f} (best {summary['best_accuracy']:.4f}) "
          f"after {summary['rounds']} rounds in {summary['wall_time_s']:.1f} s on {summary['device']['device']} -> {out}")
    failed = failed_steps(summary)
    if failed:  # training's results are on disk; the exit code still says a step did not work
        print(f"neurofed: {', '.join(failed)} step(s) failed (summary.json: after_training); exit 1", file=sys.stderr)
        return 1
    health = summary.get("health", {})
    if args.strict and not health.get("ok", True):
        print(f"neurofed: --strict: the run is not healthy ({len(health['problems'])} problem(s), "
              f"summary.json 'health'): {health['problems'][0]}", file=sys.stderr)
        return 1
    return 0


def cmd_partition(args) -> int:
    import numpy as np

    from neurofed.config import load_config
    from neurofed.data import load_dataset
    from neurofed.data.partition import describe, label_counts, partition, plot_heatmap
    from neurofed.seeds import rng_for

    cfg = load_config(resolve_preset(args.config), args.overrides)
    ds = load_dataset(cfg["data"], cfg["seed"])
    parts = partition(ds.y_train, ds.num_classes, cfg["partition"], rng_for(cfg["seed"], "partition"))
    counts = label_counts(ds.y_train, parts, ds.num_classes)
    print(describe(counts))
    png = Path(args.png) if args.png else Path(f"{Path(args.config).stem}-partition.png")
    p = cfg["partition"]
    plot_heatmap(np.asarray(counts), png, title=f"{ds.name}: {p['scheme']}, {p['num_clients']} clients")
    print(f"heatmap -> {png}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("run", help="train a federated model from a config")
    _config_args(p)
    p.add_argument("--out", help="run directory (default runs/<config>-seed<seed>)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 when the run is not healthy (silent layers, loss stuck at chance, dropped updates)")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("partition", help="print a config's client partition and write a heatmap PNG")
    _config_args(p)
    p.add_argument("--png", help="heatmap path (default <config>-partition.png)")
    p.set_defaults(func=cmd_partition)


def build_parser() -> argparse.ArgumentParser:
    from neurofed.stamp import VersionAction

    parser = argparse.ArgumentParser(prog="neurofed", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = sys.modules[__name__] if name == __name__ else importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("neurofed"):
                continue  # that part is not installed in this tree yet
            raise
        module.add_commands(sub)
    for p in sub.choices.values():  # every command: the same console logging switch
        p.add_argument("--verbose", action="store_true",
                       help="show INFO messages on the console too (a run's run.log always has them)")
    return parser


# ValueError and FileNotFoundError: input problems found past config validation (data files, partitions)
INPUT_ERRORS = (ConfigError, ValueError, FileNotFoundError)


def error_lines(exc: Exception) -> list[str]:
    """What a refusal says: every line of a ConfigError (one per problem), the first of any other."""
    lines = str(exc).splitlines()
    return lines if isinstance(exc, ConfigError) else (lines or [""])[:1]


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(verbose=args.verbose)
    try:
        return int(args.func(args) or 0)
    except INPUT_ERRORS as exc:
        for line in error_lines(exc):
            print(f"neurofed: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("neurofed: interrupted; completed rounds are checkpointed (use --resume)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
