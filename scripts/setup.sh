#!/usr/bin/env bash
# One-command environment for neurofed (see README "Set up").
# Creates .venv with Python 3.11, the local CPU torch wheel, neurofed with its
# dependencies, and lava-nc 0.10.0 + lava-dl 0.6.0, which declare Python <3.11 and
# torch <2.4 and therefore install without their metadata checks (their real
# dependencies are pinned in pyproject.toml). No installed file is edited: the
# runtime fixes live in neurofed/compat.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
VENV=${VENV:-.venv}
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
V="$VENV/bin/python -m pip install --quiet"
# torch first and pinned: an unpinned torch pulls several GB of CUDA wheels.
$V "torch==2.13.0"
$V -e ".[dev]"
$V --no-deps --ignore-requires-python "lava-nc==0.10.0" "lava-dl==0.6.0"
"$VENV/bin/python" -c "import neurofed.compat as c; c.check_environment()"
# Compile the fused CUBA kernels once now (cached; training falls back to stock SLAYER
# with a warning if this ever fails), with every instruction-set variant this CPU runs
# (the tests check each against stock SLAYER).
"$VENV/bin/python" -c "import neurofed.models.fast_cuba as f; assert f.build() is not None, 'fast CUBA kernels did not compile: ' + str(f._ext_error); [f.build_variant(v) for v in f.runnable_variants()]"
echo "neurofed environment ready in $VENV (activate: source $VENV/bin/activate)"
