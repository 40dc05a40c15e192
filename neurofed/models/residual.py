"""Residual basic block (He et al. 2016) of SLAYER CUBA parts, as SFedHIFI's Spiking-ResNet18
(Tao et al. 2025, "Model Selection"; the authors' ``spiking_resnet_flanc.py``).

A basic block is two layers of the model's layer list:

- the **open** layer (``options["residual"] == "open"``): a CUBA ``Conv`` block, 3×3 with the
  block's stride; the model keeps its input ``x`` as the shortcut;
- the **close** layer (``options["residual"] == "close"``): :class:`ResidualJoin`, whose
  synaptic current is ``conv3x3(h) + shortcut(x)`` before one CUBA neuron, the shortcut being
  the identity or, where the stride or channels change, a 1×1 convolution with the stride.

As the authors' block (``out = bn2(conv2(sn1(bn1(conv1(x))))) + downsample(x); sn2(out)``),
the sum is taken on currents, before the second neuron; with ``model.norm: batch``
(:mod:`neurofed.models.norm`) the 3×3 synapse's current and the 1×1 shortcut's are each
batch-normed before the sum, as theirs (an identity shortcut adds its spikes as they are).
Every SLAYER block delays its spikes by one step, so the shortcut is delayed by one step
too, to meet the conv path in time (with ``model.delay_shift: false`` neither is).

Netx loads feed-forward chains only (:attr:`ResidualJoin.export_refusal`): ``neurofed lava``
wires the Lava process graph from the model instead (:mod:`neurofed.deploy.lava_graph`). The energy module counts the 3×3 synapse as any conv layer and
the shortcut from the spikes that enter it (``neurofed.models.opcounts``).

Kept free of :mod:`neurofed.models.snn` (which imports this module): SLAYER comes from
:mod:`neurofed.compat`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from neurofed.compat import slayer as _slayer
from neurofed.models.factorized import NO_WEIGHT_NORM, FactorizedConvSynapse, bank_geometry
from neurofed.models.norm import ChannelBatchNorm
from neurofed.models.spec import Layer

slayer = _slayer()

EXPORT_REFUSAL = ("residual connection: netx (lava-dl 0.6) loads feed-forward chains of Conv/Pool/Flatten/"
                  "Dense blocks only; this model trains and is energy-counted, but cannot be exported")


def shortcut_projection(layer: Layer) -> tuple[int, int, int, int] | None:
    """A close layer's shortcut as a 1×1 convolution's (in, out, kernel 1, stride), where the
    block changes the stride or the channels; None where the shortcut is the identity."""
    skip_c, stride = layer.options["skip_channels"], layer.options.get("skip_stride", 1)
    return (skip_c, layer.out, 1, stride) if stride != 1 or skip_c != layer.out else None


class ResidualJoin(nn.Module):
    """The close layer of a basic block: 3×3 synapse on ``h`` + shortcut of ``skip``,
    one CUBA neuron, the blocks' one-step delay. ``forward(h, skip)``."""

    export_refusal = EXPORT_REFUSAL

    def __init__(self, neuron_params: dict, layer: Layer, syn: dict, norm: str = "none"):
        super().__init__()
        o = layer.options
        self.delay_shift = syn.get("delay_shift", True)
        syn = {k: syn[k] for k in ("weight_scale", "weight_norm", "pre_hook_fx")}
        in_c, out = layer.in_shape[0], layer.out
        pad = layer.kernel // 2
        if o.get("block") == "factorized_conv":
            m, n = bank_geometry(o["full_out"], o["bank_fraction"], o["group_fraction"])  # Eq. 4: (a2, a1)
            if syn["weight_norm"]:
                raise ValueError(NO_WEIGHT_NORM)
            self.synapse = FactorizedConvSynapse(in_c, out, layer.kernel, m, n, padding=pad,
                                                 weight_scale=syn["weight_scale"], pre_hook_fx=syn["pre_hook_fx"])
        else:
            self.synapse = slayer.synapse.Conv(in_c, out, layer.kernel, padding=pad, **syn)
        projection = shortcut_projection(layer)
        self.shortcut = slayer.synapse.Conv(*projection, **syn) if projection else None
        self.neuron = slayer.neuron.cuba.Neuron(**neuron_params)
        if norm == "bntt":
            raise ValueError("model.norm: bntt: not offered for residual joins; allowed there: none, batch")
        normed = norm == "batch"
        self.norm = ChannelBatchNorm(out) if normed else nn.Identity()
        self.shortcut_norm = ChannelBatchNorm(out) if normed and self.shortcut is not None else nn.Identity()

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        if self.delay_shift:
            skip = F.pad(skip[..., :-1], (1, 0))  # one step later: the conv path went through one block
        shortcut = skip if self.shortcut is None else self.shortcut_norm(self.shortcut(skip))
        z = self.norm(self.synapse(h)) + shortcut
        out = self.neuron(z)
        return slayer.block.base.step_delay(self, out) if self.delay_shift else out


class AnnResidualJoin(nn.Module):
    """The ANN twin's close layer (``model.kind: ann``): ``norm(conv3x3(h)) + shortcut(skip)``,
    the shortcut the identity or a (normed) 1×1 convolution with the stride, as
    :class:`ResidualJoin` without the neuron and its delay; the twin applies its ReLU after the
    sum, as torchvision's and the SFedHIFI authors' basic block (``relu(bn2(conv2(·)) + downsample(x))``)."""

    def __init__(self, layer: Layer, normed: bool):
        super().__init__()
        in_c, out = layer.in_shape[0], layer.out
        self.conv = nn.Conv2d(in_c, out, layer.kernel, layer.stride, layer.padding)
        projection = shortcut_projection(layer)
        self.shortcut = nn.Conv2d(*projection) if projection else None
        self.norm = ChannelBatchNorm(out) if normed else nn.Identity()
        self.shortcut_norm = ChannelBatchNorm(out) if normed and self.shortcut is not None else nn.Identity()

    def forward(self, h: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        shortcut = skip if self.shortcut is None else self.shortcut_norm(self.shortcut(skip))
        return self.norm(self.conv(h)) + shortcut


def residual_join_block(layer: Layer, params: dict, syn: dict, norm: str = "none") -> ResidualJoin:
    """The SNN builder's entry for a layer with ``options["residual"] == "close"`` (its 3×3
    synapse factorized when ``options["block"] == "factorized_conv"``; ``norm`` is
    ``model.norm``)."""
    return ResidualJoin(params, layer, syn, norm)
