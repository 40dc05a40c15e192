"""``hifi_cnn``: SFedHIFI's 4-layer CNN for Fashion-MNIST (Tao et al. 2025, "Model
Selection"): 64C3 – 128C3 – P2 – 128C3 – P2 – FC, with the two 128-channel layers as
factorized convolutions (:mod:`neurofed.models.factorized`).

As in the authors' ``spiking_cnn_flanc.py``: the 64-channel head is a plain
convolution kept at full width for every p (it is what turns the input into
spikes), the two factorized layers have 128·p output channels, and their banks are
sized from the width-1 channels (so every width has the same B). The bank sizes
come from the model config (``model.bank_fraction``, ``model.group_fraction``).

``hifi_cnn_small`` halves the channels; ``hifi_cnn_digits`` is the digits ``cnn`` with
two factorized layers (what the digits benchmark trains, see its registration).

Kept free of SLAYER imports: it only registers the topology (config validation
lists the zoo); the block is built from ``Layer.options["block"]``.
"""

from __future__ import annotations

from functools import partial

from neurofed.models.spec import Layer, register_topology, scaled

# Defaults of the factorized layers' options; model.bank_fraction / model.group_fraction override them.
BANK_FRACTION = 0.25  # bank filters per width-1 output channel (authors: --n_basis 0.25)
GROUP_FRACTION = 0.125  # output channels per group per width-1 output channel (authors: --basis_fraction 0.125)


def factorized(out: int, full_in: int, full_out: int, kernel: int = 3) -> Layer:
    """A factorized k×k conv layer (same padding) with ``out`` channels at this width."""
    return Layer("conv", out, kernel=kernel, padding=kernel // 2,
                 options={"block": "factorized_conv", "full_in": full_in, "full_out": full_out,
                          "bank_fraction": BANK_FRACTION, "group_fraction": GROUP_FRACTION})


def _hifi(p: float, k: int, c1: int, c2: int) -> list[Layer]:
    pool = Layer("pool", kernel=2, stride=2)
    return [Layer("conv", c1, kernel=3, padding=1), factorized(scaled(c2, p), c1, c2), pool,
            factorized(scaled(c2, p), c2, c2), pool, Layer("flatten"), Layer("dense", k)]


def _hifi_digits(p: float, k: int) -> list[Layer]:
    """The digits ``cnn`` (16C3-P2-32C3-FC64-FC) with its 32-channel conv as two factorized
    layers: 16C3 - P2 - 32C3 - 32C3 - FC64 - FC; the head at full width, the rest at p."""
    return [Layer("conv", 16, kernel=3, padding=1), Layer("pool", kernel=2, stride=2),
            factorized(scaled(32, p), 16, 32), factorized(scaled(32, p), 32, 32), Layer("flatten"),
            Layer("dense", scaled(64, p)), Layer("dense", k)]


register_topology("hifi_cnn", partial(_hifi, c1=64, c2=128))
# Half the channels (32C3 - 64C3 - P2 - 64C3 - P2 - FC), same factorization (4x fewer
# synaptic operations).
register_topology("hifi_cnn_small", partial(_hifi, c1=32, c2=64))
# The digits cnn with two factorized layers: what the digits benchmark trains, because under
# Dirichlet splits of 8x8 digits hifi_cnn_small ends with silent outputs, with one width and
# plain convolutions too (benchmarks/results/sfedhifi/README.md).
register_topology("hifi_cnn_digits", _hifi_digits)
