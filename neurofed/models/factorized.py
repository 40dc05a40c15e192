"""Factorized spiking convolution: SFedHIFI's channel-wise matrix decomposition
(Tao et al. 2025, Eq. 4; sources: docs/papers.md), as a SLAYER block.

A k×k convolution from D = C_in to C = C_out channels is W^p ≈ B · M^p with a filter bank
B whose shape is the same at every width and a width-specific factor M^p; as Eq. 4
prints it, B groups *output* channels:

    B ∈ R^{a2 × a1 × k × k}            (Eq. 4's k² × a1 × a2, axes ordered bank-first;
                                         a2 = round(bank_fraction · C at width 1),
                                         a1 = round(group_fraction · C at width 1))
    M^p ∈ R^{a2 × G^p × D^p}           (Eq. 4's a2 × C^p/a1 × D^p; G^p = ceil(C^p / a1))
    W^p[g·a1 + j, d] = Σ_b M^p[b, g, d] · B[b, j]

i.e. each block of a1 output channels' k×k filters on input channel d is a mix of the
a2 bank elements (each a1 filters); when C^p is not a multiple of a1 the last group is
cut short. The 3-mode M^p is what HIFI Tucker-decomposes (Eq. 10–12). The fractions
0.25 and 0.125 are those of the SFedHIFI authors' 4-layer CNN (``--n_basis 0.25
--basis_fraction 0.125``).

The authors' code groups *input* channels instead (M^p ∈ R^{C^p × D^p/n × m}, a 1×1
convolution over the bank's responses). That layout was neurofed's until it was measured
against Eq. 4's on digits (``hifi_cnn_digits``, SFedHIFI, 20 rounds, seed 0): final mean
accuracy over the widths 74.2 % (Eq. 4) vs 75.1 % (input) under IID, 44.1 % vs 37.0 %
under Dir(0.3) — not better, so it is not kept as an option.

The forward pass uses the fused kernel W = B·M through the synapse's 8-bit
quantization hook, so the block is a plain SLAYER CUBA ``Conv`` as far as netx,
Lava, the constraint check and the energy count are concerned: ``export_hdf5``
(SLAYER's own) writes a standard ``conv`` entry with the fused, quantized kernel.

Difference from the authors' code: it puts a spiking neuron between the bank
convolution and the 1×1 mixing convolution; Eq. 4 (and a hardware export as one
convolution) needs the product to be linear, so here it is.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from neurofed.compat import slayer as _slayer
from neurofed.models.spec import Layer

slayer = _slayer()  # from compat, not from the model builder: snn imports this module, never the reverse

BANK = "bank"  # parameter names: ``...synapse.bank`` is shared by all widths, ``...synapse.mix`` is not
MIX = "mix"
NO_WEIGHT_NORM = ("model.weight_norm: the factorized convolution has no single weight to normalize; "
                  "set model.weight_norm: false")


def bank_geometry(full_out: int, bank_fraction: float, group_fraction: float) -> tuple[int, int]:
    """(a2 bank elements, a1 output channels per group) of a layer with ``full_out``
    output channels at width 1."""
    return max(1, round(bank_fraction * full_out)), max(1, round(group_fraction * full_out))


def fuse(bank: torch.Tensor, mix: torch.Tensor, out_channels: int) -> torch.Tensor:
    """Eq. 4: the (C_out, C_in, k, k) kernel of ``bank`` (a2, a1, k, k) mixed by ``mix``
    (a2, G, C_in): W[g·a1 + j, d] = Σ_b M[b, g, d] · B[b, j]."""
    _, groups, d = mix.shape
    _, a1, kh, kw = bank.shape
    w = torch.einsum("bgd,bjhw->gjdhw", mix, bank).reshape(groups * a1, d, kh, kw)
    return w[:out_channels]


ORTH_NORMS = ("l2", "mse")


def orthogonality(bank: torch.Tensor, norm: str = "l2") -> torch.Tensor:
    """‖B Bᵀ − I‖ of Eq. 13 for one bank, B flattened to (m, n·k²); 0 iff B's filters are
    orthonormal. ``norm`` (``algorithm.orth_norm``): ``l2``, Eq. 13's printed ‖·‖_2 taken
    entry-wise, sqrt(Σ (BBᵀ − I)²) (the Frobenius norm; "L_2 normalization" in the text);
    ``mse``, the mean squared entry, Σ (BBᵀ − I)² / m², the authors' ``orth_loss``
    (``nn.MSELoss``), whose λ values (0.1, 10) were tuned for that form. Near orthonormal
    banks the two differ in kind: the squared form's gradient vanishes with the
    deviation, the norm's does not."""
    b = bank.reshape(bank.shape[0], -1)
    sq = (b @ b.T - torch.eye(b.shape[0], dtype=b.dtype, device=b.device)) ** 2
    if norm == "mse":
        return sq.mean()
    if norm == "l2":
        return sq.sum().clamp_min(1e-24).sqrt()  # floored: the norm's gradient at exactly 0 is undefined
    raise ValueError(f"orthogonality: norm {norm!r}; allowed: {', '.join(ORTH_NORMS)}")


class FactorizedConvSynapse(slayer.synapse.layer.GenericLayer):
    """A SLAYER convolution synapse whose kernel is ``fuse(bank, mix)``.

    It has the attributes SLAYER's conv synapse has (``in_channels``, ``kernel_size``,
    ``stride``, ... as 3-tuples with a trailing time axis; ``weight`` (C_out, C_in, k, k, 1);
    ``pre_hook_fx``), so SLAYER's ``AbstractConv.export_hdf5`` and neurofed's
    constraint check and op counts read it as a standard convolution. ``bank`` and
    ``mix`` are the trainable parameters; ``weight`` is computed from them.
    """

    def __init__(self, in_features: int, out_features: int, kernel_size: int, bank_filters: int, group_size: int,
                 stride: int = 1, padding: int = 0, weight_scale: float = 1, pre_hook_fx=None):
        super().__init__()
        self.in_channels, self.out_channels = int(in_features), int(out_features)
        self.kernel_size = (kernel_size, kernel_size, 1)
        self.stride = (stride, stride, 1)
        self.padding = (padding, padding, 0)
        self.dilation = (1, 1, 1)
        self.groups = 1  # of the fused convolution; the bank's input groups live in ``mix``
        self.bias = None
        self._pre_hook_fx = pre_hook_fx
        groups = math.ceil(self.out_channels / group_size)
        self.bank = nn.Parameter(torch.empty(bank_filters, group_size, kernel_size, kernel_size))
        self.mix = nn.Parameter(torch.empty(bank_filters, groups, self.in_channels))
        # B's rows orthonormal (entries' variance 1/(a1 k²)): var(W) = a2 var(M) / (a1 k²)
        # = 1/(3 D k²), SLAYER's default conv init U(±1/sqrt(D k²)), for |M| <= sqrt(a1 / (a2 D)).
        bound = math.sqrt(group_size / (bank_filters * self.in_channels))
        # Orthonormal bank filters (the authors' init, and the optimum of Eq. 13's term).
        nn.init.orthogonal_(self.bank.data.view(bank_filters, -1))
        nn.init.uniform_(self.mix, -bound, bound)
        if weight_scale != 1:
            self.mix.data.mul_(weight_scale)

    @property
    def weight(self) -> torch.Tensor:
        return fuse(self.bank, self.mix, self.out_channels).unsqueeze(-1)

    def enable_weight_norm(self):
        raise ValueError(NO_WEIGHT_NORM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if self._pre_hook_fx is not None:
            w = self._pre_hook_fx(w)
        return F.conv3d(x, w, None, self.stride, self.padding, self.dilation, 1)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel={self.kernel_size[0]}, "
                f"bank={tuple(self.bank.shape)}, mix={tuple(self.mix.shape)}")


class FactorizedConv(slayer.block.cuba.Conv):
    """SLAYER's CUBA ``Conv`` block with a :class:`FactorizedConvSynapse`: the same
    neuron, delay shift, forward and ``export_hdf5`` (a standard conv entry holding
    the fused kernel)."""

    exports_as_base = True  # neurofed.deploy.constraints: netx loads it as the cuba.Conv it exports

    def __init__(self, neuron_params: dict, in_features: int, out_features: int, kernel_size: int,
                 bank_filters: int, group_size: int, stride: int = 1, padding: int = 0,
                 weight_scale: float = 1, weight_norm: bool = False, pre_hook_fx=None,
                 delay_shift: bool = True):
        if weight_norm:
            raise ValueError(NO_WEIGHT_NORM)
        super().__init__(neuron_params, in_features, out_features, kernel_size, stride=stride, padding=padding,
                         pre_hook_fx=pre_hook_fx, delay_shift=delay_shift)
        self.synapse = FactorizedConvSynapse(in_features, out_features, kernel_size, bank_filters, group_size,
                                             stride=stride, padding=padding, weight_scale=weight_scale,
                                             pre_hook_fx=pre_hook_fx)


def factorized_conv_block(layer: Layer, params: dict, syn: dict) -> FactorizedConv:
    """The SNN builder's entry for ``Layer.options["block"] == "factorized_conv"``;
    options: ``full_in``/``full_out`` (the layer's channels at width 1),
    ``bank_fraction``, ``group_fraction``."""
    o = layer.options
    a2, a1 = bank_geometry(o["full_out"], o["bank_fraction"], o["group_fraction"])
    return FactorizedConv(params, layer.in_shape[0], layer.out, layer.kernel, a2, a1, stride=layer.stride,
                          padding=layer.padding, **syn)


def factorized_synapses(model: nn.Module) -> list[FactorizedConvSynapse]:
    return [m for m in model.modules() if isinstance(m, FactorizedConvSynapse)]


def orthogonality_penalty(model: nn.Module, norm: str = "l2") -> torch.Tensor:
    """Σ_L ‖B_L B_Lᵀ − I‖ over the model's filter banks (Eq. 13's regularizer, ``norm`` as
    :func:`orthogonality`); 0 without banks."""
    terms = [orthogonality(s.bank, norm) for s in factorized_synapses(model)]
    return torch.stack(terms).sum() if terms else torch.zeros(())
