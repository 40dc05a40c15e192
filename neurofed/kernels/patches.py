"""Where the fast kernels enter SLAYER: one table of patch points, and the switches.

:data:`PATCHES` lists every lava-dl 0.6.0 function that :func:`enable` replaces (module
and class attributes only; no installed file changes), the replacement, and the
tests that prove the replacement bit-identical to the stock function. Each
replacement checks its exact domain first and otherwise calls the stock function.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from neurofed.gpu import cuba_triton
from neurofed.kernels import ops, variants

GRADIENTS = ("exact", "fast")
_orig: dict = {}  # key -> the stock function
_enabled = False
_cuba = None  # lava.lib.dl.slayer.neuron.cuba, set by enable()
_quantize = None  # lava.lib.dl.slayer.utils.quantize, set by enable()
_base = None  # lava.lib.dl.slayer.block.base, set by enable()


# --------------------------------------------------------------------------- #
# the replacements (each falls back to _orig[key] outside its exact domain)
# --------------------------------------------------------------------------- #
def _fast_li_dynamics(input, decay, state, w_scale, threshold=None, debug=False):
    """Patched ``leaky_integrator.dynamics``; falls back outside its exact domain."""
    if (
        ops.ext is None or debug or input.device.type != "cpu" or input.dtype != torch.float32
        or input.dim() < 2 or input.shape[-1] == 0 or decay.numel() != 1
        or torch.is_tensor(threshold) or state.dtype != torch.float32
        or state.numel() not in (1, input[..., 0].numel())
    ):
        return _orig["li_dynamics"](input, decay, state, w_scale, threshold, debug)
    if threshold is None:
        threshold = -1  # stock: -1 means no reset
    if torch.numel(state) == 1:
        state = state * torch.ones(input.shape[:-1], dtype=state.dtype)
    return ops._FastLI.apply(input, decay, state, threshold, w_scale)


def _on_gpu_kernel(input) -> bool:
    """CUDA tensors take the fused Triton kernel when ``federation.gpu_kernels`` asks for
    it (:mod:`neurofed.gpu.cuba_triton`); every other CUDA path stays stock SLAYER."""
    return input.is_cuda and cuba_triton.enabled()


def _fused_cuba_fn(input):
    """The autograd function of the fused neuron for ``input``'s device."""
    return ops._FusedCuba if input.device.type == "cpu" else cuba_triton.FusedCuba


def _cuba_eligible(neuron, input) -> bool:
    on_device = input.device.type == "cpu" or _on_gpu_kernel(input)
    return (
        ops.ext is not None and on_device and input.dtype == torch.float32
        and input.dim() >= 3 and input.shape[-1] > 0
        and (neuron.shape is None or input.shape[1:-1] == neuron.shape)
        and not neuron.debug and neuron.norm is None and neuron.graded_spike is False
        and neuron.shared_param is True
        and neuron.current_decay.numel() == 1 and neuron.voltage_decay.numel() == 1
        and not neuron.current_decay.requires_grad and not neuron.voltage_decay.requires_grad
        and neuron.current_state.dtype == torch.float32
        and neuron.current_state.device == input.device
        and isinstance(neuron.threshold, (int, float))
    )


def _cuba_constants(self) -> dict:
    """Scalars of one CUBA neuron, each computed the way SLAYER computes it (float32
    tensors where SLAYER uses tensors). Cached per neuron for unchanged inputs."""
    key = (
        self.current_decay.item(), self.voltage_decay.item(), self.threshold,
        self.threshold_eps, self.s_scale, self.tau_rho, self.scale_rho,
        _cuba.TAU_RHO_MULT, _cuba.SCALE_RHO_MULT,
    )
    cached = self.__dict__.get("_nf_fast_cuba")
    if cached is not None and cached[0] == key:
        return cached[1]
    cdec = _quantize(self.current_decay).detach()
    vdec = _quantize(self.voltage_decay).detach()
    w_scale = self.s_scale
    th = self.threshold + self.threshold_eps  # the value given to the LI and to Spike
    reset_th = th * w_scale  # _li_dynamics_fwd: `threshold *= w_scale` (Python float)
    tau_rho = self.tau_rho * _cuba.TAU_RHO_MULT
    scale_rho = self.scale_rho * _cuba.SCALE_RHO_MULT
    p = {
        # _li_dynamics_fwd: decay_int = (1 << 12) - decay.to(int64)
        "cdecay_int": int((1 << 12) - cdec.to(torch.int64).item()),
        "vdecay_int": int((1 << 12) - vdec.to(torch.int64).item()),
        "w_scale": float(w_scale),
        "reset_th": float(reset_th),
        "reset": bool(reset_th > 0),
        # Spike saves threshold, tau_rho, scale_rho as float32 tensors
        "spike_th": ops._f32(th).item(),
        "tau": ops._f32(tau_rho).item(),
        "A": (ops._f32(scale_rho) / 2 / ops._f32(tau_rho)).item(),
        # _li_dynamics_bwd: decay = 1 - decay / (1 << 12)   (float32)
        "dc": (1 - cdec / (1 << 12)).item(),
        "dv": (1 - vdec / (1 << 12)).item(),
    }
    self.__dict__["_nf_fast_cuba"] = (key, p)
    return p


def _cuba_spikes(self, input, shift: bool):
    """Spikes of an eligible CUBA neuron (state handling as cuba.Neuron.dynamics)."""
    # --- shape and state handling, verbatim from cuba.Neuron.dynamics ---
    if self.shape is None:  # shared_param is True here
        self.shape = input.shape[1:-1]
        self.num_neurons = np.prod(self.shape)
    dtype = self.current_state.dtype
    device = self.current_state.device
    if self.current_state.shape[0] != input.shape[0]:
        self.current_state = torch.zeros(input.shape[:-1]).to(dtype).to(device)
        self.voltage_state = torch.zeros(input.shape[:-1]).to(dtype).to(device)
    if self.current_state.shape[1:] != self.shape:
        self.current_state = self.current_state * torch.ones(input.shape[:-1]).to(dtype).to(device)
        self.voltage_state = self.voltage_state * torch.ones(input.shape[:-1]).to(dtype).to(device)
    if self.requires_grad is True:
        self.clamp()

    p = _cuba_constants(self)
    persistent = self.persistent_state is True
    need_grad = torch.is_grad_enabled() and input.requires_grad
    spike, clast, vlast = _fused_cuba_fn(input).apply(
        input, self.current_state, self.voltage_state, p, persistent, need_grad, shift
    )
    if persistent:  # (never together with shift)
        with torch.no_grad():
            self.current_state = clast.clone()
            # voltage[..., -1], then leaky_integrator.persistent_state(., spike[..., -1])
            self.voltage_state = (vlast * (1 - (spike[..., -1] > 0).to(vlast.dtype))).detach().clone()
    return spike


def _cuba_forward(self, input):
    """Patched ``cuba.Neuron.forward`` = ``self.spike(self.dynamics(input)[1])``."""
    if not _cuba_eligible(self, input):
        # norm, graded spikes, trainable or per-channel decays, debug, non-CPU, ...:
        # stock code (its leaky integrators still use the C++ kernel when exact).
        return _orig["cuba_forward"](self, input)
    spike = _cuba_spikes(self, input, shift=False)
    if self.drop is not None:
        spike = self.drop(spike)
    return spike


def _has_hooks(module) -> bool:
    """True if calling ``module`` would run hooks (the fused block path skips the
    neuron's ``__call__``, so it is only taken when there are none)."""
    g = torch.nn.modules.module
    return bool(
        module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
        or getattr(module, "_backward_pre_hooks", None)
        or g._global_forward_hooks or g._global_forward_pre_hooks or g._global_backward_hooks
        or getattr(g, "_global_backward_pre_hooks", None)
    )


def _make_block_forward(key: str):
    """Patched ``forward`` of base.AbstractDense / AbstractConv / AbstractPool.

    Stock: ``z = synapse(x); x = neuron(z); x = step_delay(self, x); [x = delay(x)]``.
    For a CUBA neuron without persistent state or dropout, step_delay is exactly
    ``delay(x, 1)`` (a one-step shift), which the fused kernel applies while writing
    the spikes (and its adjoint while reading their gradient)."""

    def forward(self, x):
        neuron = self.neuron
        if (
            ops.ext is None or type(neuron) is not _cuba.Neuron or self.delay_shift is not True
            or neuron.persistent_state or neuron.drop is not None
            or getattr(self, "mask", None) is not None or _has_hooks(neuron)
        ):
            return _orig[key](self, x)
        z = self.synapse(x)
        if not _cuba_eligible(neuron, z):
            x = _base.step_delay(self, neuron(z))
        else:
            # step_delay's buffer bookkeeping (no persistent state: nothing stored)
            if not hasattr(self, "delay_buffer"):
                self.delay_buffer = None
            elif self.delay_buffer is not None and self.delay_buffer.shape[0] != z.shape[0]:
                self.delay_buffer = None
            x = _cuba_spikes(neuron, z, shift=True)
        if self.delay is not None:
            x = self.delay(x)
        if self.count_log is True:
            return x, torch.mean(x > 0)
        return x

    forward.__name__ = f"fast_{key}"
    return forward


def _spike_conv_eligible(self, input) -> bool:
    return (
        ops.ext is not None and input.device.type == "cpu" and input.dtype == torch.float32
        and input.dim() == 5 and input.is_contiguous() and self.weight.dtype == torch.float32
        and self.bias is None and self.groups == 1 and not isinstance(self.padding, str)
        and tuple(self.dilation) == (1, 1, 1) and self.weight.shape[4] == 1
        and self.stride[2] == 1 and self.padding[2] == 0
    )


def _conv_forward(self, input):
    """Patched ``synapse.layer.Conv.forward`` (see :class:`ops._SpikeConv`)."""
    if not _spike_conv_eligible(self, input):
        return _orig["conv_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    return ops._SpikeConv.apply(input, weight, tuple(self.stride), tuple(self.padding))


def _dense_forward(self, input):
    """Patched ``synapse.layer.Dense.forward`` (see :class:`ops._SpikeConv`)."""
    x = input.reshape(input.shape[0], -1, 1, 1, input.shape[-1]) if input.dim() == 3 else input
    if not _spike_conv_eligible(self, x):
        return _orig["dense_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    z = ops._SpikeConv.apply(x, weight, tuple(self.stride), tuple(self.padding))
    return z.reshape(input.shape[0], -1, input.shape[-1]) if input.dim() == 3 else z


def _pool_forward(self, input):
    """Patched ``synapse.layer.Pool.forward`` (exact; see :class:`ops._PoolFn`)."""
    kh, kw, kt = self.weight.shape[2:]
    if (
        input.device.type != "cpu" or input.dtype != torch.float32 or input.dim() != 5
        or tuple(self.stride) != (kh, kw, 1) or kt != 1 or tuple(self.padding) != (0, 0, 0)
        or tuple(self.dilation) != (1, 1, 1) or self.bias is not None
        or input.shape[2] % kh != 0 or input.shape[3] % kw != 0
    ):
        return _orig["pool_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    if weight.requires_grad or weight.shape[:2] != (1, 1):
        return _orig["pool_forward"](self, input)
    in_shape = input.shape
    result = ops._PoolFn.apply(
        input.reshape(in_shape[0], 1, in_shape[1] * in_shape[2], in_shape[3], in_shape[4]),
        weight, tuple(self.stride),
    )
    return result.reshape(result.shape[0], in_shape[1], -1, result.shape[3], result.shape[4])


def _fast_delay(input, delay_val=1, sampling_time=1):
    """Patched ``axon.delay`` as used by the blocks (one-step shift)."""
    if (
        ops.ext is not None and input.device.type == "cpu" and input.dim() >= 2
        and not torch.is_tensor(delay_val) and sampling_time == 1 and delay_val == 1
    ):
        return ops._Shift1.apply(input)
    return _orig["delay"](input, delay_val, sampling_time)

def _fast_quantize_hook_fx(x, scale=(1 << 6), num_bits=8, descale=False):
    """Patched ``utils.quantize_hook_fx`` (the 8-bit weight hook); falls back outside
    its domain."""
    if (
        ops.ext is None or not torch.is_tensor(x) or x.device.type != "cpu" or x.dtype != torch.float32
        or isinstance(scale, bool) or not isinstance(scale, (int, float)) or not isinstance(num_bits, int)
        or not scale > 0  # (a negative scale swaps the clamp bounds: stock handles it)
    ):
        return _orig["quantize_hook"](x, scale, num_bits, descale)
    # stock: quantize(x, step=2 / scale).clamp(min / scale, max / scale), then `* scale`
    # unless `descale is False`; the C++ casts each Python scalar to float32 as torch does
    lo, hi = -2 * (1 << num_bits) / scale, 2 * ((1 << num_bits) - 1) / scale
    return ops._QuantizeHook.apply(x, 2 / scale, lo, hi, 1.0 if descale is False else float(scale))


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
    Patch("li_dynamics", _SL + "neuron.dynamics.leaky_integrator", None, "dynamics", _fast_li_dynamics,
          "leaky integrator (Affine blocks, ALIF, trainable decays): C++ loop fwd + bwd",
          ("test_affine_block_dynamics_only", "test_neuron_dynamics_and_spikes")),
    Patch("cuba_forward", _SL + "neuron.cuba", "Neuron", "forward", _cuba_forward,
          "CUBA dynamics + Spike: one fused kernel each way",
          ("test_neuron_dynamics_and_spikes", "test_inputs_on_the_threshold_grid",
           "test_single_time_step_and_no_grad")),
    Patch("quantize_hook", _SL + "utils", None, "quantize_hook_fx", _fast_quantize_hook_fx,
          "8-bit weight hook (quantize, clamp, descale): one pass each way",
          ("test_quantize_hook", "test_digits_cnn_training_step")),
    Patch("delay", _SL + "block.base", None, "delay", _fast_delay,
          "one-step axonal delay: single-copy shift",
          ("test_persistent_state_streaming_with_delay_no_grad",)),
    Patch("pool_forward", _SL + "synapse.layer", "Pool", "forward", _pool_forward,
          "pooling synapse: direct kernels fwd + bwd",
          ("test_pool_block", "test_pool_block_with_odd_input_falls_back_exactly")),
    Patch("conv_forward", _SL + "synapse.layer", "Conv", "forward", _conv_forward,
          "conv synapse forward: time-lane / 8-bit / spike-driven kernels when provably exact",
          ("test_conv_block", "test_conv_and_dense_blocks_with_large_fan_in",
           "test_time_lane_conv_kernel_equals_conv3d", "test_spike_conv_kernel_equals_conv3d",
           "test_8bit_conv_kernel_equals_conv3d")),
    Patch("dense_forward", _SL + "synapse.layer", "Dense", "forward", _dense_forward,
          "dense synapse forward: as conv_forward (a 1x1 convolution)",
          ("test_dense_block", "test_conv_and_dense_blocks_with_large_fan_in")),
    Patch("dense_block", _SL + "block.base", "AbstractDense", "forward", _make_block_forward("dense_block"),
          "Dense block: synapse, fused neuron writing the one-step delay",
          ("test_dense_block", "test_persistent_state_over_three_calls")),
    Patch("conv_block", _SL + "block.base", "AbstractConv", "forward", _make_block_forward("conv_block"),
          "Conv block: as dense_block",
          ("test_conv_block", "test_hooks_on_neurons_still_run", "test_digits_cnn_training_step")),
    Patch("pool_block", _SL + "block.base", "AbstractPool", "forward", _make_block_forward("pool_block"),
          "Pool block: as dense_block", ("test_pool_block",)),
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
    to SLAYER's up to float32 rounding (see "Fast gradients" in the package notes);
    ``None`` keeps the current setting.
    ``malloc=True`` also applies :func:`tune_malloc` (process-wide, irreversible).
    If the extension cannot be compiled, SLAYER stays stock and a one-line warning
    is issued."""
    global _enabled, _cuba, _quantize, _base
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

    _cuba = slayer().neuron.cuba
    _quantize = slayer().utils.quantize
    _base = importlib.import_module("lava.lib.dl.slayer.block.base")
    for owner, attr, fn, key in _patches():
        _orig.setdefault(key, getattr(owner, attr))
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
        setattr(owner, attr, _orig[key])
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
