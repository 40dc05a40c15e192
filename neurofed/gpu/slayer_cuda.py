"""lava-dl 0.6.0's CUDA path made to run on every NVIDIA GPU and to spike as the CPU path.

Three fixes, installed by :func:`install` (module and class attributes only; no installed
file changes; nothing happens to CPU tensors):

1. **Arch list.** ``slayer/jitconfig.py`` sets ``TORCH_CUDA_ARCH_LIST = '8.0'`` for every
   device of capability >= 8, and each SLAYER CUDA module copies it into the environment
   just before its JIT build: the kernels then hold sm_80 code and no PTX, and on Hopper
   (9.0), Blackwell (10.x, 12.x) every CUDA forward fails with "no kernel image is
   available". We set ``jitconfig.TORCH_CUDA_ARCH_LIST`` (the value those modules read at
   build time) to :func:`device_arch_list`: every visible device's capability, capped at
   the newest this torch was built for, the newest with ``+PTX`` — the list torch's own
   ``cpp_extension`` would derive without lava-dl's pin.
2. **Build errors.** SLAYER's ``load(...)`` (torch's JIT build) is wrapped so that a
   failure is one line naming the GPU, the arch list and what to do.
3. **Threshold.** SLAYER's CUDA leaky integrator (``leaky_integrator.cu``) receives the
   threshold as a C ``float`` and hands it to the kernel as ``int threshold * w_scale``:
   truncation drops cuba's ``threshold_eps`` (added so that spiking is Loihi's v > theta),
   and the kernel resets a neuron whose voltage lands exactly on theta without a spike.
   The CPU path (``_li_dynamics_fwd``) compares the int64 voltage with the float
   ``threshold * w_scale``, i.e. resets from :func:`exact_threshold`'s integer on. We give
   the CUDA kernel that integer (divided by ``w_scale``, exact in float32), so both reset on
   the same integers; spikes come from the same torch ``Spike`` code on both devices.
"""

from __future__ import annotations

import functools
import importlib
import math
import os

import numpy as np
import torch

# SLAYER modules that JIT-build a CUDA extension with `load` (lava-dl 0.6.0)
JIT_MODULES = (
    "lava.lib.dl.slayer.neuron.dynamics.leaky_integrator",
    "lava.lib.dl.slayer.neuron.dynamics.adaptive_threshold",
    "lava.lib.dl.slayer.neuron.dynamics.resonator",
    "lava.lib.dl.slayer.neuron.dynamics.adaptive_phase_th",
    "lava.lib.dl.slayer.neuron.dynamics.adaptive_resonator",
    "lava.lib.dl.slayer.utils.time.shift",
    "lava.lib.dl.slayer.utils.filter.conv",
)
LEAKY_INTEGRATOR = JIT_MODULES[0]

_installed = False


# --------------------------------------------------------------------------- 1. arch list
def arch_list(capabilities, supported=()) -> str:
    """``TORCH_CUDA_ARCH_LIST`` for devices of these ``(major, minor)`` capabilities.

    ``supported``: the ``sm_XY`` names torch was built for (``torch.cuda.get_arch_list()``);
    a device newer than all of them gets the newest one, whose PTX its driver compiles
    (nvcc, matching torch's CUDA, may not know the device). ``+PTX`` on the newest entry
    (as torch's ``cpp_extension`` does) keeps the build usable on later GPUs too."""
    sms = [int(s.split("_", 1)[1].rstrip("a")) for s in supported if s.startswith("sm_") and s[3:].rstrip("a").isdigit()]
    newest = divmod(max(sms), 10) if sms else None
    caps = sorted({min(tuple(c), newest) if newest else tuple(c) for c in capabilities})
    if not caps:
        raise ValueError("arch_list: no device capability given")
    names = [f"{major}.{minor}" for major, minor in caps]
    names[-1] += "+PTX"
    return ";".join(names)


def device_arch_list() -> str | None:
    """The arch list for the CUDA devices this process sees (None without any)."""
    if not torch.cuda.is_available():
        return None
    caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    return arch_list(caps, torch.cuda.get_arch_list())


def _gpu_names() -> str:
    names = []
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        names.append(f"{torch.cuda.get_device_name(i)} (capability {major}.{minor})")
    return ", ".join(dict.fromkeys(names)) or "no CUDA device"


def _checked_load(load, arch: str):
    """torch's JIT ``load`` as SLAYER calls it, with a build failure in one line."""

    @functools.wraps(load)
    def checked(*args, **kwargs):
        try:
            return load(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 (ninja, nvcc, compiler, link: all end here)
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            name = kwargs.get("name", args[0] if args else "?")
            raise RuntimeError(
                f"SLAYER's CUDA kernel {name!r} failed to build for {_gpu_names()} with "
                f"TORCH_CUDA_ARCH_LIST={os.environ.get('TORCH_CUDA_ARCH_LIST', arch)}: {first}; "
                f"put nvcc of torch's CUDA {torch.version.cuda} and ninja on PATH (or set "
                f"federation.device: cpu), delete ~/.cache/torch_extensions and rerun"
            ) from exc

    checked._nf_checked = True
    return checked


# --------------------------------------------------------------------------- 3. threshold
def exact_threshold(threshold, w_scale) -> float:
    """The threshold to give SLAYER's CUDA leaky integrator so that it resets exactly
    where the CPU path does.

    CPU (``_li_dynamics_fwd``): reset where the int64 voltage ``v >= threshold * w_scale``
    (Python floats) and only if that product is > 0, i.e. from ``ceil(threshold * w_scale)``
    on. CUDA (``LIDynamicsFwd``): ``threshold`` arrives as a float32, ``threshold *= w_scale``
    in float32, truncated to the kernel's ``int``; reset where ``v >= that int`` if it is
    >= 0. We return ``ceil(threshold * w_scale) / w_scale``, whose float32 times ``w_scale``
    is that integer exactly (checked), and -1 (no reset on either side) where the CPU does
    not reset."""
    scaled = threshold * w_scale
    if not scaled > 0:
        return -1.0
    target = math.ceil(scaled)
    value = target / w_scale
    got = np.float32(np.float32(value) * np.float32(w_scale))
    if int(got) != target:  # not exactly representable (w_scale not a power of two, or > 2^24)
        raise ValueError(f"SLAYER CUDA threshold {threshold!r} x w_scale {w_scale!r}: the integer threshold "
                         f"{target} cannot pass through the kernel's float32 exactly")
    return value


class _ExactThresholdLI:
    """SLAYER's compiled leaky-integrator module, called with :func:`exact_threshold`."""

    def __init__(self, module):
        self._module = module

    def dynamics(self, input, decay, state, threshold, w_scale):
        return self._module.dynamics(input, decay, state, exact_threshold(threshold, w_scale), w_scale)

    def fwd(self, input, decay, state, threshold, w_scale):
        return self._module.fwd(input, decay, state, exact_threshold(threshold, w_scale), w_scale)

    def __getattr__(self, name):  # bwd: unchanged
        return getattr(self._module, name)


def _exact_threshold_accelerated(stock):
    """A subclass of ``leaky_integrator.Accelerated`` to put in its place: SLAYER's
    ``dynamics`` reads ``Accelerated.leaky_integrator`` from the module; ours builds the
    extension with the stock property (which caches it in ``Accelerated.module``) and
    returns it with the exact threshold."""
    build = stock.__dict__["leaky_integrator"].fget

    class _ExactThresholdProperty:
        def __get__(self, obj, owner):
            return _ExactThresholdLI(build())

    class Accelerated(stock):
        __doc__ = stock.__doc__
        _nf_stock = stock
        leaky_integrator = _ExactThresholdProperty()

    return Accelerated


# --------------------------------------------------------------------------- install
def install() -> str | None:
    """Apply the three fixes (idempotent). Returns the arch list set (None without a GPU)."""
    global _installed
    if _installed:
        return current_arch_list()
    arch = device_arch_list()
    if arch is not None:  # read by each JIT module right before its build: this wins over the pin
        importlib.import_module("lava.lib.dl.slayer.jitconfig").TORCH_CUDA_ARCH_LIST = arch
    for name in JIT_MODULES:
        module = importlib.import_module(name)
        if not getattr(module.load, "_nf_checked", False):
            module.load = _checked_load(module.load, arch or "")
    li = importlib.import_module(LEAKY_INTEGRATOR)
    if getattr(li.Accelerated, "_nf_stock", None) is None:
        li.Accelerated = _exact_threshold_accelerated(li.Accelerated)
    _installed = True
    return arch


def current_arch_list() -> str | None:
    """The arch list SLAYER's next CUDA build will use (what the run log reports)."""
    return importlib.import_module("lava.lib.dl.slayer.jitconfig").TORCH_CUDA_ARCH_LIST
