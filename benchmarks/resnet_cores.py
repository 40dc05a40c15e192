"""Loihi 2 cores and chips of the SFedHIFI ResNet-18 presets' networks at full width.

Each ``examples/papers/sfedhifi_cifar*`` preset's model, built at ``model.width: 1.0`` for its
data set's input (3x32x32) and classes, is sized by the hardware check of
``hw_profiles/loihi2.yaml`` on the Lava graph that ``neurofed.deploy.lava_graph`` wires
(each layer on whole cores; a residual join's shortcut synapses counted with its own).
Sized as it would be mapped: the spiking global pool (``model.global_pool: spikes``) and a
spiking output layer stand for the preset's analog pool and voltage readout, and batch norm
folded into the weights adds no neurons or synapses (``model.norm: none``). No training, no
data: the counts depend on the shapes only.

    python benchmarks/resnet_cores.py            # one row per preset, then a RESULT line
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CLASSES = {"cifar10": 10, "cifar100": 100}
MAPPED = {"global_pool": "spikes", "readout": "spikes", "norm": "none", "width": 1.0}


def main() -> int:
    import yaml

    from neurofed.config import DEFAULTS
    from neurofed.deploy.constraints import hardware_use
    from neurofed.models import build_model

    totals = {}
    print("preset                      model           layers   neurons    synapses  cores  chips  largest layer")
    for path in sorted((ROOT / "examples" / "papers").glob("sfedhifi_cifar*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        if "resnet18" not in cfg["model"]["name"]:
            continue
        model_cfg = {**DEFAULTS["model"], **cfg["model"], **MAPPED}
        model = build_model(model_cfg, (3, 32, 32), CLASSES[cfg["data"]["name"]])
        use = hardware_use(model, timesteps=cfg["data"]["timesteps"])
        big = max(use["layers"], key=lambda l: l.cores)
        print(f"{path.stem:<27} {model_cfg['name']:<15} {len(use['layers']):>6} {use['neurons']:>9,} "
              f"{use['synapses']:>11,} {use['cores']:>6} {use['chips']:>6}  {big.index} ({big.kind} "
              f"{'x'.join(map(str, big.shape))}: {big.cores} cores)")
        totals[path.stem] = (use["cores"], use["chips"])
    print("RESULT name=resnet_cores " + " ".join(f"{k}={c}cores/{n}chips" for k, (c, n) in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
