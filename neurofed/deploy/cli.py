"""``neurofed export RUN_DIR [--format netx|nir]``, ``neurofed lava RUN_DIR --samples N``
and ``neurofed nir RUN_DIR --sim snntorch|norse``."""

from __future__ import annotations

from neurofed.deploy.constraints import DEFAULT_PROFILE
from neurofed.models import TIE_BREAKS


def round_arg(p) -> None:
    """``--round best|last|N``: which kept global model a command reads."""
    p.add_argument("--round", default="last", metavar="best|last|N",
                   help="global model of the best round, the last (default), or round N where N is one of "
                        "those two (a run keeps its best and last global models)")


def cmd_export(args) -> int:
    if args.format == "nir":
        from neurofed.deploy.nir_export import export_nir_run

        export_nir_run(args.run_dir, model_round=args.round)
        return 0
    from neurofed.deploy.export import export_run

    export_run(args.run_dir, profile=args.profile, model_round=args.round)
    return 0


def cmd_nir(args) -> int:
    from neurofed.deploy.nir_run import run_nir

    run_nir(args.run_dir, samples=args.samples, sim=args.sim, quiet=args.quiet, model_round=args.round)
    return 0


def cmd_lava(args) -> int:
    import os

    from neurofed.deploy.lava_run import CONV_MODEL_ENV, run_lava

    if args.stock_conv:
        os.environ[CONV_MODEL_ENV] = "stock"

    run_lava(args.run_dir, samples=args.samples, backend=args.backend, quiet=args.quiet, model_round=args.round,
             workers=args.workers, tie_break=args.tie_break)
    return 0


def add_commands(sub) -> None:
    p = sub.add_parser("export", help="check a run's global model against a hardware profile and write "
                                      "RUN_DIR/model.net (netx HDF5)")
    p.add_argument("run_dir", help="directory of a finished `neurofed run`")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help=f"hardware profile in hw_profiles/ (name or YAML path; default {DEFAULT_PROFILE})")
    round_arg(p)
    p.add_argument("--format", default="netx", choices=("netx", "nir"),
                   help="netx: RUN_DIR/model.net for Lava/Loihi (default); nir: RUN_DIR/model.nir, a NIR graph "
                        "(snnTorch, Norse, Rockpool, Sinabs, Spyx, ...)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("lava", help="run test samples through RUN_DIR/model.net on Lava and compare with torch "
                                    "(writes RUN_DIR/lava.json)")
    p.add_argument("run_dir", help="directory of a finished `neurofed run`")
    p.add_argument("--samples", type=int, default=200, help="test samples to run (default 200)")
    p.add_argument("--backend", default="fixed_pt", choices=("fixed_pt", "loihi2"),
                   help="fixed_pt: bit-accurate CPU simulator (default); loihi2: Loihi 2 chip (needs lava-loihi)")
    p.add_argument("--workers", type=int, default=None,
                   help="parallel Lava processes over shards of the samples, same result as one (default: the "
                        "usable cores; loihi2 runs one)")
    p.add_argument("--stock-conv", action="store_true",
                   help="run conv layers with Lava's own fixed_pt Conv model (scipy, one call per channel pair) "
                        "instead of neurofed's im2col model of the same process (identical results, ~30x faster)")
    p.add_argument("--tie-break", default=None, choices=TIE_BREAKS,
                   help="the rule for tied output spike counts on both sides: lowest_label (argmax) or voltage "
                        "(the tied neuron with the highest voltage after the last step); default: the run's "
                        "model.tie_break. Evaluation only: the exported network is the same")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    round_arg(p)
    p.set_defaults(func=cmd_lava)

    p = sub.add_parser("nir", help="run test samples through RUN_DIR/model.nir in another simulator's NIR importer "
                                   "and compare with torch (writes RUN_DIR/nir.json)")
    p.add_argument("run_dir", help="directory of a finished `neurofed run`")
    p.add_argument("--samples", type=int, default=200, help="test samples to run (default 200)")
    p.add_argument("--sim", default="snntorch", help="snntorch (default) or norse")
    p.add_argument("--quiet", action="store_true", help="no progress bar or summary")
    round_arg(p)
    p.set_defaults(func=cmd_nir)
