"""One run's export and Lava check redone with every library held below this CPU's
instruction set, compared with a check made natively: is the exported network the same file,
and does Lava give the same spikes and predictions?

    python benchmarks/deploy_isa.py RUN_DIR --isa avx2|sse [--samples 100] [--tie-break voltage]

RUN_DIR must hold a native ``neurofed lava`` result (``lava.json``) and ``model.net``. The run
is copied to a scratch folder. There a child process exports it again and runs ``neurofed lava``
with the limits below (torch's ATen kernels, oneDNN, numpy's dispatch, OpenBLAS and neurofed's
own kernels), and this script compares the two ``model.net`` files dataset by dataset, and the
first ``--samples`` predictions and per-layer spike counts. It prints the ratio of matching
samples against the native run (the baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import at_least, machine_header, with_one_line_errors  # noqa: E402

_AVX512 = "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL"
LIMITS = {  # what each library may use: a CPU of that class
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "NEUROFED_KERNELS": "x86-64-v3",
             "OPENBLAS_CORETYPE": "Haswell", "NPY_DISABLE_CPU_FEATURES": _AVX512},
    "sse": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "NEUROFED_KERNELS": "generic",
            "OPENBLAS_CORETYPE": "Prescott",
            "NPY_DISABLE_CPU_FEATURES": "SSSE3 SSE41 POPCNT SSE42 AVX F16C FMA3 AVX2 " + _AVX512},
}
RUN_FILES = ("config.yaml", "model_best.npz", "model_last.npz", "metrics.jsonl", "summary.json", "partition.json")


def datasets(path: Path) -> dict:
    import h5py

    out = {}

    def keep(name, item):
        if isinstance(item, h5py.Dataset):
            out[name] = np.asarray(item[()])

    with h5py.File(path, "r") as h:
        h.visititems(keep)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--isa", required=True, choices=sorted(LIMITS))
    p.add_argument("--samples", type=at_least(1), default=100)
    p.add_argument("--tie-break", default=None, choices=("lowest_label", "voltage"))
    args = p.parse_args(argv)
    native = args.run_dir / "lava.json"
    if not native.is_file() or not (args.run_dir / "model.net").is_file():
        p.error(f"{args.run_dir}: no lava.json and model.net; run `neurofed lava {args.run_dir}` natively first")
    reference = json.loads(native.read_text())
    if reference["samples"] < args.samples:
        p.error(f"--samples: {args.samples} is more than the native check ran ({reference['samples']})")

    print(machine_header("deploy_isa", f"(libraries held to {args.isa})"))
    with tempfile.TemporaryDirectory() as scratch:
        run = Path(scratch) / "run"
        run.mkdir()
        for name in RUN_FILES:
            if (args.run_dir / name).exists():
                shutil.copy2(args.run_dir / name, run / name)
        env = {**os.environ, "OMP_NUM_THREADS": "1", **LIMITS[args.isa]}
        probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
        print("torch's kernels:", subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                                                  text=True, check=True).stdout.strip())
        cli = "import sys; from neurofed.cli import main; sys.exit(main(sys.argv[1:]))"
        command = [sys.executable, "-c", cli, "lava", str(run), "--samples", str(args.samples),
                   "--workers", "1", "--quiet", *(["--tie-break", args.tie_break] if args.tie_break else [])]
        subprocess.run(command, env=env, check=True)
        held = json.loads((run / "lava.json").read_text())
        mine, theirs = datasets(run / "model.net"), datasets(args.run_dir / "model.net")
    differing = [k for k in theirs if k not in mine or not np.array_equal(mine[k], theirs[k])]
    n = args.samples
    same_pred = np.asarray(held["predictions"]) == np.asarray(reference["predictions"][:n])
    same_spikes = (np.asarray(held["layer_spikes"]) == np.asarray(reference["layer_spikes"][:n])).all(1)
    print(f"model.net: {len(theirs) - len(differing)} of {len(theirs)} datasets bit-identical to the native export"
          + (f"; differing: {', '.join(differing[:8])}" if differing else ""))
    print(f"Lava against torch here: spike for spike {held['spike_for_spike']}, agreement {held['agreement']:.4f}, "
          f"accuracy {held['accuracy']:.4f} (torch {held['torch_accuracy']:.4f}), tie rule {held['tie_break']}")
    print(f"against the native run (baseline), {n} samples: predictions {same_pred.mean():.4f} identical "
          f"(ratio {same_pred.sum()}/{n}), per-layer spike counts {same_spikes.mean():.4f} identical"
          + (f" (differing samples: {np.flatnonzero(~same_spikes).tolist()[:10]})" if not same_spikes.all() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(with_one_line_errors(main))