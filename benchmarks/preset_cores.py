"""Loihi 2 cores and chips each paper preset's network needs at full width.

Each ``examples/papers/*.yaml`` preset's model, built at ``model.width: 1.0`` for its data
set's input and classes, is folded as export and the Lava check fold it
(:func:`neurofed.deploy.deployable.deployable_copy`: batch norm into weights and biases, an
analog global pool into the voltage readout, factorized kernels fused) and sized by the
hardware check of ``hw_profiles/loihi2.yaml`` (each layer on whole cores; a residual join's
shortcut synapses counted with its own). No training, no data: the counts depend on the
shapes only, so presets that share a model and input share a row.

    python benchmarks/preset_cores.py [--save]   # one row per network, then RESULT lines
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [p for p in (str(ROOT), str(ROOT / "benchmarks")) if p not in sys.path]
from common import Report, machine_header, with_one_line_errors  # noqa: E402


def main(argv=None) -> int:
    import yaml

    from neurofed.config import DEFAULTS
    from neurofed.data.image_formats import IMAGE_SETS  # each paper data set's shape and classes
    from neurofed.deploy.constraints import hardware_use
    from neurofed.deploy.deployable import deployable_copy
    from neurofed.models import build_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", action="store_true", help="write benchmarks/results/preset_cores.txt")
    args = ap.parse_args(argv)
    rep = Report()
    rep.emit(machine_header("preset_cores"))
    rep.emit("# command: python benchmarks/preset_cores.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    groups: dict[tuple, list[str]] = {}
    for path in sorted((ROOT / "examples" / "papers").glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        key = (cfg["model"]["name"], cfg["data"]["name"], cfg["data"]["timesteps"], yaml.safe_dump(cfg["model"]))
        groups.setdefault(key, []).append(path.stem)
    rep.emit("model           data           T  spiking layers    neurons       synapses  cores  chips  "
             "largest layer  presets")
    for (name, data, timesteps, model_yaml), stems in groups.items():
        shape, classes = IMAGE_SETS[data].shape, IMAGE_SETS[data].num_classes
        model_cfg = {**DEFAULTS["model"], **yaml.safe_load(model_yaml), "width": 1.0}
        use = hardware_use(deployable_copy(build_model(model_cfg, shape, classes)), timesteps=timesteps)
        big = max(use["layers"], key=lambda l: l.cores)
        rep.emit(f"{name:<15} {data:<13} {timesteps:>3} {len(use['layers']):>14} {use['neurons']:>10,} "
                 f"{use['synapses']:>14,} {use['cores']:>6} {use['chips']:>6}  {big.index} ({big.kind} "
                 f"{'x'.join(map(str, big.shape))}: {big.cores})  {', '.join(stems)}")
        rep.emit(f"RESULT name=preset_cores model={name} data={data} cores={use['cores']} chips={use['chips']} "
                 f"neurons={use['neurons']} presets={len(stems)}")
    if args.save:
        rep.save("preset_cores")
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))