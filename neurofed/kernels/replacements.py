"""The fast replacements of SLAYER's functions (the table: :data:`neurofed.kernels.patches.PATCHES`).

Each checks its exact domain first and otherwise calls the stock function, kept in
``stock.functions`` by :func:`neurofed.kernels.patches.enable`.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from neurofed.gpu import cuba_triton
from neurofed.kernels import ops

# What enable() found in lava-dl: the stock functions (key -> function) and the SLAYER
# modules the replacements read (cuba, quantize, block.base).
stock = SimpleNamespace(functions={}, cuba=None, quantize=None, base=None)


# --------------------------------------------------------------------------- #
# the replacements (each falls back to stock.functions[key] outside its exact domain)
# --------------------------------------------------------------------------- #
def fast_li_dynamics(input, decay, state, w_scale, threshold=None, debug=False):
    """Patched ``leaky_integrator.dynamics``; falls back outside its exact domain."""
    if (
        ops.ext is None or debug or input.device.type != "cpu" or input.dtype != torch.float32
        or input.dim() < 2 or input.shape[-1] == 0 or decay.numel() != 1
        or torch.is_tensor(threshold) or state.dtype != torch.float32
        or state.numel() not in (1, input[..., 0].numel())
    ):
        return stock.functions["li_dynamics"](input, decay, state, w_scale, threshold, debug)
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


def cuba_constants(self) -> dict:
    """Scalars of one CUBA neuron, each computed the way SLAYER computes it (float32
    tensors where SLAYER uses tensors). Cached per neuron for unchanged inputs."""
    key = (
        self.current_decay.item(), self.voltage_decay.item(), self.threshold,
        self.threshold_eps, self.s_scale, self.tau_rho, self.scale_rho,
        stock.cuba.TAU_RHO_MULT, stock.cuba.SCALE_RHO_MULT,
    )
    cached = self.__dict__.get("_nf_fast_cuba")
    if cached is not None and cached[0] == key:
        return cached[1]
    cdec = stock.quantize(self.current_decay).detach()
    vdec = stock.quantize(self.voltage_decay).detach()
    w_scale = self.s_scale
    th = self.threshold + self.threshold_eps  # the value given to the LI and to Spike
    reset_th = th * w_scale  # _li_dynamics_fwd: `threshold *= w_scale` (Python float)
    tau_rho = self.tau_rho * stock.cuba.TAU_RHO_MULT
    scale_rho = self.scale_rho * stock.cuba.SCALE_RHO_MULT
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


def _prepare_state(self, input) -> None:
    """Shape and state handling of an eligible CUBA neuron, verbatim from cuba.Neuron.dynamics."""
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


def _cuba_spikes(self, input, shift: bool):
    """Spikes of an eligible CUBA neuron (state handling as cuba.Neuron.dynamics)."""
    _prepare_state(self, input)
    p = cuba_constants(self)
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


def cuba_forward(self, input):
    """Patched ``cuba.Neuron.forward`` = ``self.spike(self.dynamics(input)[1])``."""
    if not _cuba_eligible(self, input):
        # norm, graded spikes, trainable or per-channel decays, debug, non-CPU, ...:
        # stock code (its leaky integrators still use the C++ kernel when exact).
        return stock.functions["cuba_forward"](self, input)
    spike = _cuba_spikes(self, input, shift=False)
    if self.drop is not None:
        spike = self.drop(spike)
    return spike


def reset_gradient_forward(self, input):
    """Patched ``ResetGradientNeuron.forward`` (``model.neuron_gradient: spikingjelly``): the
    fused neuron's forward and SpikingJelly's backward in one kernel each way (CPU)."""
    if self.persistent_state or input.device.type != "cpu" or not _cuba_eligible(self, input):
        return stock.functions["reset_gradient"](self, input)  # the torch form (and its errors)
    _prepare_state(self, input)
    need_grad = torch.is_grad_enabled() and input.requires_grad
    return ops._FusedResetGradient.apply(input, self.current_state, self.voltage_state, cuba_constants(self),
                                         float(self.atan_alpha), need_grad)


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


def make_block_forward(key: str):
    """Patched ``forward`` of base.AbstractDense / AbstractConv / AbstractPool.

    Stock: ``z = synapse(x); x = neuron(z); x = step_delay(self, x); [x = delay(x)]``.
    For a CUBA neuron without persistent state or dropout, step_delay is exactly
    ``delay(x, 1)`` (a one-step shift), which the fused kernel applies while writing
    the spikes (and its adjoint while reading their gradient)."""

    def forward(self, x):
        neuron = self.neuron
        if (
            ops.ext is None or type(neuron) is not stock.cuba.Neuron or self.delay_shift is not True
            or neuron.persistent_state or neuron.drop is not None
            or getattr(self, "mask", None) is not None or _has_hooks(neuron)
        ):
            return stock.functions[key](self, x)
        z = self.synapse(x)
        if not _cuba_eligible(neuron, z):
            x = stock.base.step_delay(self, neuron(z))
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


def conv_forward(self, input):
    """Patched ``synapse.layer.Conv.forward`` (see :class:`ops._SpikeConv`)."""
    if not _spike_conv_eligible(self, input):
        return stock.functions["conv_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    return ops._SpikeConv.apply(input, weight, tuple(self.stride), tuple(self.padding))


def dense_forward(self, input):
    """Patched ``synapse.layer.Dense.forward`` (see :class:`ops._SpikeConv`)."""
    x = input.reshape(input.shape[0], -1, 1, 1, input.shape[-1]) if input.dim() == 3 else input
    if not _spike_conv_eligible(self, x):
        return stock.functions["dense_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    z = ops._SpikeConv.apply(x, weight, tuple(self.stride), tuple(self.padding))
    return z.reshape(input.shape[0], -1, input.shape[-1]) if input.dim() == 3 else z


def pool_forward(self, input):
    """Patched ``synapse.layer.Pool.forward`` (exact; see :class:`ops._PoolFn`)."""
    kh, kw, kt = self.weight.shape[2:]
    if (
        input.device.type != "cpu" or input.dtype != torch.float32 or input.dim() != 5
        or tuple(self.stride) != (kh, kw, 1) or kt != 1 or tuple(self.padding) != (0, 0, 0)
        or tuple(self.dilation) != (1, 1, 1) or self.bias is not None
        or input.shape[2] % kh != 0 or input.shape[3] % kw != 0
    ):
        return stock.functions["pool_forward"](self, input)
    weight = self.weight if self._pre_hook_fx is None else self._pre_hook_fx(self.weight)
    if weight.requires_grad or weight.shape[:2] != (1, 1):
        return stock.functions["pool_forward"](self, input)
    in_shape = input.shape
    result = ops._PoolFn.apply(
        input.reshape(in_shape[0], 1, in_shape[1] * in_shape[2], in_shape[3], in_shape[4]),
        weight, tuple(self.stride),
    )
    return result.reshape(result.shape[0], in_shape[1], -1, result.shape[3], result.shape[4])


def fast_delay(input, delay_val=1, sampling_time=1):
    """Patched ``axon.delay`` as used by the blocks (one-step shift)."""
    if (
        ops.ext is not None and input.device.type == "cpu" and input.dim() >= 2
        and not torch.is_tensor(delay_val) and sampling_time == 1 and delay_val == 1
    ):
        return ops._Shift1.apply(input)
    return stock.functions["delay"](input, delay_val, sampling_time)

def fast_quantize_hook_fx(x, scale=(1 << 6), num_bits=8, descale=False):
    """Patched ``utils.quantize_hook_fx`` (the 8-bit weight hook); falls back outside
    its domain."""
    if (
        ops.ext is None or not torch.is_tensor(x) or x.device.type != "cpu" or x.dtype != torch.float32
        or isinstance(scale, bool) or not isinstance(scale, (int, float)) or not isinstance(num_bits, int)
        or not scale > 0  # (a negative scale swaps the clamp bounds: stock handles it)
    ):
        return stock.functions["quantize_hook"](x, scale, num_bits, descale)
    # stock: quantize(x, step=2 / scale).clamp(min / scale, max / scale), then `* scale`
    # unless `descale is False`; the C++ casts each Python scalar to float32 as torch does
    lo, hi = -2 * (1 << num_bits) / scale, 2 * ((1 << num_bits) - 1) / scale
    return ops._QuantizeHook.apply(x, 2 / scale, lo, hi, 1.0 if descale is False else float(scale))
