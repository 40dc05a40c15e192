"""``model.neuron_gradient: spikingjelly``: SLAYER's CUBA neuron with the backward pass of
SpikingJelly's spiking node, the framework SFedCA trains in (Zhan et al. 2024, Sec. 3.2, ref. [2]).

The forward pass is SLAYER's, untouched: the same fixed-point dynamics, the same spikes (so
netx export and the Lava run do not change). Only the gradient differs, in two ways:

- **The surrogate** is SFedCA's Eq. 10, the arctan's derivative
  ``dS/dh = (α/2) / (1 + (π/2 · α · (h − θ))²)`` with α = ``model.atan_alpha`` (the paper's 2.0),
  in place of SLAYER's exponential (``tau_grad``, ``scale_grad``).
- **The reset is differentiated.** SLAYER's voltage backward (lava-dl ``leaky_integrator``)
  passes the gradient back through time as if the voltage were never reset, so with no leak a
  spike at step t collects the error of every later step. SpikingJelly's node (hard reset,
  ``detach_reset=False``, its default) differentiates ``v_t = h_t (1 − S(h_t))``: the memory of
  the steps before a spike is cut where it fires, and the reset adds ``−h_t · S'(h_t)``.

With h_t the voltage before reset (SLAYER's ``voltage``), s_t the spike, d = voltage decay and
g_t = dL/ds_t, backwards from the last step with c_T = 0:

    dL/dh_t = g_t · S'(h_t) + c_t · ((1 − s_t) − h_t · S'(h_t)),    c_{t−1} = (1 − d) · dL/dh_t

and dL/dh_t is the gradient of the neuron's current at step t (SLAYER's current dynamics
pass it on to the synapse). Why and what it gained on the SFedCA MNIST net (its
ANN twin's speed of fitting; 98.6 % on MNIST after 2 epochs where SLAYER's gave 97.6): docs/fidelity.md.
Pools keep SLAYER's gradient (their neurons implement a max or average pool, which
SpikingJelly does without a neuron).

This module is the torch form. With the fast kernels on (``federation.fast_kernels``) the
neuron runs as SLAYER's does, one fused C++ kernel each way (patch point ``reset_gradient``
of :data:`neurofed.kernels.PATCHES`), with the same bits; its operations are this form's.
"""

from __future__ import annotations

import math

import torch

from neurofed.compat import slayer as _slayer

slayer = _slayer()

NEURON_GRADIENTS = ("slayer", "spikingjelly")


class _ThroughReset(torch.autograd.Function):
    """Returns the given spikes; its backward maps dL/dspikes to dL/dcurrent (module docstring)."""

    @staticmethod
    def forward(ctx, current, voltage, spikes, threshold, keep, alpha):
        ctx.save_for_backward(voltage, spikes)
        ctx.threshold, ctx.keep, ctx.alpha = threshold, keep, alpha
        return spikes.clone()

    @staticmethod
    def backward(ctx, grad_spikes):
        voltage, spikes = ctx.saved_tensors
        alpha = ctx.alpha
        surrogate = (alpha / 2) / (1 + (math.pi / 2 * alpha * (voltage - ctx.threshold)) ** 2)
        # dL/dh_t = direct_t + through_t · dL/dh_{t+1}: the constant parts for every step at once,
        # then a multiply and an add a step (not addcmul, which fuses them where the CPU has FMA:
        # rounded twice, the result is the same on every machine and equals the fused kernel's),
        # time first so that each step is contiguous
        direct = (grad_spikes * surrogate).movedim(-1, 0).contiguous()
        through = (ctx.keep * ((1 - spikes) - voltage * surrogate)).movedim(-1, 0).contiguous()
        grad = torch.empty_like(direct)
        grad[-1] = direct[-1]
        for t in range(direct.shape[0] - 2, -1, -1):
            torch.mul(through[t], grad[t + 1], out=grad[t])
            grad[t] += direct[t]
        return grad.movedim(0, -1), None, None, None, None, None


class ResetGradientNeuron(slayer.neuron.cuba.Neuron):
    """A CUBA neuron whose backward is SpikingJelly's (module docstring); set on a built block
    with :func:`use_reset_gradient`."""

    atan_alpha = 2.0
    exports_as_base = True  # the forward is SLAYER's: netx and NIR write it as a plain CUBA neuron

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.graded_spike or self.persistent_state:
            raise ValueError("model.neuron_gradient: spikingjelly supports binary spikes without persistent state")
        current, voltage = self.dynamics(input)
        with torch.no_grad():
            spikes = self.spike(voltage)
        threshold = float(self.threshold + self.threshold_eps)
        # (1 − d) with d quantized as the forward uses it, in float32 as SLAYER's voltage adjoint
        keep = (1 - slayer.utils.quantize(self.voltage_decay.detach()).flatten()[0] / self.p_scale).item()
        return _ThroughReset.apply(current, voltage.detach(), spikes, threshold, keep, float(self.atan_alpha))


def use_reset_gradient(block: torch.nn.Module, alpha: float) -> None:
    """Give ``block``'s CUBA neuron SpikingJelly's backward with the arctan surrogate of ``alpha``."""
    neuron = block.neuron
    if type(neuron) is not slayer.neuron.cuba.Neuron:
        raise TypeError(f"model.neuron_gradient: spikingjelly needs a CUBA neuron, not {type(neuron).__name__}")
    neuron.__class__ = ResetGradientNeuron  # same state and parameters; only forward's graph differs
    neuron.atan_alpha = float(alpha)
