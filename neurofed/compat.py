"""Make lava-nc 0.10 and lava-dl 0.6 usable on Python 3.11 without editing installed files.

Two problems, both fixed at import time and only where they occur:

1. ``lava/magma/compiler/var_model.py`` declares dataclass fields with dataclass
   instances as defaults (``x: ByteEncoder = ByteEncoder()``). Python 3.11 rejects
   unhashable defaults, so ``import lava.magma...`` fails. We install a meta-path
   loader for that one module that compiles its source with those defaults written
   as ``field(default_factory=ByteEncoder)``; the file on disk is untouched.
2. ``lava.lib.dl.slayer`` imports its object-detection subpackage, which imports
   torchvision's compiled ops; the PyPI torchvision wheel is built for CUDA torch
   and cannot load with the CPU torch. Classification needs none of it, so when
   torchvision is unusable we register a placeholder for that subpackage that
   raises a clear ImportError on first use.

3. ``lava.magma.runtime.message_infrastructure.multiprocessing`` calls
   ``multiprocessing.set_start_method('fork')`` at import, which raises "context has
   already been set" if anything (tqdm's lock, for one) touched the default context
   first. We make a repeated request for the method already in effect a no-op;
   any other request behaves as before.

4. lava-dl's CUDA path (only where torch sees a GPU, and only for CUDA tensors): its JIT
   arch list pinned to sm_80 and its leaky integrator's truncated threshold; see
   :mod:`neurofed.gpu.slayer_cuda`, installed by :func:`slayer` after SLAYER imports.

Everything in neurofed imports lava through :func:`slayer`, :func:`netx` or
:func:`lava` (or calls :func:`install` first). Both fixes are no-ops where the
installed packages already import (e.g. Python 3.10 or a working torchvision).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import multiprocessing
import re
import sys
import types

VAR_MODEL = "lava.magma.compiler.var_model"
OBJECT_DETECTION = "lava.lib.dl.slayer.object_detection"
_INSTANCE_DEFAULT = re.compile(r"^(\s+\w+\s*:\s*(\w+))\s*=\s*\2\(\)\s*$", re.MULTILINE)

_installed = False
_ORIGINAL_SET_START_METHOD = multiprocessing.set_start_method


class _VarModelLoader(importlib.abc.Loader):
    """Loads var_model.py from its source with instance defaults made factories."""

    def __init__(self, origin: str):
        self.origin = origin

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        with open(self.origin, encoding="utf-8") as fh:
            source = fh.read()
        fixed = _INSTANCE_DEFAULT.sub(r"\1 = _nf_field(default_factory=\2)", source)
        module.__dict__["_nf_field"] = importlib.import_module("dataclasses").field
        exec(compile(fixed, self.origin, "exec"), module.__dict__)


class _VarModelFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != VAR_MODEL:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            return None
        with open(spec.origin, encoding="utf-8") as fh:
            if not _INSTANCE_DEFAULT.search(fh.read()):
                return None  # a fixed lava-nc: nothing to do
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_VarModelLoader(spec.origin))


class _Unavailable(types.ModuleType):
    """Placeholder for a subpackage whose dependencies cannot load here."""

    def __init__(self, name: str, reason: str):
        super().__init__(name)
        self.__dict__["_reason"] = reason
        self.__path__ = []  # behave as a package so submodule imports fail cleanly

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(f"{self.__name__} is unavailable: {self._reason}")


def _tolerant_set_start_method(method, force=False):
    if not force and multiprocessing.get_start_method(allow_none=True) == method:
        return  # already in effect: nothing to change
    _ORIGINAL_SET_START_METHOD(method, force=force)


def _torchvision_usable() -> bool:
    try:
        from torchvision import ops  # noqa: F401
    except Exception:
        return False
    return True


def install() -> None:
    """Install the fixes (idempotent, cheap)."""
    global _installed
    if _installed:
        return
    if sys.version_info >= (3, 11) and not any(isinstance(f, _VarModelFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _VarModelFinder())
    multiprocessing.set_start_method = _tolerant_set_start_method
    if OBJECT_DETECTION not in sys.modules and not _torchvision_usable():
        sys.modules[OBJECT_DETECTION] = _Unavailable(
            OBJECT_DETECTION,
            "it needs torchvision's compiled ops, which do not load with the CPU build of torch "
            "(neurofed only needs SLAYER's classification parts)",
        )
    _installed = True


def slayer():
    """``lava.lib.dl.slayer``, importable on Python 3.11 with CPU torch, its CUDA path
    fixed (fix 4)."""
    install()
    module = importlib.import_module("lava.lib.dl.slayer")
    from neurofed.gpu import slayer_cuda

    slayer_cuda.install()
    return module


def netx():
    """``lava.lib.dl.netx``."""
    install()
    return importlib.import_module("lava.lib.dl.netx")


def lava(module: str = "lava.magma.core.run_configs"):
    """Import any ``lava.*`` module through the compatibility fixes."""
    install()
    return importlib.import_module(module)


def check_environment() -> dict[str, str]:
    """Import the whole stack once; raise with a clear message if a part is missing."""
    import numpy
    import torch

    versions = {"numpy": numpy.__version__, "torch": torch.__version__}
    if not torch.__version__.startswith("2.13"):
        raise RuntimeError(f"torch {torch.__version__} found; neurofed is set up for torch 2.13.0 (CPU)")
    slayer()
    netx()
    lava("lava.magma.core.run_configs")
    from importlib.metadata import version

    for dist in ("lava-nc", "lava-dl"):
        versions[dist] = version(dist)
    return versions
