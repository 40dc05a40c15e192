"""Where the fast kernels enter SLAYER: one table of patch points, and the switches.

:data:`PATCHES` lists every lava-dl 0.6.0 function that :func:`enable` replaces (module
and class attributes only; no installed file changes), and the forward of neurofed's
own neuron built on SLAYER's (``ResetGradientNeuron``), the replacement, and the
tests that prove the replacement bit-identical to the stock function. Each
replacement checks its exact domain first and otherwise calls the stock function.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from dataclasses import dataclass
from typing import Callable


from neurofed.kernels import ops, variants
from neurofed.kernels.replacements import (fast_li_dynamics, cuba_forward, make_block_forward, conv_forward, dense_forward, pool_forward, fast_delay, fast_quantize_hook_fx,
                                           reset_gradient_forward, stock)

GRADIENTS = ("exact", "fast")
_enabled = False


# --------------------------------------------------------------------------- #
# the patch points
# --------------------------------------------------------------------------- #
@dataclass(frozen=True)
class Patch:
    key: str
    module: str  # lava.lib.dl.slayer module holding the patched attribute
    owner: str | None  # class in that module, or None for a module-level function
    attr: str
    replacement: Callable
    replaces: str  # what the stock function computes
    proof: tuple[str, ...]  # tests/test_fast_cuba.py tests comparing it bit for bit with stock


_SL = "lava.lib.dl.slayer."
PATCHES = (
    Patch("li_dynamics", _SL + "neuron.dynamics.leaky_integrator", None, "dynamics", fast_li_dynamics,
          "leaky integrator (Affine blocks, ALIF, trainable decays): C++ loop fwd + bwd",
          ("test_affine_block_dynamics_only", "test_neuron_dynamics_and_spikes")),
    Patch("cuba_forward", _SL + "neuron.cuba", "Neuron", "forward", cuba_forward,
          "CUBA dynamics + Spike: one fused kernel each way",
          ("test_neuron_dynamics_and_spikes", "test_inputs_on_the_threshold_grid",
           "test_single_time_step_and_no_grad")),
    Patch("quantize_hook", _SL + "utils", None, "quantize_hook_fx", fast_quantize_hook_fx,
          "8-bit weight hook (quantize, clamp, descale): one pass each way",
          ("test_quantize_hook", "test_digits_cnn_training_step")),
    Patch("delay", _SL + "block.base", None, "delay", fast_delay,
          "one-step axonal delay: single-copy shift",
          ("test_persistent_state_streaming_with_delay_no_grad",)),
    Patch("pool_forward", _SL + "synapse.layer", "Pool", "forward", pool_forward,
          "pooling synapse: direct kernels fwd + bwd",
          ("test_pool_block", "test_pool_block_with_odd_input_falls_back_exactly")),
    Patch("conv_forward", _SL + "synapse.layer", "Conv", "forward", conv_forward,
          "conv synapse forward: time-lane / 8-bit / spike-driven kernels when provably exact",
          ("test_conv_block", "test_conv_and_dense_blocks_with_large_fan_in",
           "test_time_lane_conv_kernel_equals_conv3d", "test_spike_conv_kernel_equals_conv3d",
           "test_8bit_conv_kernel_equals_conv3d")),
    Patch("dense_forward", _SL + "synapse.layer", "Dense", "forward", dense_forward,
          "dense synapse forward: as conv_forward (a 1x1 convolution)",
          ("test_dense_block", "test_conv_and_dense_blocks_with_large_fan_in")),
    Patch("dense_block", _SL + "block.base", "AbstractDense", "forward", make_block_forward("dense_block"),
          "Dense block: synapse, fused neuron writing the one-step delay",
          ("test_dense_block", "test_persistent_state_over_three_calls")),
    Patch("conv_block", _SL + "block.base", "AbstractConv", "forward", make_block_forward("conv_block"),
          "Conv block: as dense_block",
          ("test_conv_block", "test_hooks_on_neurons_still_run", "test_digits_cnn_training_step")),
    Patch("pool_block", _SL + "block.base", "AbstractPool", "forward", make_block_forward("pool_block"),
          "Pool block: as dense_block", ("test_pool_block",)),
    # neurofed's own neuron, not lava-dl's: SLAYER's forward with SpikingJelly's backward
    Patch("reset_gradient", "neurofed.models.reset_gradient", "ResetGradientNeuron", "forward",
          reset_gradient_forward,
          "model.neuron_gradient: spikingjelly: the fused CUBA forward saving the voltage, the backward "
          "through the reset in one kernel",
          ("test_reset_gradient_neuron_fused",)),
)


def _patches():
    """(owner object, attribute, replacement, key) for every patch point."""
    from neurofed.compat import slayer

    slayer()  # the compatibility fixes lava-dl needs before its modules import
    out = []
    for p in PATCHES:
        owner = importlib.import_module(p.module)
        out.append((getattr(owner, p.owner) if p.owner else owner, p.attr, p.replacement, p.key))
    return out


# --------------------------------------------------------------------------- #
# the switches
# --------------------------------------------------------------------------- #
_malloc_tuned = False


def tune_malloc() -> bool:
    """Make glibc keep freed memory for reuse instead of unmapping it (process-wide).

    Training allocates and frees the same multi-megabyte tensors every step. With
    glibc's defaults, big blocks are mmap'ed and returned to the OS on free, so each
    step page-faults them in again; in a VM a 32 MB tensor then costs ~25 ms instead
    of ~1 ms. Raising M_MMAP_THRESHOLD and M_TRIM_THRESHOLD keeps them in the heap
    (resident memory stays at its high-water mark). No effect on numerics; a no-op
    on other C libraries."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        ok = libc.mallopt(m_mmap_threshold, 1 << 30) == 1
        ok = ok and libc.mallopt(m_trim_threshold, (1 << 31) - 1) == 1
    except (OSError, AttributeError):
        ok = False
    _malloc_tuned = ok
    return ok


def enable(verbose: bool = False, malloc: bool = True, gradients: str | None = None) -> bool:
    """Patch SLAYER's CPU paths with the fast kernels. Returns True if active.

    ``gradients="exact"`` (the initial setting): spikes and gradients bit-identical to
    stock SLAYER. ``"fast"``: the same spikes (forward unchanged), and gradients
    from the spike-driven weight-gradient kernel and an inline surrogate exp, equal
    to SLAYER's up to float32 rounding (docs/kernels.md, "The kernels package");
    ``None`` keeps the current setting.
    ``malloc=True`` also applies :func:`tune_malloc` (process-wide, irreversible).
    If the extension cannot be compiled, SLAYER stays stock and a one-line warning
    is issued."""
    global _enabled
    if gradients is not None:
        if gradients not in GRADIENTS:
            raise ValueError(f"kernels.enable: gradients={gradients!r}; allowed: {', '.join(GRADIENTS)}")
        ops.mode = gradients
    if malloc:
        tune_malloc()
    if _enabled:
        return True
    ext = variants.build(verbose=verbose)
    if ext is None:
        warnings.warn(f"neurofed.kernels: C++ extension unavailable ({variants.error()}); using stock SLAYER",
                      RuntimeWarning, stacklevel=2)
        return False
    if ops.ext is None:
        ops.ext = ext
    from neurofed.compat import slayer

    stock.cuba = slayer().neuron.cuba
    stock.quantize = slayer().utils.quantize
    stock.base = importlib.import_module("lava.lib.dl.slayer.block.base")
    for owner, attr, fn, key in _patches():
        stock.functions.setdefault(key, getattr(owner, attr))
        setattr(owner, attr, fn)
    _enabled = True
    return True


def configure(setting="auto", gradients: str = "exact", required: bool = False) -> dict:
    """The fast kernels as a run's ``federation.fast_kernels`` says, and what came of it
    (for the run's summary). ``true``: they must load, else a ConfigError (one line);
    ``auto``: the same where ``required`` (a Flower app: a deployed run would otherwise
    train and evaluate several times slower without saying so in its results), else
    stock SLAYER with one warning line; ``false``: not loaded (an earlier run's patch
    in this process stays: the same spikes either way)."""
    if setting is not False:
        if not enable(gradients=gradients) and (setting is True or required):
            from neurofed.config import ConfigError

            why = "federation.fast_kernels is true" if setting is True else "a Flower app needs them with auto"
            raise ConfigError(f"federation.fast_kernels: the fast kernels cannot be loaded ({variants.error()}) and "
                              f"{why}; set federation.fast_kernels: false to run stock SLAYER (same results, slower)")
    return {"fast_kernels": setting, "enabled": _enabled, "variant": variants.variant if _enabled else None,
            "gradients": ops.mode if _enabled else None, "error": None if _enabled else variants.error()}


def disable() -> None:
    """Restore stock SLAYER."""
    global _enabled
    if not _enabled:
        return
    for owner, attr, _fn, key in _patches():
        setattr(owner, attr, stock.functions[key])
    _enabled = False


def is_enabled() -> bool:
    return _enabled


def gradients() -> str:
    """The gradient mode set by :func:`enable`: "exact" or "fast"."""
    return ops.mode


@contextlib.contextmanager
def enabled(flag: bool = True, gradients: str | None = None):
    """Context manager: run the body with the fast path on (default) or off, and
    optionally in another gradient mode; restores both afterwards."""
    before, before_gradients = _enabled, ops.mode
    active = enable(gradients=gradients) if flag else (disable() or False)
    try:
        yield active
    finally:
        if before:
            enable(gradients=before_gradients)
        else:
            disable()
            ops.mode = before_gradients
