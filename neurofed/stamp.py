"""What produced a result: neurofed's version and git commit, the kernel variant, the
libraries, the CPU and its instruction-set class — stamped into ``summary.json``
(``environment``) and printed by ``neurofed --version``.

Bit-exactness of the fast kernels depends on the instruction set (docs/getting-started.md, docs/kernels.md),
so two runs' numbers compare only with these equal. Nothing here may fail a run: each
item is None when it cannot be read.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
from importlib import metadata
from pathlib import Path

# x86-64 psABI level (neurofed.kernels.variants) -> the instruction-set class people name
_ISA_CLASS = {"x86-64-v4+vnni": "avx512_vnni", "x86-64-v4": "avx512", "x86-64-v3": "avx2", "x86-64-v2": "sse4.2"}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def neurofed_version() -> str:
    """The version of the code that runs: ``neurofed.__version__`` (pyproject.toml's, the one
    place it is defined). Not the installed metadata's, which an editable install leaves
    stale and another checkout on ``PYTHONPATH`` does not change."""
    from neurofed import __version__

    return __version__


def git_commit() -> str | None:
    """HEAD of the checkout neurofed is imported from (``+dirty`` with uncommitted
    changes to tracked files); None for an installed copy or without git."""
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():  # a worktree has a .git file, a checkout a folder
        return None
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def isa_class() -> str:
    """avx512_vnni, avx512, avx2, sse4.2 or baseline on x86-64; the machine name elsewhere."""
    from neurofed.kernels.variants import runnable_variants

    if platform.machine() not in ("x86_64", "AMD64"):
        return platform.machine()
    return _ISA_CLASS.get(runnable_variants()[-1], "baseline")


def environment() -> dict:
    """The stamp summary.json carries (call after training: the kernel variant is
    the one patched into SLAYER at that point; None when SLAYER is stock)."""
    from neurofed.device import cpu_name
    from neurofed.kernels import is_enabled, variant

    def safe(fn):
        try:
            return fn()
        except Exception:  # a stamp never fails a run
            return None

    return {"neurofed": neurofed_version(), "git_commit": git_commit(), "kernel_variant": safe(lambda: variant() if is_enabled() else None),
            "torch": _version("torch"), "lava_dl": _version("lava-dl"), "lava_nc": _version("lava-nc"),
            "cpu": safe(cpu_name), "isa": safe(isa_class), "python": platform.python_version()}


def version_line() -> str:
    commit = git_commit()
    libs = ", ".join(f"{name} {_version(dist) or 'missing'}" for name, dist in
                     (("torch", "torch"), ("lava-dl", "lava-dl"), ("lava-nc", "lava-nc")))
    return (f"neurofed {neurofed_version()}" + (f" (git {commit})" if commit else "") +
            f"; {libs}; Python {platform.python_version()}; CPU class {isa_class()}")


class VersionAction(argparse.Action):
    """``--version``: computed only when asked (it runs git)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0,
                         help=help or "print neurofed's version, git commit and library versions, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_line())
        parser.exit()
