"""The fused CUBA neuron on CUDA in Triton: forward over all T in one launch, and backward.

Same computation as the CPU's fused kernel (``neurofed/kernels/csrc/neuron.h``,
``cuba_fwd`` / ``cuba_bwd``), which is SLAYER's ``cuba.Neuron.dynamics`` + ``Spike``
(bit-identical, tested there), per neuron, with the same IEEE float32 / int64 operations
in the same order:

forward (per time step t; ``ws`` = w_scale, integers in int64)::

    c_int = rshift_to_zero12(c_int * cdecay_int) + trunc(ws * z[t])
    c     = float(c_int) / ws
    v_int = rshift_to_zero12(v_int * vdecay_int) + trunc(ws * c)
    v     = float(v_int) / ws;  v_int = 0 where float(v_int) >= reset_th   (reset)
    spike[t + shift] = v >= spike_th;   earg[t] = -|v - spike_th| / tau

backward (Spike's surrogate, then the two leaky integrators' adjoints)::

    gs[t] = (A * exp(earg[t])) * grad_spike[t + shift]
    gv[t] = dv * gv[t + 1] + gs[t];   gz[t] = gc[t] = dc * gc[t + 1] + gv[t]

Kernels are launched with ``enable_fp_fusion=False`` so that no multiply-add is
contracted into an FMA (the CPU rounds each). ``exp`` is ``torch.exp`` on the device,
as in stock SLAYER's CUDA path (CUDA's ``expf`` may differ from the CPU's by an ulp:
gradients then differ by that rounding; spikes and voltages do not depend on it).

The kernels are in :mod:`neurofed.gpu._triton_kernels`. ``TRITON_INTERPRET=1`` (set
before Triton is imported) runs them on the CPU (numpy), which is how the tests compare
them bit for bit with the CPU kernel, forward and backward.
"""

import importlib.util

import torch


BLOCK = 128  # neurons per program


_setting = False  # federation.gpu_kernels, set by neurofed.device.configure_cuda


def available() -> bool:
    """True if Triton is installed (every CUDA build of torch ships it). Triton is imported
    only when a kernel is first launched: ``TRITON_INTERPRET`` takes effect at that import."""
    return importlib.util.find_spec("triton") is not None


def _kernels():
    from neurofed.gpu import _triton_kernels

    return _triton_kernels.cuba_fwd, _triton_kernels.cuba_bwd


def configure(value) -> None:
    """``federation.gpu_kernels``: ``true`` the fused kernel for every eligible CUBA neuron on
    CUDA, ``auto`` the same where Triton imports, ``false`` stock SLAYER on CUDA."""
    global _setting
    _setting = value


def enabled() -> bool:
    return _setting is True or (_setting == "auto" and available())


def _launch(kernel, R, *args, **const):
    grid = (triton_cdiv(R, BLOCK),)
    kernel[grid](*args, BLOCK=BLOCK, enable_fp_fusion=False, **const)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


class FusedCuba(torch.autograd.Function):
    """``ops._FusedCuba`` for CUDA tensors (same arguments and results: spikes and, for
    persistent state, the last current and last pre-reset voltage)."""

    @staticmethod
    def forward(ctx, z, cstate, vstate, p, need_last, need_grad, shift):
        fwd, _ = _kernels()
        shape, T = z.shape, z.shape[-1]
        x = z.detach().contiguous().view(-1, T)
        R = x.shape[0]
        spike = torch.empty_like(x)
        earg = torch.empty_like(x) if need_grad else spike  # (not written without EARG)
        clast = torch.empty(R, dtype=x.dtype, device=x.device) if need_last else spike
        vlast = torch.empty(R, dtype=x.dtype, device=x.device) if need_last else spike
        ws = p["w_scale"]
        pow2 = ws > 0 and float(ws).is_integer() and (int(ws) & (int(ws) - 1)) == 0
        _launch(fwd, R, x, cstate.detach().contiguous().view(-1), vstate.detach().contiguous().view(-1),
                spike, earg, clast, vlast, R, T, p["cdecay_int"], p["vdecay_int"], float(ws),
                (1.0 / ws) if pow2 else 1.0, p["reset_th"], p["spike_th"], p["tau"],
                POW2=pow2, RESET=bool(p["reset"]), SHIFT=bool(shift), EARG=bool(need_grad), LAST=bool(need_last))
        ctx.p, ctx.shift = p, bool(shift)
        ctx.save_for_backward(earg if need_grad else None)
        spike = spike.view(shape)
        if need_last:
            ctx.mark_non_differentiable(clast, vlast)
            return spike, clast.view(shape[:-1]), vlast.view(shape[:-1])
        return spike, None, None

    @staticmethod
    def backward(ctx, grad_spike, _gc=None, _gv=None):
        _, bwd = _kernels()
        (earg,) = ctx.saved_tensors
        p, T = ctx.p, grad_spike.shape[-1]
        g = grad_spike.contiguous().view(-1, T)
        out = torch.empty_like(g)
        _launch(bwd, g.shape[0], torch.exp(earg), g, out, g.shape[0], T, p["A"], p["dv"], p["dc"],
                SHIFT=1 if ctx.shift else 0)
        return out.view(grad_spike.shape), None, None, None, None, None, None
