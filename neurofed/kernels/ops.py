"""The autograd functions that run the C++ kernels, and when each kernel is tried.

Each function's docstring says which SLAYER computation it replaces and why its
result is bit-identical (or, in the "fast" gradient mode, within which tolerance);
the kernels decline (return None) outside their exact domain and the stock torch
call runs instead. :mod:`neurofed.kernels.patches` installs them into SLAYER.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ext = None  # the loaded extension module, set by patches.enable() (tests swap it)
mode = "exact"  # the gradient mode, set by patches.enable(gradients=...)


def _f32(value) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


class _FastLI(torch.autograd.Function):
    """Drop-in for ``leaky_integrator._LIDynamics`` (CPU, float32, shared decay)."""

    @staticmethod
    def forward(ctx, input, decay, state, threshold, w_scale):
        T = input.shape[-1]
        x = input.detach().contiguous().view(-1, T)
        st = state.detach().contiguous().view(-1)
        # stock: decay_int = (1 << 12) - decay.to(int64)   (truncation)
        decay_int = int((1 << 12) - decay.detach().to(torch.int64).item())
        thr = threshold * w_scale  # stock: `threshold *= w_scale` in Python
        out = ext.li_fwd(x, st, decay_int, float(w_scale), float(thr), bool(thr > 0))
        out = out.view(input.shape)
        ctx.save_for_backward(out, decay)
        return out

    @staticmethod
    def backward(ctx, grad_output):
        output, decay = ctx.saved_tensors
        T = grad_output.shape[-1]
        d = 1 - decay / (1 << 12)  # float32 tensor, as in _li_dynamics_bwd
        grad_input = ext.li_bwd(grad_output.contiguous().view(-1, T), d.item())
        grad_input = grad_input.view(grad_output.shape)
        grad_decay = None
        if ctx.needs_input_grad[1]:  # stock formula (shared decay) with the same torch ops
            grad_decay = grad_input[..., 1:] * output[..., :-1]
            grad_decay = torch.sum(grad_decay.flatten(), dim=0, keepdim=True)
        return grad_input, grad_decay, None, None, None


def _cuba_fwd(z, cstate, vstate, p: dict, need_grad: bool, need_last: bool, shift: bool, save_voltage: bool):
    """``ext.cuba_fwd`` on the input's rows of T steps and the flat states, with the neuron's
    constants ``p`` (:func:`neurofed.kernels.replacements.cuba_constants`)."""
    T = z.shape[-1]
    return ext.cuba_fwd(
        z.detach().contiguous().view(-1, T),
        cstate.detach().contiguous().view(-1),
        vstate.detach().contiguous().view(-1),
        p["cdecay_int"], p["vdecay_int"], p["w_scale"], p["reset_th"], p["reset"],
        p["spike_th"], p["tau"], bool(need_grad), bool(need_last), bool(shift), bool(save_voltage),
    )


class _FusedCuba(torch.autograd.Function):
    """cuba.Neuron.dynamics + Spike (non-graded) in one pass, optionally followed by
    the blocks' one-step delay (``shift``); returns spikes and, for persistent
    state, the last current and last pre-reset voltage."""

    @staticmethod
    def forward(ctx, z, cstate, vstate, p, need_last, need_grad, shift):
        spike, earg, clast, vlast = _cuba_fwd(z, cstate, vstate, p, need_grad, need_last, shift, save_voltage=False)
        ctx.p = p
        ctx.shift = bool(shift)
        ctx.save_for_backward(earg if need_grad else None)
        ctx.mark_non_differentiable(*(t for t in (clast, vlast) if t is not None))
        shape = z.shape
        spike = spike.view(shape)
        if need_last:
            return spike, clast.view(shape[:-1]), vlast.view(shape[:-1])
        return spike, None, None

    @staticmethod
    def backward(ctx, grad_spike, _gc=None, _gv=None):
        (earg,) = ctx.saved_tensors
        p = ctx.p
        T = grad_spike.shape[-1]
        # Spike's surrogate: scale_rho / 2 / tau_rho * torch.exp(-|v - th| / tau_rho);
        # exact mode: exp is taken by torch on a same-shaped tensor of identical values;
        # fast gradients: by surrogate_exp inside the kernel (within 1 ulp, see the C++).
        inline_exp = mode == "fast"
        ex = earg if inline_exp else torch.exp(earg)
        gz = ext.cuba_bwd(ex, grad_spike.contiguous().view(-1, T), p["A"], p["dv"], p["dc"], ctx.shift, inline_exp)
        return gz.view(grad_spike.shape), None, None, None, None, None, None


class _FusedResetGradient(torch.autograd.Function):
    """The CUBA neuron's forward as :class:`_FusedCuba` (the same spikes), saving the pre-reset
    voltage; backward: SpikingJelly's gradient through the reset and the current's adjoint in
    one kernel (``model.neuron_gradient: spikingjelly``, :mod:`neurofed.models.reset_gradient`),
    the torch form's operations one by one in the same order. No persistent state, no shift."""

    @staticmethod
    def forward(ctx, z, cstate, vstate, p, alpha, need_grad):
        spike, voltage, _, _ = _cuba_fwd(z, cstate, vstate, p, need_grad, need_last=False, shift=False,
                                         save_voltage=True)
        ctx.p, ctx.alpha = p, alpha
        ctx.save_for_backward(voltage if need_grad else None)
        return spike.view(z.shape)

    @staticmethod
    def backward(ctx, grad_spike):
        (voltage,) = ctx.saved_tensors
        p, alpha = ctx.p, ctx.alpha
        T = grad_spike.shape[-1]
        gz = ext.cuba_reset_bwd(voltage, grad_spike.contiguous().view(-1, T), p["spike_th"],
                                math.pi / 2 * alpha, alpha / 2, p["dv"], p["dc"])
        return gz.view(grad_spike.shape), None, None, None, None, None


class _Shift1(torch.autograd.Function):
    """One-step delay (``axon.delay(x, 1)``): out[..., t] = x[..., t-1], out[..., 0] = 0.
    Pure data movement, so identical to SLAYER's zeros + strided copy."""

    @staticmethod
    def forward(ctx, x):
        if x.dtype != torch.float32 or x.shape[-1] < 1:
            return F.pad(x[..., :-1], (1, 0))
        T = x.shape[-1]
        return ext.shift1(x.detach().contiguous().view(-1, T), True).view(x.shape)

    @staticmethod
    def backward(ctx, g):
        if g.dtype != torch.float32 or g.shape[-1] < 1:
            return F.pad(g[..., 1:], (0, 1))
        T = g.shape[-1]
        return ext.shift1(g.contiguous().view(-1, T), False).view(g.shape)


# Synapse forward for fan-in >= 64: the 8-bit integer kernel (VNNI on AVX-512; its AVX2
# twin was measured 1.5x (digits 16->32) to 3x (S-VGG9 64->64) faster than oneDNN), or the
# spike-driven one below Co * KH * KW / 28800 active inputs (measured break-even
# against the 8-bit kernel, 3x3 kernels at batch 4: ~2 % at 64 output channels, ~5 %
# at 128, ~8 % at 256), and without VNNI at up to 15 % (against F.conv3d: ~20-30 %).
_SPARSE_MIN_FANIN = 64
_SPARSE_MAX_DENSITY = 0.15
_SPIKE_VS_VNNI = 28800  # break-even active fraction = Co * KH * KW / this
# "fast" gradients: spike-driven weight gradient for 3x3 and 5x5 stride-1 convolutions
# with fan-in >= 64 (smaller ones take the time-lane kernel) and <= 35 % active inputs;
# measured against oneDNN's weight gradient (1 thread): digits 16->32 at 4x4 0.31 vs
# 0.58 ms at 10 %, 0.42 vs 0.68 at 20 %, 0.49 vs 0.57 at 31 %, 0.60 vs 0.58 at 40 %;
# S-VGG9 64->64 at 32x32 30 vs 47 ms at 30 %.
_SPARSE_GRAD_MAX_DENSITY = 0.35
# "fast" gradients: the time-lane input gradient of a stride-1 KxK convolution skips
# the taps on the zero padding, which oneDNN multiplies: it pays on small images with
# few weights (its weight broadcasts must stay in cache). Measured (1 thread) against
# oneDNN: digits 16->32 at 4x4 (4608 weights) 0.63-0.71 vs 0.78-0.97 ms, 16->64 at
# 8x8 1.5 vs 1.8 ms; but 64->64 at 8x8 (36864 weights) 6.0 vs 5.0 ms, 256->256 57 vs
# 38 ms, and 64->64 at 32x32 54 vs 45 ms.
_TLANE_INPUT_GRAD_MAX_PIXELS = 64
_TLANE_INPUT_GRAD_MAX_WEIGHTS = 16384
# "fast" gradients: the time-lane weight gradient also serves dense layers with few
# outputs (classifier heads), where oneDNN's 16-wide blocking is mostly empty: digits
# 512->10 0.11 vs 0.17 ms; S-VGG9's 4096->1024 stays with oneDNN (7 vs 10+ ms).
_TLANE_WGRAD_MAX_DENSE_OUT = 16
# With 8 vector registers (AVX2) instead of 32 two of these kernels lose to oneDNN
# (benchmarks at 1 thread, x86-64-v3 on an AMD EPYC): the digits 16->32 4x4 input gradient
# 1.15 vs 0.89 ms and the 512->10 head's weight gradient 0.46 vs 0.24 ms; the others
# still win there (first-layer weight gradient 0.46 vs 0.84 ms, spike weight gradient
# 0.59-0.91 vs 2.1-2.2 ms, 1x1 input gradient 0.10 vs 0.24 ms, inline exp 0.70 vs 0.84).
_WIDE_REGS = 32


def _wide() -> bool:
    """True where the extension keeps 32 vectors in registers (AVX-512)."""
    return ext.regs() >= _WIDE_REGS


class _SpikeConv(torch.autograd.Function):
    """``F.conv3d`` synapse with kernels for small fan-ins and sparse inputs.

    Forward: ``tlane_conv_fwd`` (fan-in < 64) or ``spike_conv_fwd`` (sparse input)
    when the input is all 0/1 and the weights pass the exactness check in the C++
    source (then every output is the exact sum, as F.conv3d's is), else ``F.conv3d``
    itself. Backward: the very call autograd makes for ``F.conv3d``
    (``aten.convolution_backward`` with the same tensors and arguments), so input and
    weight gradients are SLAYER's bit for bit; with fast gradients the weight gradient
    may come from ``tlane_weight_grad`` or ``spike_weight_grad`` and a 1x1 synapse's
    input gradient from ``tlane_input_grad_1x1`` instead."""

    @staticmethod
    def forward(ctx, x, w, stride, padding):
        w4 = w.detach().reshape(w.shape[:4]).contiguous()
        if w[0].numel() < _SPARSE_MIN_FANIN:  # small fan-in: dense work with time as the lane
            z = ext.tlane_conv_fwd(x.detach(), w4, stride[0], stride[1], padding[0], padding[1])
        else:  # 8-bit integer products, unless the input is sparse enough for the spike-driven
            # kernel (or the weights are beyond int8, or there is no VNNI)
            sparse = min(_SPARSE_MAX_DENSITY, w.shape[0] * w.shape[2] * w.shape[3] / _SPIKE_VS_VNNI)
            z = ext.vnni_conv_fwd(x.detach(), w4, stride[0], stride[1], padding[0], padding[1], sparse)
            if z is None:
                z = ext.spike_conv_fwd(x.detach(), w4, stride[0], stride[1], padding[0], padding[1],
                                        _SPARSE_MAX_DENSITY)
        if z is None:  # not provably exact: the stock call
            z = F.conv3d(x, w, None, stride, padding)
        ctx.save_for_backward(x, w)
        ctx.conf = (list(stride), list(padding))
        return z

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        stride, padding = ctx.conf
        need_x, need_w = ctx.needs_input_grad[:2]
        gx = gw = None
        if mode == "fast":
            g = g.contiguous()
            kh, kw = w.shape[2], w.shape[3]
            wide = _wide()
            dense_head = kh * kw == 1 and w.shape[0] < _TLANE_WGRAD_MAX_DENSE_OUT and wide
            if need_w and (w[0].numel() < _SPARSE_MIN_FANIN or dense_head):  # time as the lane
                gw = ext.tlane_weight_grad(x, g, kh, kw, stride[0], stride[1], padding[0], padding[1])
            elif need_w and kh * kw > 1:
                # spike-driven weight gradient (None: not 0/1, too dense, or not 3x3/5x5 stride 1)
                gw = ext.spike_weight_grad(x, g, kh, kw, stride[0], stride[1], padding[0], padding[1],
                                            _SPARSE_GRAD_MAX_DENSITY)
            if gw is not None:
                gw, need_w = gw.view(w.shape), False
            if need_x and tuple(stride[:2]) == (1, 1):
                if kh * kw == 1 and tuple(padding[:2]) == (0, 0):
                    gx = ext.tlane_input_grad_1x1(g, w.detach().reshape(w.shape[:2]).contiguous())
                elif (wide and x.shape[2] * x.shape[3] <= _TLANE_INPUT_GRAD_MAX_PIXELS
                      and w.numel() <= _TLANE_INPUT_GRAD_MAX_WEIGHTS):
                    gx = ext.tlane_input_grad(g, w.detach().reshape(w.shape[:4]).contiguous(), padding[0], padding[1])
                need_x = gx is None
        if need_x or need_w:  # what is left comes from oneDNN
            gx_dnn, gw_dnn, _ = torch.ops.aten.convolution_backward(
                g, x, w, None, stride, padding, [1, 1, 1], False, [0, 0, 0], 1, [need_x, need_w, False])
            gx = gx_dnn if need_x else gx
            gw = gw_dnn if need_w else gw
        return gx, gw, None, None


class _QuantizeHook(torch.autograd.Function):
    """SLAYER's ``utils.quantize_hook_fx``: ``quantize(w, step).clamp(lo, hi)``, times
    ``scale`` when descaling, in one pass each way instead of four elementwise ops and
    their temporaries (a dense layer's millions of weights, every forward). Same
    float32 operations lane by lane (see quantize.h), so bit-identical; the backward
    passes the gradient where the clamp did, as ClampBackward does."""

    @staticmethod
    def forward(ctx, w, step, lo, hi, scale):
        out, keep = ext.quantize_fwd(w.detach().contiguous(), step, lo, hi, scale)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, g):
        (keep,) = ctx.saved_tensors
        return ext.quantize_bwd(g.contiguous(), keep, ctx.scale), None, None, None, None


class _PoolFn(torch.autograd.Function):
    """SLAYER's pooling synapse: ``F.conv3d`` over [N, 1, C*H, W, T] with kernel
    (kh, kw, 1) == stride and no padding, so windows do not overlap.

    Forward: ``pool_fwd`` (exact for 0/1 inputs, see the C++ notes), else the stock
    ``F.conv3d`` call. Backward: every input element receives exactly one term of
    the convolution's input gradient, ``grad_out * w[i, j]``; ``pool_bwd`` computes
    that single float32 product (CPU ``convolution_backward`` for this one-channel
    case costs more than the rest of the digits network)."""

    @staticmethod
    def forward(ctx, x, w, stride):
        w2 = w.detach().reshape(w.shape[2], w.shape[3]).contiguous()
        z = ext.pool_fwd(x.detach().contiguous(), w2)
        if z is None:
            z = F.conv3d(x, w, None, stride, 0, 1)
        ctx.save_for_backward(w2)
        ctx.in_hw = (x.shape[2], x.shape[3])
        return z

    @staticmethod
    def backward(ctx, g):
        (w2,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return ext.pool_bwd(g.contiguous(), w2, *ctx.in_hw), None, None
