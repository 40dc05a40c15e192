"""``neurofed energy`` and ``neurofed energy-report``."""

from __future__ import annotations

from pathlib import Path


def _profile_args(p) -> None:
    from neurofed.energy.profiles import profile_names

    p.add_argument("--profile", dest="profiles", action="append", metavar="NAME|PATH",
                   help=f"hardware profile (repeatable; first is the headline): {', '.join(profile_names())} "
                        f"or a YAML path (default: the run's energy.profiles)")
    p.add_argument("--spikes", choices=("torch", "lava", "auto"), default="torch",
                   help="spike counts from a torch pass over the test set (default; exact per position), "
                        "or from RUN_DIR/lava.json (per-layer totals, spread uniformly); auto: lava.json "
                        "when present")
    p.add_argument("--samples", type=int, default=None, metavar="N",
                   help="torch pass over the first N test samples only (default: all)")
    p.add_argument("--convention", choices=("exact", "paper"), default=None,
                   help="headline energies: exact (measured synaptic ops) or paper (the formula of the run's "
                        "algorithm's paper); default: the run's energy.convention")


def cmd_energy(args) -> int:
    from neurofed.energy.report import config_numbers, energy_for_run
    from neurofed.energy.text import format_config_numbers, format_summary

    from neurofed.presets import presets

    preset = None if Path(args.run_dir).exists() else presets().get(args.run_dir)  # a preset's name
    if Path(args.run_dir).is_file() or preset:  # a config: the training-free numbers of its model
        from neurofed.config import load_config

        cfg = load_config(preset or args.run_dir, args.overrides)
        print(format_config_numbers(config_numbers(cfg, args.profiles)))
        return 0
    if args.overrides:
        raise ValueError("--set: only with a config file (a run's config is the one it ran with)")
    if args.samples is not None and args.samples < 1:
        raise ValueError(f"--samples: got {args.samples}; expected >= 1")
    result = energy_for_run(args.run_dir, profiles=args.profiles, spikes=args.spikes, samples=args.samples,
                            convention=args.convention, model_round=args.round)
    print(format_summary(result))
    run = Path(args.run_dir)
    print(f"-> {run / 'energy.json'}, {run / 'plots' / 'energy_layers.png'}")
    return 0


def cmd_energy_report(args) -> int:
    from neurofed.energy.table import energy_report

    res = energy_report(args.run_dirs, args.out, profiles=args.profiles, spikes=args.spikes,
                        recompute=args.recompute, samples=args.samples, convention=args.convention)
    print(Path(res["markdown"]).read_text())
    print(f"-> {res['markdown']}, {res['csv']}, {res['plot']}")
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("energy", help="energy per inference of a run (SNN vs ANN twin) on hardware profiles; "
                                      "of a config file's model: its ANN twin, without training")
    p.add_argument("run_dir", metavar="RUN_DIR|CONFIG",
                   help="run directory written by `neurofed run`, or a config file or preset name: its "
                        "ANN twin's energy under the exact count and each paper's formula, no training")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with a config file: override a config key, e.g. --set model.width=0.5 (repeatable)")
    _profile_args(p)
    from neurofed.deploy.cli import round_arg

    round_arg(p)
    p.set_defaults(func=cmd_energy)

    p = sub.add_parser("energy-report", help="one energy table and plot across runs, datasets and profiles")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    _profile_args(p)
    p.add_argument("--out", default="energy-report", help="output folder (default ./energy-report)")
    p.add_argument("--recompute", action="store_true", help="recompute energy.json even where it exists")
    p.set_defaults(func=cmd_energy_report)
