"""What a preset's first optimizer steps do to its network: per step the training loss, the
spread of the logits, each weight tensor's change relative to where it started and, for an
SNN, each spiking layer's firing rate.

The network is the preset's, trained centrally as ``twin_curves.py`` trains it (one client,
IID, the FedAvg objective, ``model.init`` calibrated on every training image), through the
one training loop (:func:`neurofed.training.local.train_local`) on the first
``--steps`` × batch images. Adam's first steps move every weight by about the learning rate
whatever its gradient, so a unit's input moves by about lr × its fan-in: the table shows which
layer that moves most, and whether the loss jumps above ln(classes) while it does.

    python benchmarks/first_steps.py --preset fedsnn_cifar10_iid --set model.width=1.0 --steps 12
    python benchmarks/first_steps.py --preset fedsnn_cifar10_iid --set model.width=1.0 --set federation.lr=0.0003
    python benchmarks/first_steps.py --preset fedsnn_cifar10_iid --set model.width=1.0 --kind ann
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import at_least, machine_header, with_one_line_errors  # noqa: E402
from twin_curves import CENTRAL, KINDS, data_override  # noqa: E402


class StepProbe:
    """The FedAvg objective's hooks for :func:`~neurofed.training.local.train_local`, noting
    what each step did (a row per step in ``rows``)."""

    def __init__(self, model):
        self.weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.dim() > 1 and p.requires_grad}
        self.rows: list[dict] = []

    def make_optimizer(self, model, fed_cfg):
        from neurofed.training.local import make_optimizer

        return make_optimizer(model.parameters(), fed_cfg)

    def loss(self, model, output, y, x):
        logits = model.readout(output)
        rates = [float(s.float().mean()) / n for s, n in zip(model.layer_spikes, model.neurons_per_layer)] \
            if getattr(model, "layer_spikes", None) else []
        loss = F.cross_entropy(logits, y)
        self.rows.append({"loss": float(loss.detach()), "logit_std": float(logits.detach().std()),
                          "rates": [r / max(1, output.shape[-1]) for r in rates]})
        return loss

    def before_step(self, model, optimizer):
        pass

    def after_step(self, model, optimizer):
        params = dict(model.named_parameters())
        self.rows[-1]["moved"] = {n: float((params[n].detach() - w).norm() / w.norm().clamp_min(1e-12))
                                  for n, w in self.weights.items()}


def probe_steps(preset: str, root: str | None, steps: int, kind: str, threads: int, sets: list[str]):
    """Train ``preset``'s network (``kind``) for ``steps`` steps from its calibrated start;
    returns ``(probe, model, cfg, experiment)``."""
    from neurofed.config import load_config
    from neurofed.fl.experiment import Experiment
    from neurofed.presets import resolve
    from neurofed.training.local import train_local

    cfg = load_config(resolve(preset), [*CENTRAL, f"federation.threads={threads}", data_override(preset, root),
                                        *KINDS[kind], *sets])
    exp = Experiment(cfg)
    model = exp.new_train_model()
    exp.spec.set(model, exp.initial)  # the calibrated start round 1 trains from
    n = min(len(exp.x_train), steps * cfg["federation"]["batch_size"])
    probe = StepProbe(model)
    model.record = kind == "snn"
    try:
        train_local(model, exp.x_train[:n], exp.y_train[:n], cfg, probe, cfg["seed"])
    finally:
        model.record = False
    return probe, model, cfg, exp


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="fedsnn_cifar10_iid")
    p.add_argument("--root", default=None, help="the data set's files (default: the preset's stand-in)")
    p.add_argument("--steps", type=at_least(1), default=12)
    p.add_argument("--kind", choices=sorted(KINDS), default="snn")
    p.add_argument("--threads", type=at_least(1), default=1)
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE (e.g. model.width=1.0, federation.lr=3e-4)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    probe, model, cfg, exp = probe_steps(args.preset, args.root, args.steps, args.kind, args.threads, args.set)
    fed = cfg["federation"]

    print(machine_header("first_steps", f"({args.threads} thread(s))"))
    print(f"\n{args.preset} ({args.kind}), {' '.join(args.set) or 'the preset as it is'}; "
          f"{fed['optimizer']} lr {fed['lr']}, batch {fed['batch_size']}; ln(classes) = "
          f"{math.log(exp.dataset.num_classes):.2f}\n")
    names = list(probe.weights)
    print("weight tensors: " + ", ".join(f"w{i} {name} {tuple(probe.weights[name].shape)}" for i, name in enumerate(names)))
    print("\n| step | loss | logit std | largest relative change (tensor) | relative change of each tensor |"
          + (" firing rate of each spiking layer |" if model.kind == "snn" else ""))
    print("|---|---|---|---|---|" + ("---|" if model.kind == "snn" else ""))
    for step, row in enumerate(probe.rows, 1):
        moved = [row["moved"][name] for name in names]
        top = max(range(len(moved)), key=moved.__getitem__)
        line = (f"| {step} | {row['loss']:.3f} | {row['logit_std']:.2f} | {moved[top]:.3f} (w{top}) | "
                f"{' '.join(f'{m:.3f}' for m in moved)} |")
        if model.kind == "snn":
            line += f" {' '.join(f'{r:.3f}' for r in row['rates'])} |"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))
