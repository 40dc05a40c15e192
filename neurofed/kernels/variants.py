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

import fcntl
import functools
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import socket
import sys
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent  # csrc/ beside it, except in a Flower app bundle: csrc()
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


@functools.lru_cache(maxsize=1)
def csrc() -> Path:
    """The C++ sources: ``csrc/`` beside this file, or, when this package was loaded from
    a Flower app bundle (FAB), that of the neurofed installed on this machine whose
    ``kernels/*.py`` equal these. A FAB holds no C++: flwr 1.41 ships only .py, .toml,
    .md, .yaml, .yml, .json and .jsonl files, and refuses others in ``fab-include``."""
    from neurofed.resources import kernel_sources

    if (kernel_sources() / "module.cpp").is_file():  # package data: in a checkout, a wheel and an sdist
        return kernel_sources()
    ours = {p.name: p.read_bytes() for p in HERE.glob("*.py")}
    looked = []
    for kernels in _installed_kernels():
        looked.append(str(kernels))
        if kernels != HERE and (kernels / "csrc" / "module.cpp").is_file() and \
                {p.name: p.read_bytes() for p in kernels.glob("*.py")} == ours:
            return kernels / "csrc"
    raise FileNotFoundError(f"no C++ sources for the fast kernels: {HERE / 'csrc'} is missing (a Flower app bundle "
                            f"carries none) and no installed neurofed has these kernels (looked in: "
                            f"{', '.join(looked) or 'nothing found'}); install neurofed from the app's code on this "
                            f"machine, or set federation.fast_kernels: false")


def _installed_kernels() -> list[Path]:
    """``neurofed/kernels`` folders other than this one: on ``sys.path``, then where pip
    installed neurofed (an editable install's project, or site-packages)."""
    found = [Path(entry or ".").resolve() / "neurofed" / "kernels" for entry in sys.path]
    try:
        from importlib import metadata

        dist = metadata.distribution("neurofed")
        url = json.loads(dist.read_text("direct_url.json") or "{}").get("url", "")
        if url.startswith("file://"):
            found.append(Path(url[len("file://"):]) / "neurofed" / "kernels")
        found.append(Path(dist.locate_file("neurofed/kernels")).resolve())
    except (ImportError, ValueError, OSError):
        pass
    return [k for i, k in enumerate(found) if k.is_dir() and k not in found[:i]]


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
    for path in sorted(csrc().iterdir()):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    h.update(" ".join(_flags(name) + [torch.__version__]).encode())
    return f"neurofed_kernels_{name.replace('-', '').replace('+', '_')}_{h.hexdigest()[:12]}"


def ext_root() -> Path:
    """The build cache: ``NEUROFED_EXT_DIR``, else ``~/.cache/neurofed/ext``."""
    return Path(os.environ.get("NEUROFED_EXT_DIR") or Path.home() / ".cache" / "neurofed" / "ext")


def build_variant(name: str, verbose: bool = False):
    """Compile (or load the cached) extension of one variant; raises if it cannot be
    built. A variant the CPU cannot run may be built (to check it compiles), not called;
    an emulated one (:data:`EMULATED`) runs anywhere.

    A variant already built (its ``built.json`` names this module, i.e. these sources,
    flags and torch, and the library file it describes) loads without any lock. Only a
    build takes one (:class:`BuildLock`: an OS lock that ends with its holder), in a
    fresh ``build-<pid>`` folder, and moves the finished library into place: a build
    killed midway leaves no library that looks built, and the next load rebuilds."""
    _check_name(name, "build_variant")
    with _lock:
        if name not in _built:
            _built[name] = _load_or_build(name, verbose)
        return _built[name]


def _load_or_build(name: str, verbose: bool):
    module = _module_name(name)
    folder = ext_root() / module
    ext = _load_built(module, folder)
    if ext is not None:
        return ext
    folder.mkdir(parents=True, exist_ok=True)
    with BuildLock(folder / "build.lock"):
        ext = _load_built(module, folder)  # built by the process we waited for
        if ext is not None:
            return ext
        for stale in folder.glob("build-*"):  # killed builds' folders (no builder is left: we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        from torch.utils.cpp_extension import load

        work = folder / f"build-{os.getpid()}"
        work.mkdir()
        print(f"neurofed.kernels: compiling the {name} kernels into {folder} (once per variant and source "
              f"version; about 30 s on an idle machine)", file=sys.stderr, flush=True)
        ext = load(name=module, sources=[str(csrc() / "module.cpp")], extra_cflags=_flags(name),
                   extra_include_paths=[str(csrc())], extra_ldflags=["-fopenmp"], build_directory=str(work),
                   verbose=verbose)
        library = folder / f"{module}{LIBRARY_SUFFIX}"
        os.replace(work / library.name, library)
        _write_stamp(module, folder, library)
        shutil.rmtree(work, ignore_errors=True)
        return ext


# torch's cpp_extension links a Python extension as <name>.so (Linux and macOS).
LIBRARY_SUFFIX = ".so"
STAMP = "built.json"


def _write_stamp(module: str, folder: Path, library: Path) -> None:
    st = library.stat()
    tmp = folder / f"{STAMP}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"module": module, "size": st.st_size, "mtime_ns": st.st_mtime_ns}))
    os.replace(tmp, folder / STAMP)


def _ninja_finished(folder: Path, library: Path) -> bool:
    """A build folder of the earlier code (torch's ``load`` in place): ninja's log
    lists the library with the very mtime it has, which ninja writes only after the
    link command succeeded."""
    try:
        lines = (folder / ".ninja_log").read_text().splitlines()
        mtime = library.stat().st_mtime_ns
    except OSError:
        return False
    return any(f.count("\t") == 4 and f.split("\t")[3] == library.name and f.split("\t")[2] == str(mtime)
               for f in lines)


def _load_built(module: str, folder: Path):
    """The extension module if ``folder`` holds its finished build, else None (no lock)."""
    library = folder / f"{module}{LIBRARY_SUFFIX}"
    try:
        stamp = json.loads((folder / STAMP).read_text())
        st = library.stat()
        built = (stamp.get("module"), stamp.get("size"), stamp.get("mtime_ns")) == (module, st.st_size,
                                                                                    st.st_mtime_ns)
    except (OSError, ValueError, AttributeError):
        built = False
    if not built:
        if not _ninja_finished(folder, library):
            return None
        try:
            _write_stamp(module, folder, library)  # adopted: later loads read the stamp
        except OSError:  # a read-only cache: ninja's log says the same next time
            pass
    spec = importlib.util.spec_from_file_location(module, library)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


class BuildLockTimeout(RuntimeError):
    """Another process held a variant's build lock longer than the wait bound."""


class BuildLock:
    """An exclusive ``fcntl.flock`` on ``path`` while a variant is built. The kernel drops
    the lock when its holder exits, however it ends (SIGKILL included), so it cannot
    outlive its build; the file holds the holder's pid and host for whoever waits. A
    waiter says once whom it waits for, and gives up after ``wait_s``
    (``NEUROFED_KERNEL_BUILD_WAIT``, default 600 s) with one line naming the file."""

    def __init__(self, path: Path, wait_s: float | None = None, poll: float = 0.2):
        self.path = Path(path)
        self.wait_s = float(os.environ.get("NEUROFED_KERNEL_BUILD_WAIT", 600) if wait_s is None else wait_s)
        self.poll = poll
        self.fd: int | None = None

    def _try(self) -> bool:
        """Lock the file now at ``path`` (a file removed by hand while we held the old
        one's descriptor is opened again)."""
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        try:
            same = os.fstat(self.fd).st_ino == os.stat(self.path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(self.fd)
            self.fd = None
            return False
        return True

    def holder(self) -> str:
        try:
            return Path(self.path).read_text().strip() or "another process"
        except OSError:
            return "another process"

    def __enter__(self) -> "BuildLock":
        start = time.monotonic()
        said = False
        while not self._try():
            if not said:
                print(f"neurofed.kernels: waiting for the kernel build by {self.holder()} ({self.path.parent}) ...",
                      file=sys.stderr, flush=True)
                said = True
            if time.monotonic() - start > self.wait_s:
                self.__exit__()
                raise BuildLockTimeout(f"gave up after {self.wait_s:.0f} s waiting for the kernel build by "
                                       f"{self.holder()}; if that process is not building, remove {self.path}")
            time.sleep(self.poll)
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock; the file stays (removing it would race a waiter)
            self.fd = None


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
    cmd = [cxx, "-std=c++17", "-x", "c++", "-", "-c", "-o", out, f"-I{csrc()}", *(f"-I{p}" for p in include_paths()),
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
