#!/usr/bin/env bash
# One-command environment for neurofed (README "Three commands"; docs/getting-started.md).
# Creates .venv with Python 3.11, the local CPU torch wheel, neurofed with its
# dependencies, and lava-nc 0.10.0 + lava-dl 0.6.0, which declare Python <3.11 and
# torch <2.4 and therefore install without their metadata checks (their real
# dependencies are pinned in pyproject.toml). No installed file is edited: the
# runtime fixes live in neurofed/compat.py.
#
# NEUROFED_TORCH=cuda (on a machine with an NVIDIA GPU): the CUDA build of the same
# pinned torch instead of the CPU wheel: torch from pip's default index (pip's config
# files and PIP_FIND_LINKS are ignored for this one install, so a local "+cpu" wheel
# cannot win), or from NEUROFED_TORCH_INDEX (an index URL, e.g. one serving builds for
# another CUDA version); the script stops unless torch then sees a GPU. The default
# (NEUROFED_TORCH=cpu) is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
source scripts/pins.sh  # TORCH_PIN, LAVA_PINS, NORSE_PIN
FLAVOR=${NEUROFED_TORCH:-cpu}
case "$FLAVOR" in
  cpu|cuda) ;;
  *) echo "setup: NEUROFED_TORCH: got '$FLAVOR'; allowed: cpu, cuda" >&2; exit 2 ;;
esac
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
V="$VENV/bin/python -m pip install --quiet"
if [ "$FLAVOR" = cpu ]; then
  $V "$TORCH_PIN"
else
  # a CPU build left by an earlier setup would count as installed: remove it first
  if "$VENV/bin/python" -c "import sys, torch; sys.exit(torch.version.cuda is not None)" 2>/dev/null; then
    "$VENV/bin/python" -m pip uninstall --quiet --yes torch
  fi
  INDEX=()
  [ -n "${NEUROFED_TORCH_INDEX:-}" ] && INDEX=(--index-url "$NEUROFED_TORCH_INDEX")
  # no pip config and no find-links: a local "+cpu" wheel would win over the index's build
  env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null $V --no-cache-dir ${INDEX[@]+"${INDEX[@]}"} "$TORCH_PIN"
  "$VENV/bin/python" -c "
import sys, torch
if torch.version.cuda is None or not torch.cuda.is_available():
    sys.exit(f'setup: NEUROFED_TORCH=cuda: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU; '
             'check the NVIDIA driver, or set NEUROFED_TORCH_INDEX to an index with a matching CUDA build')
print(f'torch {torch.__version__}, CUDA {torch.version.cuda}: {torch.cuda.get_device_name(0)}')"
fi
$V -e ".[dev]"
$V --no-deps --ignore-requires-python "${LAVA_PINS[@]}"
$V --no-deps "$NORSE_PIN"
"$VENV/bin/python" -c "import neurofed.compat as c; c.check_environment()"
# Compile the fused CUBA kernels once now (cached; training falls back to stock SLAYER
# with a warning if this ever fails), with every instruction-set variant this CPU runs
# and the AVX-512 ones it cannot run, emulated (the tests check each against stock SLAYER).
"$VENV/bin/python" -c "from neurofed.kernels import variants as v; assert v.build() is not None, 'the fast kernels did not compile: ' + str(v.error()); [v.build_variant(n) for n in v.runnable_variants() + v.emulated_variants()]"
echo "neurofed environment ready in $VENV (activate: source $VENV/bin/activate)"
