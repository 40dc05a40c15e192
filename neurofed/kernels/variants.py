"""Compiling the C++ kernels (``csrc/``) once per instruction-set variant.

A variant is a set of compiler flags: on x86-64 the psABI levels (``-march=x86-64-v2``,
``v3`` = AVX2 + FMA, ``v4`` = AVX-512, ``v4+vnni``), never ``-march=native`` (its code
may not run on another CPU sharing the cache folder); ``generic`` is the compiler's
baseline for any machine (the only one on AArch64). Each build is cached under
``~/.cache/neurofed/ext`` (``NEUROFED_EXT_DIR``) by a hash of the sources, the flags
and the torch version. :func:`build` loads the highest variant this CPU runs
(``NEUROFED_KERNELS`` picks another); tests and benchmarks load others with
:func:`build_variant`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import threading
from pathlib import Path

import torch

CSRC = Path(__file__).with_name("csrc")
# No -ffast-math and no FMA contraction: the kernels must round exactly like torch.
CFLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-fno-fast-math"]
VARIANTS = {
    "generic": [],
    "x86-64-v2": ["-march=x86-64-v2"],
    "x86-64-v3": ["-march=x86-64-v3"],
    "x86-64-v4": ["-march=x86-64-v4", "-mprefer-vector-width=512"],
    "x86-64-v4+vnni": ["-march=x86-64-v4", "-mavx512vnni", "-mprefer-vector-width=512"],
}
# Test variants: the AVX-512 half of csrc/simd.h built for a CPU without AVX-512, its
# intrinsics emulated by SIMDe (the dev extra cmeel-simde, or Debian's libsimde-dev), so
# the tests check that source against stock SLAYER on any machine (slower than generic;
# never a default). Each stands in for the native variant it names.
EMULATED = {
    "x86-64-v4-simde": ("x86-64-v4", ["-DV16_SIMDE_AVX512", "-Wno-psabi"]),
    "x86-64-v4+vnni-simde": ("x86-64-v4+vnni", ["-DV16_SIMDE_AVX512", "-DV16_SIMDE_AVX512VNNI", "-Wno-psabi"]),
}
# On x86 without AVX, GCC spilled the emulation's 8-byte vector pieces to MMX registers
# (no emms after them): long double arithmetic later in the process returned NaN
# (numpy's SVD in another test). No MMX in an emulated build.
_X86_EMULATED = ["-mno-mmx"]
# /proc/cpuinfo flags each x86-64 variant adds to the one before (gcc's definition of the levels)
_X86_LEVELS = [
    ("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}),
    ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe"}),
    ("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
    ("x86-64-v4+vnni", {"avx512_vnni"}),
]

_lock = threading.Lock()
_built: dict = {}  # variant -> extension module
_ext = None  # what build() loaded
_error: str | None = None
variant: str | None = None  # the variant build() loaded


def runnable_variants() -> list[str]:
    """The variants this CPU can execute, lowest first ("generic" always)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["generic"]
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = set(next((ln.split(":", 1)[1].split() for ln in fh if ln.startswith("flags")), []))
    except OSError:  # not Linux: torch's own CPU probe
        levels = {"AVX2": 2, "AVX512": 3}.get(torch.backends.cpu.get_cpu_capability(), 0)
        return ["generic"] + [name for name, _ in _X86_LEVELS[:levels]]
    out = ["generic"]
    for name, needs in _X86_LEVELS:
        if not needs <= flags:
            break
        out.append(name)
    return out


def emulated_variants() -> list[str]:
    """The emulated AVX-512 variants to test here: those whose native variant this CPU
    cannot run."""
    runnable = runnable_variants()
    return [name for name, (native, _) in EMULATED.items() if native not in runnable]


def _simde_include() -> list[str]:
    """The include flag for SIMDe's headers: the cmeel-simde wheel's, else none (a
    system copy, /usr/include/simde); raises if neither is installed."""
    from importlib import metadata

    try:
        root = metadata.distribution("cmeel-simde").locate_file("cmeel.prefix/include")
        if (Path(root) / "simde").is_dir():
            return [f"-I{root}"]
    except metadata.PackageNotFoundError:
        pass
    if Path("/usr/include/simde").is_dir():
        return []
    raise RuntimeError("the emulated AVX-512 variants need SIMDe's headers: pip install cmeel-simde "
                       "(neurofed's dev extra) or apt-get install libsimde-dev")


def _flags(name: str, x86: bool | None = None) -> list[str]:
    """The compiler flags of a variant (``x86``: the target is x86; default: this machine)."""
    if name in EMULATED:
        if x86 is None:
            x86 = platform.machine() in ("x86_64", "AMD64")
        return CFLAGS + EMULATED[name][1] + (_X86_EMULATED if x86 else []) + _simde_include()
    return CFLAGS + VARIANTS[name]


def _check_name(name: str, caller: str) -> None:
    if name not in VARIANTS and name not in EMULATED:
        raise ValueError(f"kernels.{caller}: variant={name!r}; allowed: {', '.join([*VARIANTS, *EMULATED])}")


def default_variant() -> str:
    """``NEUROFED_KERNELS`` if set, else the highest variant this CPU runs."""
    forced = os.environ.get("NEUROFED_KERNELS")
    if forced:
        if forced not in VARIANTS:
            raise ValueError(f"NEUROFED_KERNELS={forced!r}; allowed: {', '.join(VARIANTS)}")
        return forced
    return runnable_variants()[-1]


def _module_name(name: str) -> str:
    h = hashlib.sha1()
    for path in sorted(CSRC.iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(" ".join(_flags(name) + [torch.__version__]).encode())
    return f"neurofed_kernels_{name.replace('-', '').replace('+', '_')}_{h.hexdigest()[:12]}"


def build_variant(name: str, verbose: bool = False):
    """Compile (or load the cached) extension of one variant; raises if it cannot be
    built. A variant the CPU cannot run may be built (to check it compiles), not called;
    an emulated one (:data:`EMULATED`) runs anywhere."""
    _check_name(name, "build_variant")
    with _lock:
        if name not in _built:
            from torch.utils.cpp_extension import load

            module = _module_name(name)
            root = os.environ.get("NEUROFED_EXT_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "neurofed",
                                                                      "ext")
            folder = os.path.join(root, module)
            os.makedirs(folder, exist_ok=True)
            _built[name] = load(name=module, sources=[str(CSRC / "module.cpp")], extra_cflags=_flags(name),
                                extra_include_paths=[str(CSRC)], extra_ldflags=["-fopenmp"], build_directory=folder,
                                verbose=verbose)
        return _built[name]


def compile_check(name: str, cxx: str = "g++", out_dir: str | None = None) -> str:
    """Compile the kernels (not the Python bindings) of one variant to an object file
    with ``cxx`` (e.g. a cross-compiler: ``aarch64-linux-gnu-g++`` with ``name="generic"``)
    and return its path; raises CalledProcessError with the compiler's message. Checks a
    variant this machine cannot build or run."""
    import subprocess
    import tempfile

    from torch.utils.cpp_extension import include_paths

    _check_name(name, "compile_check")
    out = os.path.join(out_dir or tempfile.mkdtemp(prefix="neurofed-kernels-"), f"kernels-{name}.o")
    source = "".join(f'#include "{h}"\n' for h in ("neuron.h", "synapse.h", "vnni.h", "pool.h"))
    cmd = [cxx, "-std=c++17", "-x", "c++", "-", "-c", "-o", out, f"-I{CSRC}", *(f"-I{p}" for p in include_paths()),
           *_flags(name, x86=subprocess.run([cxx, "-dumpmachine"], capture_output=True, text=True,
                                             check=True).stdout.startswith(("x86_64", "i686")))]
    subprocess.run(cmd, input=source, text=True, check=True, capture_output=True)
    return out


def build(verbose: bool = False):
    """The extension for :func:`default_variant` (compiled on first use, about half a
    minute), or None if it cannot be built (:func:`error` says why)."""
    global _ext, _error, variant
    if _ext is None and _error is None:
        try:
            name = default_variant()
            _ext, variant = build_variant(name, verbose=verbose), name
        except Exception as exc:  # no compiler, no headers, ...
            msg = str(exc).strip().splitlines()
            _error = f"{type(exc).__name__}: {msg[-1] if msg else ''}"
    return _ext


def error() -> str | None:
    """Why :func:`build` returned None (None if it did not)."""
    return _error


def is_available() -> bool:
    """True if the C++ extension is (or can be) built."""
    return build() is not None
