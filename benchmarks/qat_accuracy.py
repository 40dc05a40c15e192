"""What 8-bit export costs a preset's accuracy, and what quantization-aware training wins back.

Per preset, at ``benchmarks/preset_learning.py``'s reduced scale on its stand-in (same
overrides, export and energy off), two runs with the same seed:

* float: the preset with float weights throughout (``model.quantize: false``, as the papers
  train; the presets' own default is QAT in the last 20 % of the rounds). Its last global model is evaluated
  twice on the run's test samples: with float weights (the run's own accuracy) and with the
  weights export writes (``neurofed.models.quantize.quantize_export``: netx's 8-bit grid),
  which is what Lava runs;
* QAT: ``model.quantize: R`` with R = rounds - k + 1 (``--qat-rounds k``): float up to round
  R - 1, then trained and evaluated on export's grid; its accuracy is the 8-bit model's (its
  float-weight accuracy beside it).

Up to round R - 1 both runs are the same to the bit; after it they train apart, so at a
scale where the accuracy still swings from round to round the two runs' last accuracies
differ by that swing, not by the quantization: the export loss is the float run's own
float - 8-bit difference, on the same weights.

    python benchmarks/qat_accuracy.py --only sfedca_mnist_dir03,fedlec_cifar10_iid [--save]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for p in (ROOT, ROOT / "benchmarks"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from common import Report, machine_header, with_one_line_errors  # noqa: E402

DEFAULT = "sfedca_mnist_dir03,fedlec_cifar10_iid"


def accuracies(run) -> tuple[float, float, float]:
    """(float, 8-bit, one grid) test accuracy of a run's global model (``load_global_model``'s
    result) on the run's test samples: with float weights; as export writes it
    (``deployable_copy``: batch norm folded, each layer on its own exponent's grid,
    ``neurofed.models.quantize``); and on SLAYER's one grid for every layer (exponent 0,
    unfolded: export before per-layer exponents). Leaves the model on that one grid."""
    import torch

    from neurofed.deploy.deployable import deployable_copy
    from neurofed.models.quantize import quantize_export, set_export_grid, set_weight_hook
    from neurofed.seeds import seed_for
    from neurofed.training.local import evaluate

    model, cfg, ds, _ = run
    x, y, seed = torch.as_tensor(ds.x_test), torch.as_tensor(ds.y_test), seed_for(cfg["seed"], "eval")
    exported = evaluate(deployable_copy(model), x, y, cfg, seed)["accuracy"]
    set_export_grid(model, on=False)
    float_weights = evaluate(model, x, y, cfg, seed)["accuracy"]
    one_grid = evaluate(set_weight_hook(model, quantize_export), x, y, cfg, seed)["accuracy"]
    return float_weights, exported, one_grid


def main(argv=None) -> int:
    import torch

    from neurofed.config import load_config
    from neurofed.deploy.export import load_global_model
    from neurofed.pipeline import run
    from preset_learning import overrides, scale_for

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=DEFAULT, help=f"comma-separated preset names (default {DEFAULT})")
    ap.add_argument("--qat-rounds", type=int, default=3, help="QAT in the last k rounds (default 3)")
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/qat_accuracy.txt")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    report = Report()
    say = report.emit
    say(machine_header("qat_accuracy"))
    say(f"# command: python benchmarks/qat_accuracy.py {' '.join(argv or sys.argv[1:])}".rstrip())
    say("preset | stand-in | rounds | float run: float | its 8-bit (export) | export loss, points | "
        "QAT run: 8-bit | its float")
    for name in args.only.split(","):
        preset = ROOT / "examples" / "papers" / f"{name}.yaml"
        scale = argparse.Namespace(clients=None, per_round=None, rounds=None, epochs=None, train=None, test=None,
                                   candidates=None, width=None, root=None, set=None, threads=1)
        over, _ = overrides(load_config(preset, ["data.root=/nonexistent"]), scale_for(name, scale))
        rounds = int(next(o for o in over if o.startswith("federation.rounds=")).split("=")[1])
        qat_from = max(1, rounds - args.qat_rounds + 1)
        acc = {}
        with tempfile.TemporaryDirectory(prefix="qat-") as tmp:
            for label, extra in (("float", ["model.quantize=false"]), ("qat", [f"model.quantize={qat_from}"])):
                cfg = load_config(preset, over + extra)
                run(cfg, Path(tmp) / label, progress=False)
                acc[label] = accuracies(load_global_model(Path(tmp) / label))[:2]
        (f, q), (qat_f, qat) = acc["float"], acc["qat"]
        say(f"{name} | {cfg['data']['name']} | {rounds} | {100 * f:.1f} | {100 * q:.1f} | {100 * (f - q):+.1f} | "
            f"{100 * qat:.1f} (QAT from round {qat_from}) | {100 * qat_f:.1f}")
        say(f"RESULT name=qat_accuracy preset={name} float={f:.4f} export8={q:.4f} qat8={qat:.4f} "
            f"qat_float={qat_f:.4f} qat_from={qat_from} rounds={rounds}")
    if args.save:
        report.save("qat_accuracy")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))