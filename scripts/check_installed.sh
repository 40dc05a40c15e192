#!/usr/bin/env bash
# neurofed as a user installs it (CI, after `make test`): build the wheel, install it into a
# fresh virtual environment with the same pinned dependencies as `make setup` (pyproject.toml's,
# and scripts/pins.sh's torch, --no-deps lava-nc/lava-dl and norse), then, from an empty folder
# and with an empty kernel cache, check what a user does first:
#   - the fast kernels compile from the installed C++ sources;
#   - the digits job (2 rounds) and an energy report on it;
#   - a paper preset by name, its first round, on its stand-in data set;
#   - `neurofed --version` and the run's stamp agree.
# Nothing of the checkout is on the path there: a file the wheel lacks fails the check.
# Leaves its folder behind only when it fails (the path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pins.sh  # TORCH_PIN, LAVA_PINS, NORSE_PIN
PY=${PYTHON:-python3.11}
BUILD_PY=${BUILD_PY:-.venv/bin/python}  # any Python with pip builds the wheel (setuptools comes isolated)
export PIP_DISABLE_PIP_VERSION_CHECK=1 MPLBACKEND=Agg FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/neurofed-installed.XXXXXX")
trap 'status=$?; if [ $status -eq 0 ]; then rm -rf "$WORK"; else echo "check_installed: FAILED (exit $status); kept $WORK" >&2; fi' EXIT
start=$SECONDS
say() { echo "check_installed: $* ($((SECONDS - start)) s)"; }

# pip builds in the source folder (build/, *.egg-info): build from a copy, leaving the checkout as it is
mkdir "$WORK/src"
cp -a pyproject.toml README.md MANIFEST.in CHANGELOG.md neurofed hw_profiles examples notebooks "$WORK/src/"
"$BUILD_PY" -m pip wheel "$WORK/src" --no-deps --quiet -w "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/neurofed-*.whl)
say "built $(basename "$WHEEL")"

"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin/python -m pip install --quiet"
$V "$TORCH_PIN"
$V "$WHEEL"
$V --no-deps --ignore-requires-python "${LAVA_PINS[@]}"
$V --no-deps "$NORSE_PIN"
say "installed into a fresh venv"

mkdir "$WORK/empty" "$WORK/ext"
cd "$WORK/empty"
unset PYTHONPATH
export NEUROFED_EXT_DIR="$WORK/ext" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
VPY="$WORK/venv/bin/python"
NF="$WORK/venv/bin/neurofed"
"$VPY" - "$WORK/venv" <<'EOF'
import sys
from pathlib import Path

import neurofed
from neurofed.kernels import variants
from neurofed.resources import examples_dir, profiles_dir

venv = Path(sys.argv[1]).resolve()
for what, path in (("neurofed", Path(neurofed.__file__)), ("profiles", profiles_dir()), ("examples", examples_dir()),
                   ("kernel sources", variants.csrc())):
    assert venv in path.resolve().parents, f"{what} not from the installed wheel: {path}"
assert variants.build() is not None, f"the fast kernels did not compile: {variants.error()}"
print(f"kernels: {variants.variant} compiled from {variants.csrc()}")
EOF
say "kernels compiled from the installed sources"

"$NF" presets > presets.txt 2>/dev/null
grep -q "^sfedca_mnist_dir03 .*SFedCA" presets.txt
"$NF" run digits_fedavg --set federation.rounds=2 --set lava.samples=10 --out digits
"$NF" energy-report digits --out energy-report > /dev/null
ls energy-report/*.md > /dev/null
say "digits job (2 rounds) and its energy report"

"$NF" run sfedca_mnist_dir03 --set data.name=standin_mnist --set data.train_subset=400 --set data.test_subset=200 \
  --set partition.num_clients=4 --set federation.clients_per_round=2 --set algorithm.candidates=3 \
  --set federation.local_epochs=1 --set federation.rounds=1 --set energy.enabled=false --set export=false \
  --set federation.target_accuracy=null --out preset
say "preset sfedca_mnist_dir03 by name: its first round on standin_mnist"

"$VPY" - <<'EOF'
import json
import subprocess
import sys
from pathlib import Path

line = subprocess.run([str(Path(sys.executable).with_name("neurofed")), "--version"], capture_output=True, text=True,
                      check=True).stdout
stamp = json.load(open("digits/summary.json"))["environment"]["neurofed"]
assert line.startswith(f"neurofed {stamp};"), (line, stamp)
print(f"version: {stamp} (neurofed --version and summary.json agree)")
EOF
say "passed"
