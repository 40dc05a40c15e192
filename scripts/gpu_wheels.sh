#!/usr/bin/env bash
# Wheels for a GPU machine without a package registry (Python 3.12, torch with CUDA and
# numpy 2 already installed there): what neurofed's GPU benchmark and GPU tests need
# besides torch and numpy. Run it here (with registry access) and carry the folders over.
#
#   bash scripts/gpu_wheels.sh [DIR]        # default DIR: dist/gpu-wheels
#
# DIR/bench (~30 MB): benchmarks/gpu_throughput.py — lava-dl (SLAYER), which imports
#   matplotlib and h5py; pyyaml (neurofed's config), tqdm (the runner); ninja (SLAYER
#   compiles its CUDA kernels with torch's cpp_extension at first use); neurofed.
# DIR/tests (~2 MB): pytest and pytest-timeout for the gpu-marked tests (they use random
#   images, not the embedded digits, so no scikit-learn is needed for them).
# On the GPU machine, from the repository root, `bash scripts/gpu_check.sh` installs them
# (from dist/gpu-wheels, or NEUROFED_GPU_WHEELS=DIR) and measures everything; by hand
# (torch and numpy stay as they are):
#   python -m pip install --no-index --no-deps --ignore-requires-python DIR/bench/*.whl
#   python benchmarks/gpu_throughput.py --save
#   python -m pip install --no-index --no-deps DIR/tests/*.whl
#   python -m pytest -q -m gpu tests/test_device.py
# (--ignore-requires-python: lava-dl declares Python <3.11, neurofed 3.11.) Running from
# the repository root uses the source tree; the neurofed wheel is for elsewhere.
# Binary wheels are CPython 3.12 manylinux x86_64 builds at versions built for numpy 2.
# lava-dl's wheel is repacked without its tests and the trained YOLO weights of its
# object-detection examples (67 of its 68 MB; neurofed uses neither), so that each
# folder stays small enough to carry (64 MiB). lava-nc, tonic, flwr, librosa, tensorly
# and scikit-learn are not needed for the benchmark or the gpu-marked tests (the rest of
# the suite needs them: not carried here).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-dist/gpu-wheels}
PY=${PYTHON:-python3}
mkdir -p "$OUT/bench" "$OUT/tests"
export PIP_DISABLE_PIP_VERSION_CHECK=1
BIN=(--quiet --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312
     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
"$PY" -m pip download "${BIN[@]}" -d "$OUT/bench" "pyyaml>=6" "tqdm>=4.60" "h5py>=3.11" "matplotlib>=3.9" ninja
"$PY" -m pip download "${BIN[@]}" -d "$OUT/tests" "pytest>=8" pytest-timeout
"$PY" -m pip download --quiet --no-deps --ignore-requires-python -d "$OUT/bench" "lava-dl==0.6.0"
"$PY" -m pip wheel --quiet --no-deps -w "$OUT/bench" .
"$PY" - "$OUT/bench" <<'EOF'
import base64, glob, hashlib, os, re, sys, zipfile

# lava-dl without tests/ and object_detection/models/Trained_*/ (RECORD rewritten to match)
drop = re.compile(r"^(tests/|lava/lib/dl/slayer/object_detection/models/Trained_)")
(src,) = glob.glob(os.path.join(sys.argv[1], "lava_dl-*.whl"))
tmp = src + ".tmp"
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
    record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    rows = []
    for info in zin.infolist():
        if drop.match(info.filename) or info.filename == record_name:
            continue
        data = zin.read(info)
        zout.writestr(info, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{info.filename},sha256={digest},{len(data)}")
    zout.writestr(record_name, "\n".join(rows + [f"{record_name},,"]) + "\n")
os.replace(tmp, src)
EOF
# each folder: only what the other does not hold; never numpy or torch (the machine's own)
for f in "$OUT"/tests/*.whl; do
  [ -e "$OUT/bench/$(basename "$f")" ] && rm -f "$f"
done
rm -f "$OUT"/*/numpy-*.whl "$OUT"/*/torch-*.whl "$OUT"/*/nvidia_*.whl "$OUT"/*/triton-*.whl
du -sh "$OUT"/bench "$OUT"/tests
