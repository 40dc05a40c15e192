#!/usr/bin/env bash
# Every GPU figure of neurofed's GPU path, from one command (at most ~8 minutes on one H100).
#
#   bash scripts/gpu_check.sh                 # on the GPU machine, from a checkout of this repository
#   bash scripts/gpu_check.sh --cpu-smoke     # anywhere: the same steps, tiny, on the CPU
#
# Needs: Python with a CUDA build of torch (which brings Triton) and numpy, the CUDA toolkit's
# nvcc and a C++ compiler (SLAYER compiles its CUDA kernels at first use). No package
# registry: the other packages come from wheels built beforehand, on a machine with one, by
#   bash scripts/gpu_wheels.sh                # -> dist/gpu-wheels/{bench,tests}
# and carried over with the checkout (they are installed from there if missing; set
# NEUROFED_GPU_WHEELS to use another folder).
#
# Steps (each with its own time limit, so one hung step cannot eat the rest):
#   1. environment: torch, CUDA, the GPU, nvcc; the carried wheels if neurofed's needs are missing
#   2. build: SLAYER's CUDA kernels (JIT) and neurofed's Triton kernel, once
#   3. the gpu-marked tests (SLAYER's arch list and threshold on this GPU, Triton kernels
#      against the CPU kernel, CUDA runs)
#   4. benchmarks/gpu_throughput.py, one part per run: spikes CPU vs CUDA (digits CNN 8-bit,
#      S-VGG9 float and 8-bit; SLAYER's CUDA neurons and neurofed's Triton ones), training
#      throughput of stock SLAYER vs neurofed side by side (digits CNN; S-VGG9 T=20 batch
#      64), one FedSNN CIFAR-10 round (random stand-in data; two rounds, the first warms up)
# Figures go to benchmarks/results/gpu/ (or $1 after the options: --out DIR); the last lines
# printed are RESULT lines, one per figure, and a RESULT line per step saying ok or FAILED.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2

PY=${PYTHON:-python3}
WHEELS=${NEUROFED_GPU_WHEELS:-dist/gpu-wheels}
OUT=benchmarks/results/gpu
MODE=gpu
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu-smoke) MODE=cpu ;;
    --out) OUT=${2:?--out needs a folder}; shift ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option '$1'; allowed: --cpu-smoke, --out DIR, --help" >&2; exit 2 ;;
  esac
  shift
done
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's neurofed, not an installed one
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p "$OUT"
LOG="$OUT/gpu_check_$MODE.log"
: > "$LOG"
STATUS=()
say() { echo "gpu_check: $*" | tee -a "$LOG"; }

# run NAME SECONDS CMD...: one step, its output to the terminal and the log, its verdict kept
run() {
  local name=$1 limit=$2 t0 rc
  shift 2
  say "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then
    STATUS+=("step $name: ok in $(( $(date +%s) - t0 )) s")
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    STATUS+=("step $name: FAILED (over its ${limit} s limit)")
  else
    STATUS+=("step $name: FAILED (exit $rc)")
  fi
  return 0
}

# ---------------------------------------------------------------------------- 1. environment
if ! "$PY" -c "import torch" 2>/dev/null; then
  say "no torch for $PY (set PYTHON=/path/to/python with torch installed)"; exit 2
fi
if [ "$MODE" = gpu ]; then
  if ! "$PY" -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
    say "torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)') sees no CUDA GPU;" \
        "run on a GPU machine with a CUDA build of torch (or --cpu-smoke)"
    exit 2
  fi
  command -v nvcc >/dev/null || say "warning: nvcc not on PATH: SLAYER's CUDA kernels cannot compile (add the CUDA toolkit's bin/)"
fi
# The carried wheels go to a folder of their own (no system site-packages touched, no
# "externally managed" refusal); it leads PYTHONPATH and its bin/ (ninja) PATH.
case "$WHEELS" in /*) ;; *) WHEELS="$PWD/$WHEELS" ;; esac
SITE="$WHEELS/site"
export PYTHONPATH="$SITE:$PYTHONPATH" PATH="$SITE/bin:$PATH"
need_bench="import yaml, tqdm, h5py, matplotlib, ninja; from neurofed.compat import slayer; slayer()"
if ! "$PY" -c "$need_bench" 2>/dev/null; then
  if [ -d "$WHEELS/bench" ]; then
    say "installing the carried wheels from $WHEELS/bench into $SITE (no registry needed)"
    # (not the neurofed wheel: this checkout is what runs)
    find "$WHEELS/bench" -name '*.whl' ! -name 'neurofed-*' -print0 |
      xargs -0 "$PY" -m pip install --quiet --no-index --no-deps --ignore-requires-python --upgrade --target "$SITE" \
      2>&1 | tee -a "$LOG"
  fi
  "$PY" -c "$need_bench" || { say "missing packages and no wheels in $WHEELS/bench: run scripts/gpu_wheels.sh where a registry is reachable and carry $WHEELS here"; exit 2; }
fi
if ! "$PY" -c "import pytest, pytest_timeout" 2>/dev/null && [ -d "$WHEELS/tests" ]; then
  "$PY" -m pip install --quiet --no-index --no-deps --upgrade --target "$SITE" "$WHEELS"/tests/*.whl 2>&1 | tee -a "$LOG"
fi
"$PY" - <<'EOF' 2>&1 | tee -a "$LOG"
import shutil, subprocess, torch
from neurofed.compat import slayer
from neurofed.gpu import cuba_triton, slayer_cuda
slayer()
line = f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}"
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    line += f"; {p.name} (capability {p.major}.{p.minor}, {p.total_memory / 2**30:.0f} GiB)"
    line += f"; SLAYER's CUDA kernels built for {slayer_cuda.current_arch_list()}"
line += f"; Triton {'available' if cuba_triton.available() else 'MISSING'}"
nvcc = shutil.which("nvcc")
if nvcc:
    line += "; " + subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
print("gpu_check: environment:", line)
EOF

# ---------------------------------------------------------------------------- 2. builds, tests
# Limits in seconds, for one H100 (sum 470 s); the CPU smoke test gets six times as long.
K=1; [ "$MODE" = cpu ] && K=6
DEV=cuda; SMALL=(); [ "$MODE" = cpu ] && DEV=cpu && SMALL=(--small)
# SLAYER's CUDA kernels JIT-compile at first use (ninja + nvcc, about a minute), Triton's at
# first launch: both done here once, so that no later step is killed inside a build (a
# killed torch build leaves a lock that the next build would wait on)
run build $((150 * K)) "$PY" - "$DEV" <<'EOF'
import sys, time, torch
from neurofed import kernels
from neurofed.compat import slayer
from neurofed.gpu import cuba_triton
dev = torch.device(sys.argv[1])
t0 = time.time()
kernels.enable()
cuba = slayer().block.cuba
p = {"threshold": 1.25, "current_decay": 0.25, "voltage_decay": 0.03}
conv, dense = cuba.Conv(p, 2, 4, 3, padding=1, delay_shift=True).to(dev), cuba.Dense(p, 4 * 8 * 8, 3).to(dev)
for triton in (False, True):
    cuba_triton.configure(triton and cuba_triton.available())
    x = (torch.rand(2, 2, 8, 8, 5, device=dev) < 0.5).float()
    dense(conv(x).flatten(1, 3)).sum().backward()
print(f"build: SLAYER's CUDA kernels and the Triton CUBA kernel ready in {time.time() - t0:.1f} s"
      if dev.type == "cuda" else "build: CPU kernels ready")
EOF
if [ "$MODE" = gpu ]; then
  # (not the small benchmark run of test_device: step 4 runs the benchmark itself)
  run gpu-tests $((60 * K)) "$PY" -m pytest -q -p no:cacheprovider -m gpu -k "not benchmark" \
    tests/test_gpu_slayer_cuda.py tests/test_gpu_triton.py tests/test_gpu_rng.py tests/test_device.py
else
  # no GPU: the CPU-checkable tests of the same files (fake capabilities, interpreted Triton)
  run cpu-tests $((60 * K)) "$PY" -m pytest -q -p no:cacheprovider -m "not slow" \
    tests/test_gpu_slayer_cuda.py tests/test_gpu_triton.py tests/test_gpu_rng.py
fi

# ---------------------------------------------------------------------------- 3. figures
# one part per run, each saved when it ends: $OUT/gpu_throughput_<cuda|cpu>_<part>.{txt,json}
B=(benchmarks/gpu_throughput.py --device "$DEV" ${SMALL[@]+"${SMALL[@]}"} --save --out "$OUT")
run spikes $((70 * K)) "$PY" "${B[@]}" --skip throughput,round
run throughput $((70 * K)) "$PY" "${B[@]}" --skip spikes,round --batches "$([ "$MODE" = cpu ] && echo 2 || echo 64)" \
  --repeat 3
run round $((120 * K)) "$PY" "${B[@]}" --skip spikes,throughput

# ---------------------------------------------------------------------------- summary
echo | tee -a "$LOG"
grep -h '^RESULT ' "$LOG" | awk '!seen[$0]++' > "$OUT/gpu_check_$MODE.results" || true
cat "$OUT/gpu_check_$MODE.results"
failed=0
for s in "${STATUS[@]}"; do
  echo "RESULT $s" | tee -a "$LOG"
  case "$s" in *FAILED*) failed=1 ;; esac
done
echo "RESULT log: $LOG; figures: $OUT/" | tee -a "$LOG"
exit $failed
